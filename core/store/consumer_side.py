"""The consumer side of an open store, over the parts its open built."""

from __future__ import annotations

from typing import TYPE_CHECKING

from mqstore.append.appender import Appender
from mqstore.consumer.dead_letters import DeadLetters
from mqstore.consumer.service import ConsumerService
from mqstore.consumer.store_side import ConsumerStore

if TYPE_CHECKING:
    from mqstore.lifecycle.parts import StoreParts


def consumer_side(parts: "StoreParts") -> ConsumerService:
    """The store's ``ConsumerService``: built at the open, and again when the state files
    were replaced under it (``store.mirror_calls``). A change a client is told of waits for
    the state mirror as the store's role promises (``Replication.state_changed``)."""
    assert parts.reader is not None and parts.view is not None and parts.hooks is not None
    replication = parts.replication
    appender = parts.appender
    dead = (DeadLetters(appender=appender, put_ctx=appender.put_ctx, commit_log=parts.commit_log,
                        topics=parts.view.topics)
            if isinstance(appender, Appender) else None)
    return ConsumerService(ConsumerStore(
        parts.reader, clock=parts.clock, scheduler=parts.scheduler,
        config=parts.config.consumer, allocation=parts.hooks.allocation_strategies,
        compile_filter=parts.view.compile_filter, topic_config=parts.view.topics.get,
        state_changed=replication.state_changed if replication is not None
        else lambda: None, dead_letters=dead))

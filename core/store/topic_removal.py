"""Deleting a topic from an open store, as RocketMQ's broker deletes one (``deleteTopic``).

What goes: the topic's config (``config/topics.json``), its consume queues and their
extensions (``consumequeue/<topic>/``, ``consumequeue_ext/<topic>/``), every group's committed
offsets and pop state for it, its membership files and registered subscriptions. What stays:
its records in the commit log, until cleanup deletes their segments as it deletes any (and
with them the key index's entries, which name records, not queues): RocketMQ keeps them too.

So that nothing dispatched again brings the queues back (an abnormal recovery re-dispatching
old segments, ``mqstore check --fix``), the commit log's end is recorded first
(``storage.deleted_topics``): dispatch gives the topic's records below it no unit. Its queues'
offset floors go from the queue manifest next (NOTE [ Offset floors ]), so no open holds
their old offsets with fillers: a put to the same name later creates a new topic (auto-create)
whose queues start at offset 0, as on a broker.

Refused while live consumer instances of any group read the topic (they would go on from
what they hold in memory), and where the consume queues are written by another process
(``dispatch.worker: process``): ``mqstore topic delete`` opens a closed store with the loops
as threads of its own process.
"""

from __future__ import annotations

import logging
import os
import shutil
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from mqstore.append.appender import Appender
from mqstore.consumer import pop_state
from mqstore.consumer.membership import groups_on_topic, live_members, remove_group_files
from mqstore.errors import InUseError, TopicNotFoundError
from mqstore.format.names import check_stored_topic
from mqstore.format.topic_config import TopicConfig
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR
from mqstore.storage.cq_ext import CONSUME_QUEUE_EXT_DIR

if TYPE_CHECKING:
    from mqstore.consumer.service import ConsumerService
    from mqstore.lifecycle.parts import StoreParts

log = logging.getLogger(__name__)

DISPATCH_WAIT_S = 60.0


@dataclass
class TopicRemoval:
    """What deleting a topic removed."""

    topic: str
    config: TopicConfig | None  # None: it had no config (a store without topics.json)
    queues: list[int] = field(default_factory=list)  # queue ids whose consume queues went
    groups: list[str] = field(default_factory=list)  # groups whose offsets or pop state went
    records_below: int = 0  # its records below this commit-log offset stay until cleanup


def remove_topic(parts: StoreParts, consumers: ConsumerService, name: str) -> TopicRemoval:
    """Delete topic ``name`` from the open, writable store whose ``StoreParts`` are
    ``parts``; ``consumers``: its ``ConsumerService``."""
    check_stored_topic(name)
    view, appender = parts.view, parts.appender
    assert view is not None  # set by every open that returned
    if parts.runtime is None or not isinstance(appender, Appender):
        raise PermissionError(f"store {view.root!r} is open read-only")
    if parts.config.dispatch.worker != "thread":
        raise PermissionError(
            "deleting a topic needs its consume queues written in this process "
            "(dispatch.worker: thread); `mqstore topic delete` opens a closed store that way")
    topics = view.topics
    root = view.root
    _refuse_live_consumers(root, name)
    config = topics.get(name)
    groups = sorted({g for t, g in consumers.consumer_groups() if t == name}
                    | {g for t, g in pop_state.pop_groups(root) if t == name})
    parts.runtime.wait_dispatched(DISPATCH_WAIT_S)
    with appender.lock:  # no put to the topic while its queues go
        keys = sorted({k for k in view.consume_queues if k[0] == name}
                      | {k for k in appender.queue_offsets if k[0] == name})
        if config is None and not keys and not groups:
            raise TopicNotFoundError(f"topic {name!r} does not exist in {root!r}: no config, "
                                     f"no consume queue, no consumer group")
        below = appender.last_append[0]
        topics.record_deleted(name, below)  # first: a crash from here on brings nothing back
        # Then its floors (NOTE [ Offset floors ]): the queues start over, as on a broker.
        parts.runtime.manifest.forget(set(keys))
        for key in keys:
            appender.queue_offsets.pop(key, None)
            ext = view.consume_queue_exts.pop(key, None)
            if ext is not None:
                ext.close()
            cq = view.consume_queues.pop(key, None)
            if cq is not None:
                cq.destroy()
        for directory in (CONSUME_QUEUE_DIR, CONSUME_QUEUE_EXT_DIR):
            shutil.rmtree(os.path.join(root, directory, name), ignore_errors=True)
    for entry in list(view.subscriptions.for_topic(name)):
        view.subscriptions.unregister(entry["group"], name)
    for group in groups:
        consumers.delete_consumer_group(group, name)
    for group in groups_on_topic(root, name):
        remove_group_files(root, group, name)
    removed = topics.remove(name)
    log.info("deleted topic %s: %d queue(s), %d group(s); its records below %d stay in the "
             "commit log until cleanup", name, len(keys), len(groups), below)
    return TopicRemoval(name, removed if removed is not None else config,
                        sorted(q for _t, q in keys), groups, below)


def _refuse_live_consumers(root: str, name: str) -> None:
    for group in groups_on_topic(root, name):
        alive = live_members(root, group, name)
        if alive:
            raise InUseError(f"topic {name!r} is being consumed: group {group!r} has "
                             f"{len(alive)} live instance(s); stop them before deleting it")

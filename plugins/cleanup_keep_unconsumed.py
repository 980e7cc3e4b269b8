"""RocketMQ's cleanup rule, sparing what consumer groups still have to read
(``cleanup.policy: keep_unconsumed``; apache/rocketmq#4549).

Decides as ``rocketmq`` does, then bounds the pass: no segment holding a message that some
consumer group has not consumed goes (a group counts once it has an offset for the topic in
``config/consumerOffset.json``, or pops from it), until the disk passes
``cleanup.disk_forcibly_ratio``: then the disk wins, as with ``rocketmq``. The groups' progress
is read through the store (``READS_STORE``), on the store's clock and thread of decision.
"""

from __future__ import annotations

import logging

from mqstore.plugin_api import (
    READS_STORE, CleanupDecision, CorruptStateError, StoreClosedError, StoreReads, hookimpl,
)
from mqstore.plugins.cleanup_rocketmq import RocketMQCleanup

log = logging.getLogger(__name__)


class KeepUnconsumedCleanup(RocketMQCleanup):
    capabilities = frozenset({READS_STORE})

    def __init__(self, config) -> None:
        super().__init__(config)
        self._store: StoreReads | None = None
        self._last_reason: str | None = None

    def bind(self, store: StoreReads) -> None:
        self._store = store

    def decide(self, now_ms: int, disk_used: float) -> CleanupDecision:
        decision = super().decide(now_ms, disk_used)
        if not decision.delete or self._store is None or self.over_forcibly(disk_used):
            return decision
        try:
            floor, who = self._store.consumed_floor()
        except (ReferenceError, StoreClosedError):  # the store is going; its cleanup with it
            return decision
        except CorruptStateError as exc:
            # Whose progress is unknown cannot be spared selectively: spare everything.
            floor, who = 0, str(exc)
        if floor >= 0 and who != self._last_reason:
            log.info("cleanup keeps the commit log from offset %d: %s has not consumed it",
                     floor, who)
        self._last_reason = who
        return decision._replace(keep_from_phys=floor) if floor >= 0 else decision


@hookimpl(trylast=True)
def register_cleanup_policies(registry):
    registry.add("keep_unconsumed", KeepUnconsumedCleanup)

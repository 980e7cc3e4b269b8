"""Queue locks of orderly consumers (``RebalanceLockManager``): LOCK_BATCH_MQ and
UNLOCK_BATCH_MQ. A lock belongs to one client id of a group and lapses after
``LOCK_EXPIRY_S`` without renewal (orderly consumers renew every 20 s). Loop thread only."""

from __future__ import annotations

import time

LOCK_EXPIRY_S = 60.0  # rocketmq.broker.rebalance.lockMaxLiveTime
MAX_LOCKS = 1 << 20  # queues locked at once, all groups


class QueueLocks:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self._locks: dict[tuple, tuple[str, float]] = {}  # (group, mq) -> (client, at)

    def lock(self, group: str, client_id: str, queues: list[tuple]) -> list[tuple]:
        """Lock what is free, expired or already ``client_id``'s; the queues it now holds."""
        now = self._clock()
        got = []
        for mq in queues:
            key = (group, mq)
            held = self._locks.get(key)
            if held is None or held[0] == client_id or now - held[1] > LOCK_EXPIRY_S:
                if held is None and len(self._locks) >= MAX_LOCKS:
                    self._expire(now)
                    if len(self._locks) >= MAX_LOCKS:
                        continue
                self._locks[key] = (client_id, now)
                got.append(mq)
        return got

    def unlock(self, group: str, client_id: str, queues: list[tuple]) -> None:
        for mq in queues:
            key = (group, mq)
            held = self._locks.get(key)
            if held is not None and held[0] == client_id:
                del self._locks[key]

    def _expire(self, now: float) -> None:
        for key in [k for k, (_c, at) in self._locks.items() if now - at > LOCK_EXPIRY_S]:
            del self._locks[key]

    def holder(self, group: str, mq: tuple) -> str | None:
        held = self._locks.get((group, mq))
        if held is None or self._clock() - held[1] > LOCK_EXPIRY_S:
            return None
        return held[0]


__all__ = ["QueueLocks", "LOCK_EXPIRY_S"]

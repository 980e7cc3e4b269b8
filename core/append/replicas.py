"""A master's slaves as a put sees them (the replication itself: ``mqstore.replication``).

The Appender is handed one object of this protocol, as it is handed the flush policy (which
sees the flush loop through ``Flusher``), and calls it after every put, outside the put lock:
the append layer knows nothing of sockets or slaves. RocketMQ's rule for SYNC_MASTER lives in
the implementation: a put that waits for the store (``WAIT``, default true) answers PUT_OK once
a slave acknowledged its end, SLAVE_NOT_AVAILABLE when no slave is near enough, and
FLUSH_SLAVE_TIMEOUT when the acknowledgement does not come in time; the records stay stored.
"""

from __future__ import annotations

from typing import Protocol

from mqstore.message import PutStatus


class Replicas(Protocol):
    def complete_put(self, end_offset: int, wait: bool, status: PutStatus) -> PutStatus:
        """After a put of records ending at ``end_offset`` whose flush gave ``status``:
        the put's status. A replication failure replaces ``status`` (RocketMQ combines the
        two so); ``wait`` is the messages' WAIT property."""


__all__ = ["Replicas"]

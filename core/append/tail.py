"""The commit log's tail as appends leave it: the put lock, the newest record's end and store
time, and each queue's next offset.

Built by the opener before the parts that share it, and handed to each at construction: the
``Appender`` changes it under its lock; the runtime reads the last append (flush progress, the
checkpoint's store time) and takes the lock to let an append finish before a cleanup; the
topic configs learn from the queue table which queues messages were put to. So no part is
wired to another after it was built.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field


@dataclass(eq=False)
class AppendTail:
    end: int  # end offset of the newest complete append
    store_ts: int  # its store time (0: none known)
    # (topic, queue_id) -> the next queue offset; changed under ``lock``.
    queue_offsets: dict[tuple[str, int], int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def last_append(self) -> tuple[int, int]:
        """``(end offset, store time)`` of the newest record."""
        return self.end, self.store_ts

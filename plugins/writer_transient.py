"""The transient-pool writer (``writer.kind: transient_pool``), RocketMQ's TransientStorePool.

Appends are copied into a shared-memory buffer lent to the segment; the flush loop commits
them into the segment file (see ``mqstore.workers.flush_worker``), and only committed bytes are
readable or dispatched. A segment keeps its buffer until it is wholly committed. When a new
segment needs a buffer and none is free, the put wakes the flush loop and waits up to
``writer.commit_interval_ms`` for one to come back; after that it fails with
CREATE_MAPPED_FILE_FAILED and writes nothing, never hangs.
"""

from __future__ import annotations

import threading

import numpy as np

from mqstore.hookspecs import hookimpl
from mqstore.storage.transient_pool import PoolExhaustedError, TransientPool


class TransientPoolWriter:
    def __init__(self, commit_log, config) -> None:
        self.pool = TransientPool(config.writer.transient_pool_buffers, commit_log.segment_bytes)
        self.wait_s = config.writer.commit_interval_ms / 1000.0
        self.returned = threading.Condition()
        self.wake_committer = lambda: None  # set by the store once its flush loop runs
        self._seg = None
        self._buf = None

    def before_roll(self) -> None:
        """Called under the put lock before a new segment opens: one buffer must be free."""
        if self.pool.free_count():
            return
        self.wake_committer()
        with self.returned:
            if self.returned.wait_for(self.pool.free_count, self.wait_s):
                return
        raise PoolExhaustedError(
            f"transient pool exhausted: all {self.pool.buffers} buffers hold segments not yet "
            f"committed after waiting {self.wait_s * 1000:.0f} ms (writer.transient_pool_buffers)")

    def write(self, segment, data) -> int:
        if segment is not self._seg:
            self._buf = self.pool.lend(segment.start)
            segment.stage()
            self._seg = segment
        pos = segment.wrote
        end = pos + len(data)
        self._buf[pos:end] = data
        segment.wrote = end
        return pos

    def write_blank(self, segment, data) -> int:
        """The end-of-segment blank; the rest of a reused buffer is zeroed so the commit copies
        the same zeros a fresh (sparse) segment file has there."""
        pos = self.write(segment, data)
        np.frombuffer(self._buf, dtype=np.uint8)[pos + len(data):] = 0
        return pos

    def buffers_returned(self, committed: int) -> None:
        """The flush loop committed up to ``committed``: take back whole segments' buffers."""
        if self.pool.take_back(committed):
            with self.returned:
                self.returned.notify_all()

    def close(self) -> None:
        self._buf = None
        self._seg = None
        self.pool.close()


@hookimpl(trylast=True)
def register_writers(registry):
    registry.add("transient_pool", TransientPoolWriter)

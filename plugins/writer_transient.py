"""The transient-pool writer (``writer.kind: transient_pool``), RocketMQ's TransientStorePool.

Appends are copied into a shared-memory buffer lent to the segment; the flush loop commits
them into the segment file (see ``mqstore.workers.flush_worker``), and only committed bytes are
readable or dispatched. A segment keeps its buffer until it is wholly committed.

When a new segment opens and every buffer still holds uncommitted bytes (producers outrun the
commits), RocketMQ's default applies: that segment is written straight through its map, as by
the mmap writer, and a warning says so; the pool takes over again at the next segment that
finds a free buffer. With ``writer.fast_fail_no_buffer`` (fastFailIfNoBufferInStorePool) the
put instead wakes the flush loop, waits up to ``writer.commit_interval_ms`` for a buffer, then
fails with CREATE_MAPPED_FILE_FAILED and writes nothing; it never hangs.
"""

from __future__ import annotations

import logging
import threading

import numpy as np

from mqstore.contracts import WriterContext
from mqstore.hookspecs import hookimpl
from mqstore.storage.shared_segment import store_segment_name
from mqstore.storage.transient_pool import POOL_SEGMENT, PoolExhaustedError, TransientPool

log = logging.getLogger("mqstore.writer")


class TransientPoolWriter:
    def __init__(self, ctx: WriterContext) -> None:
        config, commit_log = ctx.config, ctx.commit_log
        self.staging = self.pool = TransientPool(
            config.writer.transient_pool_buffers, commit_log.segment_bytes,
            store_segment_name(ctx.root, POOL_SEGMENT), create=True)
        try:
            self.pool.warm()
        except BaseException:
            self.pool.close()  # the store does not open: leave no shared memory behind
            raise
        self.commit_log = commit_log
        self.wait_s = config.writer.commit_interval_ms / 1000.0
        self.fast_fail = config.writer.fast_fail_no_buffer
        self.direct_segments = 0  # segments written through their map for want of a buffer
        self.returned = threading.Condition()
        self.wake_committer = ctx.wake_committer
        self._seg = None
        self._buf = None

    def before_roll(self) -> None:
        """Called under the put lock before a new segment opens: with fast fail, one buffer
        must be free (or come free within one commit interval)."""
        if self.pool.free_count() or not self.fast_fail:
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
            self._seg = segment
            self._buf = self._borrow(segment)
        if self._buf is None:
            return segment.write(data)
        pos = segment.wrote
        end = pos + len(data)
        self._buf[pos:end] = data
        segment.wrote = end
        return pos

    def _borrow(self, segment):
        """The segment's buffer, lent now; None (write through the map) if the pool is dry.
        Either way the segment is staged: its bytes become readable as the flush loop's
        committed position passes them, so they never show before the segments ahead."""
        segment.stage()
        try:
            return self.pool.lend(segment.start)
        except PoolExhaustedError:
            self.wake_committer()
            self.direct_segments += 1
            log.warning("transient pool dry: all %d buffers hold uncommitted segments; segment "
                        "%d is written through its map (writer.transient_pool_buffers)",
                        self.pool.buffers, segment.start)
            return None

    def write_blank(self, segment, data) -> int:
        """The end-of-segment blank; the rest of a reused buffer is zeroed so the commit copies
        the same zeros a fresh (sparse) segment file has there."""
        pos = self.write(segment, data)
        if self._buf is None:
            return pos
        np.frombuffer(self._buf, dtype=np.uint8)[pos + len(data):] = 0
        return pos

    def on_committed(self, committed: int) -> None:
        """The flush loop committed up to ``committed``: staged segments become readable that
        far, and wholly committed segments give their buffers back."""
        for seg in reversed(self.commit_log.segments.segments):
            if not seg.staged:
                if seg.wrote:  # wholly committed, and so is everything before it
                    break
                continue  # just opened, not written to yet
            seg.set_committed(committed - seg.start)
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

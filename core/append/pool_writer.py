"""The transient-pool writer (``writer.kind: transient_pool``), RocketMQ's TransientStorePool.

Staging is core, not a plugin seam: this module owns the pool's whole life, which spans the
store's processes.

    open        ``salvage_pool``: what a killed store's pool held and its files did not is
                written back, and the pool removed (``opening``, before recovery)
    append      ``TransientPoolWriter`` creates the pool and copies appends into the buffer
                lent to the segment (store process, under the put lock)
    commit      the flush loop attaches (``attach_pool``) and copies committed ranges into the
                segment files (``workers.flush_worker.FlushService.commit``)
    readable    ``TransientPoolWriter.on_committed`` moves the readable end as the committed
                one passes (store process, the flush listener)
    close       the pool is removed, or kept for the next open's salvage while it still holds
                acknowledged records its files lack (``Runtime.close_writer``)

``staging_pool(writer)`` is how the core tells this writer from a plain one: every other
writer (``contracts.Writer``, the built-in ``mmap`` and any plugin's) is plain, its bytes
readable once copied. The ``transient_pool`` plugin only registers this class under its kind.

Appends are copied into a shared-memory buffer lent to the segment; only committed bytes are
readable or dispatched. A segment keeps its buffer until it is wholly committed. When a new
segment opens and every buffer still holds uncommitted bytes (producers outrun the commits),
RocketMQ's default applies: that segment is written straight through its map, as by the mmap
writer, and a warning says so; the pool takes over again at the next segment that finds a free
buffer. With ``writer.fast_fail_no_buffer`` (fastFailIfNoBufferInStorePool) the put instead
wakes the flush loop, waits up to ``writer.commit_interval_ms`` for a buffer, then fails with
CREATE_MAPPED_FILE_FAILED and writes nothing; it never hangs.
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING

import numpy as np

from mqstore.storage.shared_segment import path_segment_name, store_segment_name
from mqstore.storage.transient_pool import POOL_SEGMENT, PoolExhaustedError, TransientPool, salvage

if TYPE_CHECKING:
    from mqstore.config import StoreConfig
    from mqstore.plugin_api.contracts import WriterContext
    from mqstore.storage.segment_queue import SegmentQueue

log = logging.getLogger(__name__)


class TransientPoolWriter:
    """``contracts.Writer`` that stages appends in the store's transient pool (``pool``)."""

    def __init__(self, ctx: "WriterContext") -> None:
        config, commit_log = ctx.config, ctx.commit_log
        self.pool = TransientPool(
            config.writer.transient_pool_buffers, commit_log.segment_bytes,
            store_segment_name(ctx.store_id, POOL_SEGMENT), create=True)
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
        if end > segment.reserved_to:  # the flush loop copies it into blocks that exist
            segment.reserve_span(pos, end)
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
        """The end-of-segment blank; the rest of a reused buffer is zeroed so that it mirrors
        a fresh segment file (the commit stops after the blank: ``nonzero_end``)."""
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

    def close(self, keep_staged: bool = False) -> None:
        """Detach from the pool; ``keep_staged``: it still holds acknowledged records its
        files lack, so it stays for the next open to write back (``salvage_pool``)."""
        self._buf = None
        self._seg = None
        if keep_staged:
            self.pool.keep_on_close = True
        self.pool.close()


class MapWriter:
    """A plain writer standing in for the pool writer where staging is off: a replication
    slave's copies of its master's records (RocketMQ enables the transient pool on masters
    only) are readable, dispatched and flushed as soon as they are copied into the map."""

    def __init__(self, ctx: "WriterContext") -> None:
        pass

    def write(self, segment, data) -> int:
        return segment.write(data)

    write_blank = write

    def before_roll(self) -> None:
        pass

    def close(self) -> None:
        pass


def staging_pool(writer: object) -> TransientPool | None:
    """The pool ``writer`` stages in: the core's pool writer's, None for a plain writer."""
    return writer.pool if isinstance(writer, TransientPoolWriter) else None


def attach_pool(name: str, config: "StoreConfig", segment_bytes: int) -> TransientPool:
    """The store's pool, attached and mapped in the flush loop's process."""
    pool = TransientPool(config.writer.transient_pool_buffers, segment_bytes, name)
    try:
        pool.warm()
    except BaseException:
        pool.close()
        raise
    return pool


def salvage_pool(root: str, store_id: str | None, segments: "SegmentQueue") -> list[str]:
    """Write back what a killed store's pool held and its files did not, then remove the
    pool; returns notes on what was written back (``transient_pool.salvage``). The pool is
    the one named after ``store_id`` (None: the store has none yet), and one named after
    ``root``'s path, as stores were before they had an id."""
    notes = salvage(store_segment_name(store_id, POOL_SEGMENT), segments) if store_id else []
    return notes + salvage(path_segment_name(root, POOL_SEGMENT), segments)

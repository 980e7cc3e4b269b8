"""The write side of MessageStore: service checks, put, put_batch and commit-log flushing.

Appends serialise on the store's put lock; everything that does not depend on where a record
lands (validation, encoding of bodies and properties) happens before the lock is taken.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from mqstore import appender
from mqstore.batch_columns import columns_from_batch, columns_from_prepared, encode_columns
from mqstore.message import BatchPutResult, Message, MessageBatch, PutResult, PutStatus
from mqstore.errors import WorkerError
from mqstore.storage.commit_log import BlockTooLargeError
from mqstore.format.record import END_FILE_MIN_BLANK_BYTES
from mqstore.storage.transient_pool import PoolExhaustedError
from mqstore.uninterrupted import shield
from mqstore.workers import shm

# Running flags (spec 9)
NOT_READABLE = 1
NOT_WRITEABLE = 2
WRITE_LOGICS_QUEUE_ERROR = 4
WRITE_INDEX_FILE_ERROR = 8
DISK_FULL = 16
UNWRITABLE = NOT_WRITEABLE | WRITE_LOGICS_QUEUE_ERROR | WRITE_INDEX_FILE_ERROR | DISK_FULL


def _explicit_ids(messages, n: int):
    if isinstance(messages, MessageBatch):
        return [None] * n
    return [m.queue_id for m in messages]


def _queue_keys(topics: list[str], queue_ids: np.ndarray) -> tuple[list, np.ndarray]:
    """Distinct (topic, queue id) keys of a batch and each message's index into them."""
    if len(set(topics)) == 1:
        uniq, inverse = np.unique(queue_ids, return_inverse=True)
        topic = topics[0]
        return [(topic, int(q)) for q in uniq.tolist()], inverse.ravel()
    index: dict = {}
    inverse = np.fromiter((index.setdefault((t, q), len(index))
                           for t, q in zip(topics, queue_ids.tolist())),
                          dtype=np.int64, count=len(topics))
    return list(index), inverse


def _blocks(ends: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Split a batch (record ends ``ends``) into runs of whole records of at most ``limit``
    bytes each: one run per commit-log segment it will occupy."""
    blocks = []
    start, n = 0, len(ends)
    while start < n:
        base = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, base + limit, side="right"))
        blocks.append((start, stop))
        start = stop
    return blocks


def _rank_within_group(inverse: np.ndarray, groups: int) -> np.ndarray:
    """For each message, how many earlier messages of the batch share its queue."""
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=groups)
    starts = np.cumsum(counts) - counts
    rank = np.empty(len(inverse), dtype=np.int64)
    rank[order] = np.arange(len(inverse)) - np.repeat(starts, counts)
    return rank


class PutMixin:
    def flush_commit_log(self, least_pages: int = 0) -> int:
        """One flush pass now, as RocketMQ's MappedFileQueue.flush(least_pages), after
        committing everything staged in the transient pool; returns the flushed offset."""
        self._check_open()
        if self.read_only:
            raise PermissionError(f"store {self.root!r} is open read-only")
        failure = self.flush_client.take_failure()
        if failure is not None:
            raise WorkerError(failure)
        return self.flush_client.flush_now(least_pages)

    def _apply_flush_progress(self, committed: int, flushed: int, failed: bool) -> None:
        """What the flush loop reported: readable ends, pool buffers, flushed end, checkpoint."""
        pool_writer = self.writer if getattr(self.writer, "pool", None) is not None else None
        if pool_writer is not None:
            for seg in reversed(self.commit_log.segments.segments):
                if not seg.staged:
                    if seg.wrote:  # wholly committed, and so is everything before it
                        break
                    continue  # just opened, not written to yet
                seg.set_committed(committed - seg.start)
            pool_writer.buffers_returned(committed)
        if flushed > self.flushed_where:
            self.flushed_where = flushed
            # Recovery treats damage below this offset as bit rot, not a torn tail.
            self.checkpoint.confirm_phy_offset = flushed
            end, store_ts = self._last_append
            if flushed >= end and store_ts:
                self.checkpoint.physic_msg_timestamp = store_ts
        if failed and not self.running_flags & NOT_WRITEABLE:
            self.running_flags |= NOT_WRITEABLE  # as RocketMQ after a failed force
        self._wake_dispatch()

    # -- service checks --------------------------------------------------------------------
    def _service_status(self) -> tuple[PutStatus, str] | None:
        self._check_open()
        if self.read_only:
            return PutStatus.SERVICE_NOT_AVAILABLE, "store is open read-only"
        if self.config.store.role == "slave":
            return PutStatus.SERVICE_NOT_AVAILABLE, "store role is slave"
        if self.running_flags & UNWRITABLE:
            return PutStatus.SERVICE_NOT_AVAILABLE, self._unwritable_reason()
        stuck = self._loops_failing()
        if stuck is not None:  # what is appended now would never become readable
            return PutStatus.SERVICE_NOT_AVAILABLE, stuck
        begin = self._begin_in_lock
        if begin:
            held = self.clock() - begin
            if self.config.store.os_page_cache_busy_timeout_ms < held < 10_000_000:
                return PutStatus.OS_PAGE_CACHE_BUSY, f"put lock held for {held} ms"
        return None

    def _unwritable_reason(self) -> str:
        flags = self.running_flags
        reasons = []
        if flags & DISK_FULL:
            reasons.append(f"disk full: the disk of {self.root} is over "
                           f"{self.config.cleanup.disk_warning_ratio}% used "
                           f"(cleanup.disk_warning_ratio); puts resume once cleanup frees space")
        if flags & NOT_WRITEABLE:
            reasons.append("a commit-log flush failed: the store takes no more puts until it "
                           "is reopened")
        if flags & (WRITE_LOGICS_QUEUE_ERROR | WRITE_INDEX_FILE_ERROR):
            reasons.append("consume queues or index files could not be written")
        return "; ".join(reasons) + f" (running flags {flags:#x})"

    def _loops_failing(self) -> str | None:
        """Why the dispatch or flush loop cannot do its work now, or None."""
        sup = self.supervisor
        if sup is not None:
            if sup.gave_up is not None:
                return sup.gave_up
            if self.positions[shm.DISPATCH_FAILS]:
                return self.positions.note(shm.DISPATCH_NOTE)
        elif self.dispatch_thread is not None:
            if self.dispatch_thread.exception is not None:
                return self.dispatch_loop.error
            if self.dispatch_loop.failing is not None:
                return self.dispatch_loop.failing
        flush_sup = self.flush_client.supervisor if self.flush_client is not None else None
        if flush_sup is not None and flush_sup.gave_up is not None:
            return flush_sup.gave_up
        return None

    def lock_held_ms(self) -> int:
        """How long the current append has held the put lock (0 when free)."""
        self._check_open()
        begin = self._begin_in_lock
        return max(0, self.clock() - begin) if begin else 0

    def _now_locked(self) -> int:
        # Store times never go backwards in log order, so time search can bisect.
        now = self.clock()
        if now < self._last_store_ts:
            now = self._last_store_ts
        self._last_store_ts = now
        return now

    # -- put -------------------------------------------------------------------------------
    def put(self, message: Message) -> PutResult:
        """Append one message. Bad arguments raise ValueError; store-level refusals return a status."""
        refused = self._service_status()
        if refused is not None:
            return PutResult(refused[0], error=refused[1])
        if self.hooks.has_before_append:
            self.hooks.before_append([message])
        try:
            p = appender.prepare(message, self._put_ctx)
        except appender.Rejected as rej:
            result = PutResult(rej.status, error=rej.reason)
            self.hooks.after_append(BatchPutResult.rejected(rej.status, rej.reason, 0))
            return result
        if p.queue_id is None:
            p.queue_id = appender.check_queue_id(
                self.selector.select(message, self.config.queue_select.queues_per_topic))
        too_big = self._check_fits_segment(p.size)
        if too_big is not None:
            self.hooks.after_append(BatchPutResult.rejected(PutStatus.MESSAGE_ILLEGAL, too_big, 0))
            return PutResult(PutStatus.MESSAGE_ILLEGAL, error=too_big)
        key = (p.topic, p.queue_id)
        shield.enter()  # NOTE [ Uninterrupted puts ]
        try:
            with self._put_lock:
                now = self._begin_in_lock = self._now_locked()
                try:
                    qoff = self._queue_offsets.get(key, 0) if p.queued else 0
                    try:
                        seg = self.commit_log.reserve_locked(p.size, self.writer)
                    except (OSError, PoolExhaustedError) as exc:
                        return PutResult(PutStatus.CREATE_MAPPED_FILE_FAILED, error=str(exc))
                    phys = seg.start + seg.wrote
                    record = appender.encode_single(p, self.store_host, p.queue_id, qoff, phys, now)
                    # From here on only copies and assignments: nothing can fail half way.
                    self.writer.write(seg, record)
                    if p.queued:
                        self._queue_offsets[key] = qoff + 1
                    self._last_append = (phys + p.size, now)
                finally:
                    self._begin_in_lock = 0
            self._wake_dispatch()
        finally:
            shield.leave()
        status = self.flush_policy.after_append(phys + p.size, p.wait)
        result = PutResult(status, p.queue_id, qoff, phys, p.size,
                           f"{self._msg_id_prefix}{phys:016X}", now)
        if self.hooks.has_after_append:
            self.hooks.after_append(BatchPutResult(
                status, np.array([p.queue_id]), np.array([qoff]), np.array([phys]),
                np.array([p.size]), now, self.store_host))
        return result

    def _check_fits_segment(self, size: int) -> str | None:
        limit = self.commit_log.segment_bytes - END_FILE_MIN_BLANK_BYTES
        if size > limit:
            return (f"record of {size} bytes does not fit a commit-log segment of "
                    f"{self.commit_log.segment_bytes} bytes (at most {limit} per record)")
        return None

    def put_batch(self, messages: Sequence[Message] | MessageBatch) -> BatchPutResult:
        """Append many messages (any topics/queues) under one lock.

        ``messages`` is a list of Message objects or a columnar ``MessageBatch`` (faster: no
        per-message objects). Messages of one queue get consecutive offsets. The batch is
        written as one block per commit-log segment: a block that does not fit rolls as a
        whole; a batch larger than a segment is split between messages. A rejected message
        rejects the whole batch and nothing is written.
        """
        refused = self._service_status()
        if refused is not None:
            return BatchPutResult.rejected(refused[0], refused[1])
        if not isinstance(messages, MessageBatch):
            messages = list(messages)
            if not messages:
                raise ValueError("put_batch needs at least one message")
        self.hooks.before_append(messages)
        try:
            if isinstance(messages, MessageBatch):
                cols = columns_from_batch(messages, self._put_ctx)
            else:
                cols = columns_from_prepared(appender.prepare_batch(messages, self._put_ctx),
                                             messages)
        except appender.Rejected as rej:
            result = BatchPutResult.rejected(rej.status, f"message {rej.index}: {rej.reason}",
                                             rej.index)
            self.hooks.after_append(result)
            return result
        n = cols.n
        if cols.queue_ids is None:
            queues = self.config.queue_select.queues_per_topic
            select = self.selector.select
            cols.queue_ids = np.fromiter(
                (appender.check_queue_id(select(m, queues)) if q is None else q
                 for m, q in zip(cols.select_inputs, _explicit_ids(messages, n))),
                dtype=np.int64, count=n)
        sizes = cols.sizes
        qids = cols.queue_ids
        biggest = int(np.argmax(sizes))
        too_big = self._check_fits_segment(int(sizes[biggest]))
        if too_big is not None:
            result = BatchPutResult.rejected(PutStatus.MESSAGE_ILLEGAL,
                                             f"message {biggest}: {too_big}", biggest)
            self.hooks.after_append(result)
            return result
        ends = np.cumsum(sizes)
        blocks = _blocks(ends, self.commit_log.segment_bytes - END_FILE_MIN_BLANK_BYTES)
        phys = np.empty(n, dtype=np.int64)
        keys, inverse = _queue_keys(cols.topics, qids)
        counts = np.bincount(inverse, minlength=len(keys))
        shield.enter()  # NOTE [ Uninterrupted puts ]
        try:
            with self._put_lock:
                now = self._begin_in_lock = self._now_locked()
                try:
                    table = self._queue_offsets
                    bases = np.array([table.get(k, 0) for k in keys], dtype=np.int64)
                    qoffs = bases[inverse] + _rank_within_group(inverse, len(keys))
                    advanced = dict(zip(keys, (bases + counts).tolist()))
                    try:
                        segs = self.commit_log.reserve_blocks_locked(
                            [int(ends[stop - 1] - (ends[start - 1] if start else 0))
                             for start, stop in blocks], self.writer)
                    except (OSError, BlockTooLargeError, PoolExhaustedError) as exc:
                        return BatchPutResult.rejected(PutStatus.CREATE_MAPPED_FILE_FAILED,
                                                       str(exc))
                    try:
                        records = []
                        for (start, stop), seg in zip(blocks, segs):
                            base = int(ends[start - 1]) if start else 0
                            phys[start:stop] = (seg.start + seg.wrote
                                                + (ends[start:stop] - sizes[start:stop] - base))
                            records.append(encode_columns(
                                cols, start, stop, self.store_host, qids, qoffs, phys, now))
                    except BaseException:
                        self.commit_log.abandon_locked(segs, self.writer)
                        raise
                    # From here on only copies and assignments: nothing can fail half way.
                    last = len(segs) - 1
                    for i, (seg, record) in enumerate(zip(segs, records)):
                        self.writer.write(seg, record)
                        if i < last:
                            self.commit_log.close_segment_locked(seg, self.writer)
                    table.update(advanced)
                    self._last_append = (int(phys[-1] + sizes[-1]), now)
                finally:
                    self._begin_in_lock = 0
            self._wake_dispatch()
        finally:
            shield.leave()
        status = self.flush_policy.after_append(int(phys[-1] + sizes[-1]), cols.wait)
        result = BatchPutResult(status, qids, qoffs, phys, sizes, now, self.store_host)
        self.hooks.after_append(result)
        return result

    def _publish_written(self, written: int) -> bool:
        """Move the shared WRITTEN end forward (it never goes back); True if it moved."""
        values = self.positions.values
        if written > values[shm.WRITTEN]:
            values[shm.WRITTEN] = written
            return True
        return False

    def _wake_committer(self) -> None:
        """A writer waits for pool buffers under the put lock: publish what this append has
        written so far (whole segments the committer may now finish), then wake it."""
        self._publish_written(self.commit_log.segments.contiguous_end())
        self.flush_client.wake()

    def _wake_dispatch(self) -> None:
        """Publish the written and visible ends; wake the loops that act on them."""
        positions = self.positions
        if positions is None:
            return
        values = positions.values
        if self._publish_written(self._last_append[0]) and self._staged_writes:
            self.flush_client.wake_if_idle()  # wakeCommitWhenPutMessage
        confirmed = self.confirm_offset()
        if confirmed > values[shm.CONFIRMED]:
            values[shm.CONFIRMED] = confirmed
        if self.supervisor is not None:
            # Publish before reading the idle flag: see the handshake in dispatch_worker.
            if values[shm.DISPATCH_IDLE]:
                self.supervisor.wake()
            return
        thread = self.dispatch_thread
        if thread is not None and not thread.wake.is_set():
            thread.wake.set()

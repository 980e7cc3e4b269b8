"""The Appender: put and put_batch, one path, serialised on the put lock.

Everything that does not depend on where a record lands (validation, encoding of bodies and
properties, queue selection) happens before the lock is taken. Under the lock, ``_append``
plans queue offsets, reserves every segment the records need (anything that can fail), then
only copies and assigns (NOTE [ Uninterrupted puts ]): a put is all or nothing.
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np

from mqstore import appender
from mqstore.batch_columns import columns_from_batch, columns_from_messages, encode_columns
from mqstore.format.record import END_FILE_MIN_BLANK_BYTES, offset_msg_id
from mqstore.errors import StoreClosedError
from mqstore.message import BatchPutResult, Message, MessageBatch, PutResult, PutStatus
from mqstore.running_flags import UNWRITABLE
from mqstore.storage.commit_log import BlockTooLargeError
from mqstore.storage.transient_pool import PoolExhaustedError
from mqstore.uninterrupted import shield


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


class _Refused(Exception):
    """A segment could not be reserved: the put answers CREATE_MAPPED_FILE_FAILED."""


class Appender:
    """Owns the put lock, the queue-offset table and the writer."""

    def __init__(self, *, state, commit_log, writer, selector, flush_policy, hooks, config,
                 put_ctx, store_host, clock, queue_offsets: dict, last_append: tuple[int, int],
                 failing: Callable[[], str | None], appended: Callable[[int], None]) -> None:
        """``failing()``: why the loops cannot do their work (puts wait), or None.
        ``appended(end)``: called after each append with the new end of the log (publishes
        it, wakes the loops)."""
        self.state = state
        self.slave = config.store.role == "slave"
        self.busy_timeout_ms = config.store.os_page_cache_busy_timeout_ms
        self.disk_warning_ratio = config.cleanup.disk_warning_ratio
        self.failing = failing
        self.commit_log = commit_log
        self.writer = writer
        self.selector = selector
        self.flush_policy = flush_policy
        self.hooks = hooks
        self.queues_per_topic = config.queue_select.queues_per_topic
        self.put_ctx = put_ctx
        self.store_host = store_host
        self.msg_id_prefix = offset_msg_id(store_host, 0)[:-16]
        self.clock = clock
        self.queue_offsets = queue_offsets
        self.last_append = last_append  # (end offset, store time) of the newest record
        self.appended = appended
        self.lock = threading.Lock()
        self.begin_in_lock = 0  # store time the current append took the lock (0: free)
        self._last_store_ts = last_append[1]
        self._limit = commit_log.segment_bytes - END_FILE_MIN_BLANK_BYTES

    # -- service checks --------------------------------------------------------------------
    def refusal(self) -> tuple[PutStatus, str] | None:
        """Why the store takes no put now (RocketMQ's status and a reason), or None."""
        state = self.state
        if state.closed:
            raise StoreClosedError(f"store {state.root!r} is closed")
        if self.slave:
            return PutStatus.SERVICE_NOT_AVAILABLE, "store role is slave"
        if state.running_flags & UNWRITABLE:
            return PutStatus.SERVICE_NOT_AVAILABLE, state.unwritable_reason(self.disk_warning_ratio)
        stuck = self.failing()
        if stuck is not None:  # what is appended now would never become readable
            return PutStatus.SERVICE_NOT_AVAILABLE, stuck
        begin = self.begin_in_lock
        if begin:
            held = self.clock() - begin
            if self.busy_timeout_ms < held < 10_000_000:
                return PutStatus.OS_PAGE_CACHE_BUSY, f"put lock held for {held} ms"
        return None

    # -- put -------------------------------------------------------------------------------
    def put(self, message: Message) -> PutResult:
        refused = self.refusal()
        if refused is not None:
            return PutResult(refused[0], error=refused[1])
        hooks = self.hooks
        if hooks.has_before_append:
            hooks.before_append([message])
        try:
            p = appender.prepare(message, self.put_ctx)
            if p.queue_id is None:
                p.queue_id = appender.check_queue_id(
                    self.selector.select(message, self.queues_per_topic))
            self._check_fits(p.size, None)
        except appender.Rejected as rej:
            hooks.after_append(BatchPutResult.rejected(rej.status, rej.reason, 0))
            return PutResult(rej.status, error=rej.reason)
        qid = p.queue_id
        keys = [(p.topic, qid)] if p.queued else []

        def encode(segs, bases, now):
            seg = segs[0]
            phys = seg.start + seg.wrote
            return [appender.encode_single(p, self.store_host, qid, bases[0] if keys else 0,
                                           phys, now)], phys

        try:
            bases, phys, now = self._append([p.size], keys, [1], encode)
        except _Refused as exc:
            return PutResult(PutStatus.CREATE_MAPPED_FILE_FAILED, error=str(exc))
        qoff = bases[0] if keys else 0
        status = self.flush_policy.complete_put(phys + p.size, p.wait)
        if hooks.has_after_append:
            hooks.after_append(BatchPutResult(
                status, np.array([qid]), np.array([qoff]), np.array([phys]),
                np.array([p.size]), now, self.store_host))
        return PutResult(status, qid, qoff, phys, p.size,
                         f"{self.msg_id_prefix}{phys:016X}", now)

    def put_batch(self, messages: Sequence[Message] | MessageBatch) -> BatchPutResult:
        refused = self.refusal()
        if refused is not None:
            return BatchPutResult.rejected(refused[0], refused[1])
        if not isinstance(messages, MessageBatch):
            messages = list(messages)
            if not messages:
                raise ValueError("put_batch needs at least one message")
        self.hooks.before_append(messages)
        try:
            cols = self._columns(messages)
            biggest = int(np.argmax(cols.sizes))
            self._check_fits(int(cols.sizes[biggest]), biggest)
        except appender.Rejected as rej:
            result = BatchPutResult.rejected(rej.status, f"message {rej.index}: {rej.reason}",
                                             rej.index)
            self.hooks.after_append(result)
            return result
        sizes, qids = cols.sizes, cols.queue_ids
        ends = np.cumsum(sizes)
        blocks = _blocks(ends, self._limit)
        keys, inverse = _queue_keys(cols.topics, qids)
        counts = np.bincount(inverse, minlength=len(keys))
        phys = np.empty(cols.n, dtype=np.int64)
        qoffs = None

        def encode(segs, bases, now):
            nonlocal qoffs
            qoffs = np.asarray(bases, dtype=np.int64)[inverse] + _rank_within_group(
                inverse, len(keys))
            records = []
            for (start, stop), seg in zip(blocks, segs):
                base = int(ends[start - 1]) if start else 0
                phys[start:stop] = (seg.start + seg.wrote
                                    + (ends[start:stop] - sizes[start:stop] - base))
                records.append(encode_columns(cols, start, stop, self.store_host, qids, qoffs,
                                              phys, now))
            return records, int(phys[0])

        block_bytes = [int(ends[stop - 1] - (ends[start - 1] if start else 0))
                       for start, stop in blocks]
        try:
            _bases, _first, now = self._append(block_bytes, keys, counts.tolist(), encode)
        except _Refused as exc:
            return BatchPutResult.rejected(PutStatus.CREATE_MAPPED_FILE_FAILED, str(exc))
        status = self.flush_policy.complete_put(int(phys[-1] + sizes[-1]), cols.wait)
        result = BatchPutResult(status, qids, qoffs, phys, sizes, now, self.store_host)
        self.hooks.after_append(result)
        return result

    def _columns(self, messages):
        """The batch as columns, each message with its queue id (selected when it has none)."""
        if isinstance(messages, MessageBatch):
            cols = columns_from_batch(messages, self.put_ctx)
        else:
            cols = columns_from_messages(messages, self.put_ctx)
        if cols.queue_ids is None:
            queues, select = self.queues_per_topic, self.selector.select
            cols.queue_ids = np.fromiter(
                (appender.check_queue_id(select(m, queues)) if q is None else q
                 for m, q in zip(cols.select_inputs, _explicit_ids(messages, cols.n))),
                dtype=np.int64, count=cols.n)
        return cols

    def _check_fits(self, size: int, index: int | None) -> None:
        if size > self._limit:
            seg_bytes = self.commit_log.segment_bytes
            raise appender.Rejected(
                PutStatus.MESSAGE_ILLEGAL,
                f"record of {size} bytes does not fit a commit-log segment of {seg_bytes} "
                f"bytes (at most {self._limit} per record)", index)

    # -- the locked section ------------------------------------------------------------------
    def _append(self, block_bytes: list[int], keys: list, counts: list[int], encode):
        """Write blocks of records (one per segment they occupy) under the put lock.

        ``encode(segments, queue_offset_bases, now)`` returns the blocks' bytes and the first
        record's commit-log offset; it may raise, and then nothing is written. Returns
        ``(bases, first_phys, now)``.
        """
        log = self.commit_log
        writer = self.writer
        shield.enter()  # NOTE [ Uninterrupted puts ]
        try:
            with self.lock:
                now = self.clock()
                if now < self._last_store_ts:  # store times never go backwards in log order,
                    now = self._last_store_ts  # so time search can bisect
                self._last_store_ts = self.begin_in_lock = now
                try:
                    table = self.queue_offsets
                    bases = [table.get(k, 0) for k in keys]
                    try:
                        segs = (log.reserve_blocks_locked(block_bytes, writer)
                                if len(block_bytes) > 1
                                else [log.reserve_locked(block_bytes[0], writer)])
                    except (OSError, BlockTooLargeError, PoolExhaustedError) as exc:
                        raise _Refused(str(exc)) from None
                    try:
                        records, first = encode(segs, bases, now)
                    except BaseException:
                        log.abandon_locked(segs, writer)
                        raise
                    # From here on only copies and assignments: nothing can fail half way.
                    seg = segs[-1]
                    for earlier, record in zip(segs[:-1], records):
                        writer.write(earlier, record)
                        log.close_segment_locked(earlier, writer)
                    writer.write(seg, records[-1])
                    for key, base, count in zip(keys, bases, counts):
                        table[key] = base + count
                    end = seg.start + seg.wrote
                    self.last_append = (end, now)
                finally:
                    self.begin_in_lock = 0
            self.appended(end)
        finally:
            shield.leave()
        return bases, first, now

    def lock_held_ms(self) -> int:
        """How long the current append has held the put lock (0 when free)."""
        begin = self.begin_in_lock
        return max(0, self.clock() - begin) if begin else 0


class ReadOnlyAppender:
    """What a read-only store answers to puts."""

    def __init__(self, state) -> None:
        self.state = state

    def _refusal(self) -> str:
        if self.state.closed:
            raise StoreClosedError(f"store {self.state.root!r} is closed")
        return "store is open read-only"

    def put(self, message) -> PutResult:
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=self._refusal())

    def put_batch(self, messages) -> BatchPutResult:
        return BatchPutResult.rejected(PutStatus.SERVICE_NOT_AVAILABLE, self._refusal())

    def lock_held_ms(self) -> int:
        self._refusal()
        return 0

"""The Appender: put and put_batch, one path, serialised on the put lock.

Everything that does not depend on where a record lands (validation, encoding of bodies and
properties, queue selection) happens before the lock is taken. Under the lock, ``_append``
plans queue offsets, reserves every segment the records need (anything that can fail), then
only copies and assigns (NOTE [ Uninterrupted puts ]): a put is all or nothing.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Callable, Sequence

import numpy as np

from mqstore.append import encoding
from mqstore.append.columns import columns_from_batch, columns_from_messages, encode_columns
from mqstore.append.copies import Copies
from mqstore.append.placement import Refused, blocks_of, queue_keys, rank_within_group
from mqstore.append.settings import AppendSettings, Loops, PutStrategies
from mqstore.append.single import Single as _Single
from mqstore.append.tail import AppendTail
from mqstore.format.names import is_system_topic, system_topic_refusal
from mqstore.format.record import END_FILE_MIN_BLANK_BYTES, offset_msg_id
from mqstore.errors import CorruptStateError, StoreClosedError
from mqstore.message import (
    BatchPutResult, Message, MessageBatch, PutCounts, PutResult, PutStatus,
)
from mqstore.running_flags import UNWRITABLE
from mqstore.storage.commit_log import BlockTooLargeError
from mqstore.storage.transient_pool import PoolExhaustedError
from mqstore.uninterrupted import shield
from mqstore.view.topics import TopicRefused

if TYPE_CHECKING:
    from mqstore.plugin_api.contracts import Writer
    from mqstore.roles import RoleState
    from mqstore.running_flags import StoreState
    from mqstore.storage.commit_log import CommitLog
    from mqstore.view.topics import Topics


def _explicit_ids(messages, n: int):
    if isinstance(messages, MessageBatch):
        return [None] * n
    return [m.queue_id for m in messages]


def _highest_ids(topics: list[str], queue_ids) -> dict[str, int]:
    """``{topic: the highest queue id the batch names for it, -1 for none}``, topics in the
    order of their first message; ``queue_ids``: an array, a list with None where the
    selector chooses, or None (it chooses for all)."""
    if queue_ids is None:
        return dict.fromkeys(topics, -1)
    if isinstance(queue_ids, np.ndarray):
        if len(set(topics)) == 1:
            return {topics[0]: int(queue_ids.max())}
        keys, inverse = queue_keys(topics, np.zeros(len(topics), dtype=np.int64))
        highest = np.full(len(keys), -1, dtype=np.int64)
        np.maximum.at(highest, inverse, queue_ids)
        return {t: int(h) for (t, _q), h in zip(keys, highest.tolist())}
    out = dict.fromkeys(topics, -1)
    for i, q in enumerate(queue_ids):
        if q is not None and q > out[topics[i]]:
            out[topics[i]] = q
    return out


def _refused_index(topics: list[str], queue_ids, refused: TopicRefused) -> int:
    """The first message of a batch its topic's refusal is about."""
    if refused.queues is not None and queue_ids is not None:
        for i, (t, q) in enumerate(zip(topics, queue_ids)):
            if t == refused.topic and q is not None and q >= refused.queues:
                return i
    return topics.index(refused.topic)


class Appender:
    """Owns the put lock (the tail's), the queue-offset table and the writer."""

    def __init__(self, *, state: StoreState, commit_log: CommitLog, writer: Writer,
                 settings: AppendSettings, strategies: PutStrategies, loops: Loops,
                 tail: AppendTail, topics: Topics, clock: Callable[[], int],
                 role: RoleState) -> None:
        """``tail``: the lock, last append and queue table this Appender changes (shared
        with the parts that read them); ``topics``: the store's ``view.topics.Topics``;
        ``role``: whether this store takes puts now (``mqstore.roles``)."""
        self.state = state
        self.settings = settings
        self.role = role
        self.busy_timeout_ms = settings.busy_timeout_ms
        self.disk_warning_ratio = settings.disk_warning_ratio
        self.failing = loops.failing
        self.appended = loops.appended
        self.commit_log = commit_log
        self.writer = writer
        self.selector = strategies.selector
        self.flush_policy = strategies.flush_policy
        self.replicas = strategies.replicas
        self.hooks = strategies.hooks
        self.queues_per_topic = settings.queues_per_topic
        self.selector_name = settings.selector_name
        self.topics = topics
        self.put_ctx = settings.put_ctx
        self.store_host = settings.store_host
        self.msg_id_prefix = offset_msg_id(settings.store_host, 0)[:-16]
        self.clock = clock
        self.tail = tail
        self.queue_offsets = tail.queue_offsets
        self.lock = tail.lock
        self.begin_in_lock = 0  # store time the current append took the lock (0: free)
        # put_counts: what was appended (kept under the put lock) and the refusals (their own
        # lock: a refused put never takes the put lock).
        self._appended_messages = self._appended_bytes = 0
        self._refused = 0
        self._refused_lock = threading.Lock()
        self._last_store_ts = tail.store_ts
        self._limit = commit_log.segment_bytes - END_FILE_MIN_BLANK_BYTES

    @property
    def last_append(self) -> tuple[int, int]:
        """``(end offset, store time)`` of the newest record (the tail's)."""
        return self.tail.end, self.tail.store_ts

    @last_append.setter
    def last_append(self, value: tuple[int, int]) -> None:
        self.tail.end, self.tail.store_ts = value

    # -- service checks --------------------------------------------------------------------
    def refusal(self) -> tuple[PutStatus, str] | None:
        """Why the store takes no put now (RocketMQ's status and a reason), or None."""
        state = self.state
        if state.closed:
            raise StoreClosedError(f"store {state.root!r} is closed")
        refused = self.role.refusal()
        if refused is not None:  # a slave, or a fenced master (NOTE [ Fencing ])
            return PutStatus.SERVICE_NOT_AVAILABLE, refused
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
        return self._put(message, _Single)

    def put_batch(self, messages: Sequence[Message] | MessageBatch) -> BatchPutResult:
        return self._put(messages, _Batch)

    def put_state(self, batch: MessageBatch) -> BatchPutResult:
        """The store's own records (the state mirror's): a batch of system topics with their
        queue ids, which producers are refused, put past the topic configs."""
        return self._put(batch, _SystemBatch)

    def put_copies(self, items: list) -> BatchPutResult:
        """The schedule's delivered copies (``append.delays.copy_of``), written as one put:
        all or nothing, past the topic configs and the put hooks, as the store's own records."""
        refused = self.refusal()
        if refused is not None:
            return BatchPutResult.rejected(*refused)
        try:
            end, written = Copies.append(self, items)
        except Refused as exc:
            return BatchPutResult.rejected(PutStatus.CREATE_MAPPED_FILE_FAILED, str(exc))
        status = self.flush_policy.complete_put(end, False)
        if self.replicas is not None:
            status = self.replicas.complete_put(end, False, status)
        qids, qoffs, phys, sizes, now = written
        return BatchPutResult(status, qids, qoffs, phys, sizes, now, self.store_host)

    def put_counts(self) -> PutCounts:
        with self.lock:
            appended = self._appended_messages, self._appended_bytes
        return PutCounts(*appended, self._refused)

    def _refusing(self, answer):
        with self._refused_lock:
            self._refused += 1
        return answer

    def _put(self, messages, kind):
        """The one path of ``put`` and ``put_batch``; ``kind`` (``_Single`` or ``_Batch``) says
        how its messages are prepared, written and answered.

        Refused by the store: answered at once, no hook runs. Else ``before_append``; then
        validation and encoding (a rejection is answered after ``after_append`` saw it);
        then the records go in under the put lock (a segment that cannot be created answers
        CREATE_MAPPED_FILE_FAILED); the flush policy's ``complete_put`` gives the status;
        ``after_append``."""
        refused = self.refusal()
        if refused is not None:
            return self._refusing(kind.refused(*refused))
        if kind.many:
            messages = _Batch.checked(messages)
        hooks = self.hooks
        if hooks.has_before_append:
            hooks.before_append(kind.hook_messages(messages))
        try:
            plan = kind.prepare(self, messages)
        except encoding.Rejected as rej:
            seen, answer = kind.rejected(rej)
            hooks.after_append(seen)
            return self._refusing(answer)
        try:
            end, written = kind.append(self, plan)
        except Refused as exc:
            return self._refusing(kind.refused(PutStatus.CREATE_MAPPED_FILE_FAILED, str(exc)))
        status = self.flush_policy.complete_put(end, plan.wait)
        if self.replicas is not None:
            status = self.replicas.complete_put(end, plan.wait, status)
        if status is PutStatus.PUT_OK and self.role.refusal() is not None:
            status = PutStatus.SERVICE_NOT_AVAILABLE  # fenced meanwhile (NOTE [ Fencing ])
        answer = kind.answer(self, plan, written, status)
        if hooks.has_after_append:
            hooks.after_append(kind.hook_result(self, answer))
        return answer

    def _columns(self, messages, system: bool = False):
        """The batch as columns, each message with its queue id (selected when it has none,
        among its topic's write queues); every check that can refuse the batch comes before
        a topic is created for it. ``system``: the store's own records, queue ids given."""
        if isinstance(messages, MessageBatch):
            cols = columns_from_batch(messages, self.put_ctx)
        else:
            cols = columns_from_messages(messages, self.put_ctx)
        biggest = int(np.argmax(cols.sizes))
        self._check_fits(int(cols.sizes[biggest]), biggest)  # before any topic is created
        if system:
            assert cols.queue_ids is not None and all(map(is_system_topic, set(cols.topics)))
            return cols
        explicit = None if cols.queue_ids is not None else _explicit_ids(messages, cols.n)
        counts = self._write_queues(cols.topics, cols.queue_ids if explicit is None
                                    else (None if isinstance(messages, MessageBatch)
                                          else explicit))
        if cols.queue_ids is None:
            select = self.selector.select
            if counts is None or len(counts) == 1:  # one count for the whole batch
                queues = self.queues_per_topic if counts is None else next(iter(counts.values()))
                cols.queue_ids = np.fromiter(
                    (encoding.check_queue_id(select(m, queues)) if q is None else q
                     for m, q in zip(cols.select_inputs, explicit)),
                    dtype=np.int64, count=cols.n)
            else:
                count_of = counts.__getitem__
                cols.queue_ids = np.fromiter(
                    (encoding.check_queue_id(select(m, count_of(t))) if q is None else q
                     for m, t, q in zip(cols.select_inputs, cols.topics, explicit)),
                    dtype=np.int64, count=cols.n)
        if counts is not None:
            self._check_chosen(cols.topics, cols.queue_ids, counts)
        return cols

    # -- topics (view.topics: docs/topics.md) ----------------------------------------------------
    def _write_queues(self, topics: list[str], queue_ids) -> dict[str, int] | None:
        """Each topic's number of write queues, the topics a put may create created; None
        when the store has no topic configs. A topic or queue id refused, or the topic file
        unusable, rejects the put (``encoding.Rejected``) with nothing written. System
        topics are refused (NO_PERMISSION)."""
        for topic in set(topics):
            if is_system_topic(topic):
                raise encoding.Rejected(PutStatus.NO_PERMISSION,
                                        system_topic_refusal(topic, "send to"),
                                        topics.index(topic))
        try:
            if not self.topics.has_configs():
                return None
            return self.topics.write_queues(_highest_ids(topics, queue_ids))
        except TopicRefused as exc:
            raise encoding.Rejected(exc.status, exc.reason,
                                    _refused_index(topics, queue_ids, exc)) from None
        except (CorruptStateError, OSError) as exc:
            raise encoding.Rejected(PutStatus.SERVICE_NOT_AVAILABLE, str(exc), None) from None

    def _write_queues_of(self, topic: str, queue_id: int | None) -> int | None:
        """``_write_queues`` for one message."""
        if is_system_topic(topic):
            raise encoding.Rejected(PutStatus.NO_PERMISSION,
                                    system_topic_refusal(topic, "send to"), None)
        try:
            return self.topics.write_queues_of(topic, -1 if queue_id is None else queue_id)
        except TopicRefused as exc:
            raise encoding.Rejected(exc.status, exc.reason, None) from None
        except (CorruptStateError, OSError) as exc:
            raise encoding.Rejected(PutStatus.SERVICE_NOT_AVAILABLE, str(exc), None) from None

    def _check_chosen(self, topics: list[str], queue_ids: np.ndarray,
                      counts: dict[str, int]) -> None:
        """A selector's choices are write queues of their topics (ids named were checked)."""
        if len(counts) == 1:
            limit = np.int64(next(iter(counts.values())))
        else:
            limit = np.fromiter(map(counts.__getitem__, topics), dtype=np.int64,
                                count=len(topics))
        bad = np.flatnonzero(queue_ids >= limit)
        if len(bad):
            i = int(bad[0])
            raise self._chosen_wrongly(topics[i], int(queue_ids[i]), counts[topics[i]], i)

    def _chosen_wrongly(self, topic: str, queue_id: int, queues: int,
                        index: int | None) -> encoding.Rejected:
        return encoding.Rejected(
            PutStatus.MESSAGE_ILLEGAL,
            f"queue selector {self.selector_name!r} chose queue_id {queue_id}, not a write "
            f"queue of topic {topic!r}: it has {queues} write queue(s), ids 0..{queues - 1}",
            index)

    def _check_fits(self, size: int, index: int | None) -> None:
        if size > self._limit:
            seg_bytes = self.commit_log.segment_bytes
            raise encoding.Rejected(
                PutStatus.MESSAGE_ILLEGAL,
                f"record of {size} bytes does not fit a commit-log segment of {seg_bytes} "
                f"bytes (at most {self._limit} per record)", index)

    # -- the locked section ------------------------------------------------------------------
    def store_time_in_lock(self) -> int:
        """The store time of the put holding the lock: never earlier than the last one's
        (store times never go backwards in log order, so time search can bisect)."""
        now = self.clock()
        if now < self._last_store_ts:
            now = self._last_store_ts
        self._last_store_ts = self.begin_in_lock = now
        return now

    def _append(self, block_bytes: list[int], keys: list, counts: list[int], messages: int,
                encode, plan=None):
        """Write blocks of the records of ``messages`` messages (one block per segment they
        occupy) under the put lock.

        ``encode(self, plan, segments, queue_offset_bases, now)`` returns the blocks' bytes and
        the first record's commit-log offset; it may raise, and then nothing is written.
        Returns ``(bases, first_phys, now)``.
        """
        log = self.commit_log
        writer = self.writer
        shield.enter()  # NOTE [ Uninterrupted puts ]
        try:
            with self.lock:
                now = self.store_time_in_lock()
                try:
                    table = self.queue_offsets
                    bases = [table.get(k, 0) for k in keys]
                    try:
                        segs = (log.reserve_blocks_locked(block_bytes, writer)
                                if len(block_bytes) > 1
                                else [log.reserve_locked(block_bytes[0], writer)])
                    except (OSError, BlockTooLargeError, PoolExhaustedError) as exc:
                        raise Refused(str(exc)) from None
                    try:
                        records, first = encode(self, plan, segs, bases, now)
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
                    self._appended_messages += messages
                    self._appended_bytes += sum(block_bytes)
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

    # -- a slave's copy of its master's log (``mqstore.replication``) -------------------------
    def append_copy(self, phys_offset: int, data, store_ts: int) -> int:
        """Append a master's records, checked by the caller, at ``phys_offset`` (where this
        log ends) under the put lock, and publish the new end as a put does; returns it.
        ``store_ts``: the store time of the last of them (the checkpoint's)."""
        return self._copy(lambda log: log.append_at_locked(phys_offset, data, self.writer),
                          store_ts)

    def close_copy(self, phys_offset: int) -> int:
        """The master's log has a blank record at ``phys_offset``: its segment ends there."""
        return self._copy(lambda log: log.close_at_locked(phys_offset, self.writer), 0)

    def fill_copy(self, phys_offset: int, data) -> None:
        """The master's bytes in the span a blank record closed, where they are not zeros."""
        with self.lock:
            self.commit_log.fill_closed(phys_offset, data)

    def _copy(self, write, store_ts: int) -> int:
        if self.state.closed:
            raise StoreClosedError(f"store {self.state.root!r} is closed")
        with self.lock:
            end = write(self.commit_log)
            self.last_append = (end, store_ts or self.last_append[1])
        self.appended(end)
        return end


class _Batch:
    """``put_batch``: a list of messages or a ``MessageBatch``, as columns, written as one
    block per commit-log segment it occupies."""

    many = True

    @staticmethod
    def refused(status: PutStatus, reason: str) -> BatchPutResult:
        return BatchPutResult.rejected(status, reason)

    @staticmethod
    def checked(messages):
        if isinstance(messages, MessageBatch):
            return messages
        messages = list(messages)
        if not messages:
            raise ValueError("put_batch needs at least one message")
        return messages

    @staticmethod
    def hook_messages(messages):
        return messages

    @staticmethod
    def prepare(app: Appender, messages):
        return app._columns(messages)

    @staticmethod
    def rejected(rej: encoding.Rejected) -> tuple[BatchPutResult, BatchPutResult]:
        reason = rej.reason if rej.index is None else f"message {rej.index}: {rej.reason}"
        result = BatchPutResult.rejected(rej.status, reason, rej.index)
        return result, result

    @staticmethod
    def append(app: Appender, cols) -> tuple[int, tuple]:
        """The last record's end, and ``(queue offsets, commit-log offsets, store time)``."""
        sizes, qids = cols.sizes, cols.queue_ids
        ends = np.cumsum(sizes)
        blocks = blocks_of(ends, app._limit)
        keys, inverse = queue_keys(cols.topics, qids)
        counts = np.bincount(inverse, minlength=len(keys))
        phys = np.empty(cols.n, dtype=np.int64)
        qoffs = None
        store_host = app.store_host

        def encode(_app, _plan, segs, bases, now):
            nonlocal qoffs
            qoffs = np.asarray(bases, dtype=np.int64)[inverse] + rank_within_group(
                inverse, len(keys))
            records = []
            for (start, stop), seg in zip(blocks, segs):
                base = int(ends[start - 1]) if start else 0
                phys[start:stop] = (seg.start + seg.wrote
                                    + (ends[start:stop] - sizes[start:stop] - base))
                records.append(encode_columns(cols, start, stop, store_host, qids, qoffs,
                                              phys, now))
            return records, int(phys[0])

        block_bytes = [int(ends[stop - 1] - (ends[start - 1] if start else 0))
                       for start, stop in blocks]
        _bases, _first, now = app._append(block_bytes, keys, counts.tolist(), cols.n, encode)
        return int(phys[-1] + sizes[-1]), (qoffs, phys, now)

    @staticmethod
    def answer(app: Appender, cols, written: tuple, status: PutStatus) -> BatchPutResult:
        qoffs, phys, now = written
        return BatchPutResult(status, cols.queue_ids, qoffs, phys, cols.sizes, now,
                              app.store_host)

    @staticmethod
    def hook_result(app: Appender, result: BatchPutResult) -> BatchPutResult:
        return result  # the caller's result itself


class _SystemBatch(_Batch):
    """``put_state``: a batch of the store's own records."""

    @staticmethod
    def prepare(app: Appender, messages):
        return app._columns(messages, system=True)


class ReadOnlyAppender:
    """What a read-only store answers to puts."""

    def __init__(self, state) -> None:
        self.state = state
        self._refused = 0
        self._refused_lock = threading.Lock()

    def _refusal(self) -> str:
        if self.state.closed:
            raise StoreClosedError(f"store {self.state.root!r} is closed")
        with self._refused_lock:
            self._refused += 1
        return "store is open read-only"

    def put(self, message) -> PutResult:
        return PutResult(PutStatus.SERVICE_NOT_AVAILABLE, error=self._refusal())

    def put_batch(self, messages) -> BatchPutResult:
        return BatchPutResult.rejected(PutStatus.SERVICE_NOT_AVAILABLE, self._refusal())

    def put_counts(self) -> PutCounts:
        return PutCounts(0, 0, self._refused)

    def lock_held_ms(self) -> int:
        self._refusal()
        return 0

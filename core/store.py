"""MessageStore: the public facade that wires storage, recovery, dispatch and plugins together.

Threads: any number of callers may put and get concurrently. Appends serialise on one put
lock; the dispatch loop and the flush policy run on their own threads. Reads never take the put
lock.
"""

from __future__ import annotations

import logging
import os
import struct
import threading
import time
from collections import OrderedDict
from typing import Callable, Iterable, Sequence

import numpy as np

from mqstore import appender
from mqstore.config import StoreConfig, load_config, parse_delay_levels
from mqstore.dispatch import DispatchLoop, DispatchThread, TagsCoder
from mqstore.errors import StoreClosedError
from mqstore.filtering import MATCH_ALL
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.format.hosts import parse_host
from mqstore.format.record import offset_msg_id, parse_offset_msg_id
from mqstore.hashing import HASH_JAVA, string_hasher
from mqstore.message import (
    BatchPutResult, GetResult, Message, PutResult, PutStatus, StoredMessage,
)
from mqstore.plugins_manager import PluginHooks, make_plugin_manager
from mqstore.pull import PullLimits, get_messages
from mqstore.recovery import RecoveryReport, recover
from mqstore.storage.checkpoint import (
    Checkpoint, StoreLock, abort_exists, create_abort, read_meta, remove_abort, write_meta,
)
from mqstore.storage.commit_log import BlockTooLargeError, CommitLog
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR, ConsumeQueue
from mqstore.time_search import LOWER, UPPER, offset_by_time, store_time_at

log = logging.getLogger("mqstore.store")

COMMIT_LOG_DIR = "commitlog"
DEFAULT_PHYSICAL_MEMORY = 24 << 30  # RocketMQ's fallback when total RAM is unknown
DISPATCH_CATCH_UP_S = 5.0
FILTER_CACHE_SIZE = 100

# Running flags (spec 9)
NOT_READABLE = 1
NOT_WRITEABLE = 2
WRITE_LOGICS_QUEUE_ERROR = 4
WRITE_INDEX_FILE_ERROR = 8
DISK_FULL = 16
_UNWRITABLE = NOT_WRITEABLE | WRITE_LOGICS_QUEUE_ERROR | WRITE_INDEX_FILE_ERROR | DISK_FULL


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_PHYSICAL_MEMORY


def _check_read_topic(topic: object) -> None:
    # Reads only look topics up (no paths are built), and RocketMQ stores written without a
    # broker may hold topics outside the put-time character rule (e.g. "metrics.cpu").
    if not isinstance(topic, str) or not topic:
        raise ValueError(f"topic {topic!r} must be a non-empty string")


def _system_clock() -> int:
    return time.time_ns() // 1_000_000


class MessageStore:
    """An open store directory. Create with :meth:`open`; close with :meth:`close` or ``with``."""

    # -- opening ---------------------------------------------------------------------------
    @classmethod
    def open(cls, root: str | os.PathLike, config: StoreConfig | None = None, *,
             read_only: bool = False, clock: Callable[[], int] | None = None) -> "MessageStore":
        store = cls.__new__(cls)
        store._open(os.fspath(root), config or load_config(), read_only, clock or _system_clock)
        return store

    def _open(self, root: str, config: StoreConfig, read_only: bool, clock) -> None:
        if not isinstance(config, StoreConfig):
            raise TypeError(f"config must be a StoreConfig (see load_config), got {type(config).__name__}")
        self.root = os.path.abspath(root)
        self.config = config
        self.read_only = read_only
        self.clock = clock
        self.running_flags = 0
        self._closed = True
        self._lock = None
        self._put_lock = threading.Lock()
        self._cq_lock = threading.Lock()
        self._begin_in_lock = 0
        self._last_store_ts = 0
        self._last_append = (0, 0)  # (end offset, store time) of the newest record
        self._filters: OrderedDict = OrderedDict()
        self.consume_queues: dict[tuple[str, int], ConsumeQueue] = {}
        self.dispatch_thread = None
        self.flush_policy = None
        if read_only:
            if not os.path.isdir(self.root):
                raise FileNotFoundError(f"store directory {self.root!r} does not exist")
        else:
            os.makedirs(self.root, exist_ok=True)
            self._lock = StoreLock(self.root)
            self._lock.acquire()
        try:
            self._load(config)
        except BaseException:
            # A failed open leaves the directory as it found it: no threads, no lock.
            if self.dispatch_thread is not None:
                self.dispatch_thread.stop()
            self._release_files()
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            raise
        self._closed = False

    def _load(self, config: StoreConfig) -> None:
        ro = self.read_only
        cl_dir = os.path.join(self.root, COMMIT_LOG_DIR)
        meta = read_meta(self.root)
        if meta is None:
            existing = os.path.isdir(cl_dir) and any(n.isdigit() for n in os.listdir(cl_dir))
            meta = {"format": 1, "hash": HASH_JAVA if existing or ro else config.store.hash}
            if not ro:
                write_meta(self.root, meta)
        self.hash_kind = meta.get("hash", HASH_JAVA)
        self.string_hash = string_hasher(self.hash_kind)
        self.store_host = parse_host(config.store.store_host)
        self._put_ctx = appender.PutContext(self.store_host, config.commit_log.max_message_bytes,
                                            config.commit_log.auto_v2_on_long_topic,
                                            self.store_host.is_v6)
        self._msg_id_prefix = offset_msg_id(self.store_host, 0)[:-16]
        self.delay_levels_ms = parse_delay_levels(config.store.message_delay_levels)

        self.hooks = PluginHooks(make_plugin_manager(
            modules=config.plugins.modules, disable=config.plugins.disable,
            load_entry_points=config.plugins.load_entry_points))

        self.commit_log = CommitLog(cl_dir, None if ro else config.commit_log.segment_bytes,
                                    read_only=ro, on_warning=log.warning)
        notes = self.commit_log.load()
        if self.commit_log.segments.segment_bytes is None:
            self.commit_log.segments.segment_bytes = config.commit_log.segment_bytes
        self._cq_file_bytes = round_file_bytes(config.consume_queue.file_units * CQ_UNIT_SIZE)
        self._load_consume_queues()
        self.checkpoint = Checkpoint(self.root, read_only=ro)
        abnormal = abort_exists(self.root)
        self.recovery_report: RecoveryReport = recover(
            self.commit_log, list(self.consume_queues.values()), self.checkpoint,
            abnormal=abnormal, check_crc=config.commit_log.check_crc_on_recover, read_only=ro)
        self.recovery_report.notes[:0] = notes
        if not self.commit_log.segments.segments:
            self.consume_queues.clear()
        self.flushed_where = self.commit_log.max_offset
        self._last_append = (self.commit_log.max_offset, self.checkpoint.physic_msg_timestamp)
        self._last_store_ts = self.checkpoint.physic_msg_timestamp
        self.physical_memory_bytes = (config.get.physical_memory_bytes
                                      if config.get.physical_memory_bytes is not None
                                      else _physical_memory())
        self._limits = PullLimits(config.get, self.physical_memory_bytes,
                                  config.store.role == "slave" and not config.get.offset_check_in_slave)
        if ro:
            self.running_flags |= NOT_WRITEABLE
            return

        self.writer = self.hooks.writers.get(config.writer.kind)(self.commit_log, config)
        self.selector = self.hooks.queue_selectors.get(config.queue_select.selector)(
            config, self.string_hash)
        self.flush_policy = self.hooks.flush_policies.get(config.flush.mode)(self)
        self.dispatchers = [factory(self) for _name, factory in self.hooks.dispatchers.items()]
        self.dispatch_loop = DispatchLoop(
            self.commit_log, self.dispatchers, TagsCoder(self.string_hash, self.delay_levels_ms),
            self.confirm_offset, self.recovery_report.redispatch_from,
            batch_bytes=config.dispatch.batch_bytes, after_dispatch=self.hooks.after_dispatch)
        # Recovery's re-dispatch runs inline so queue offsets are known before the first put.
        self.dispatch_loop.run_until(self.commit_log.max_offset)
        self._queue_offsets = {key: cq.max_offset for key, cq in self.consume_queues.items()}
        min_phys = self.commit_log.min_offset
        for cq in self.consume_queues.values():
            cq.correct_min_offset(min_phys)
        create_abort(self.root)
        self.dispatch_thread = DispatchThread(self.dispatch_loop, config.dispatch.interval_ms)
        self.dispatch_thread.start()
        self.flush_policy.start()

    def _load_consume_queues(self) -> None:
        base = os.path.join(self.root, CONSUME_QUEUE_DIR)
        if not os.path.isdir(base):
            return
        for topic in sorted(os.listdir(base)):
            tdir = os.path.join(base, topic)
            if not os.path.isdir(tdir):
                continue
            for qname in sorted(os.listdir(tdir)):
                if not qname.isdigit() or not os.path.isdir(os.path.join(tdir, qname)):
                    continue
                cq = ConsumeQueue(self.root, topic, int(qname),
                                  None if self.read_only else self._cq_file_bytes,
                                  read_only=self.read_only, on_warning=log.warning)
                cq.load()
                if cq.segments.segment_bytes is None:
                    cq.segments.segment_bytes = self._cq_file_bytes
                self.consume_queues[(topic, int(qname))] = cq

    # -- positions -------------------------------------------------------------------------
    def confirm_offset(self) -> int:
        """End of what consumers may see: flushed bytes under sync flush, written otherwise."""
        if self.config.flush.mode == "sync":
            return self.flushed_where
        return self.commit_log.max_offset

    @property
    def flushed_offset(self) -> int:
        return self.flushed_where

    def flush_commit_log(self, least_pages: int = 0) -> int:
        """Flush like RocketMQ's MappedFileQueue.flush; returns the flushed offset."""
        end, store_ts = self._last_append
        segs = self.commit_log.segments
        seg = segs.find(self.flushed_where)
        while seg is not None:
            dirty_pages = seg.wrote // 4096 - seg.flushed // 4096
            if seg.is_full() or (least_pages == 0 and seg.wrote > seg.flushed) or (
                    least_pages > 0 and dirty_pages >= least_pages):
                seg.flush()
            self.flushed_where = max(self.flushed_where, seg.start + seg.flushed)
            if not seg.is_full() or seg.flushed < seg.size:
                break
            seg = segs.find(seg.end)
        if self.flushed_where >= end and store_ts:
            self.checkpoint.physic_msg_timestamp = store_ts
        self.hooks.after_flush(self.flushed_where)
        return self.flushed_where

    # -- service checks --------------------------------------------------------------------
    def _service_status(self) -> tuple[PutStatus, str] | None:
        if self._closed:
            return PutStatus.SERVICE_NOT_AVAILABLE, "store is closed"
        if self.read_only:
            return PutStatus.SERVICE_NOT_AVAILABLE, "store is open read-only"
        if self.config.store.role == "slave":
            return PutStatus.SERVICE_NOT_AVAILABLE, "store role is slave"
        if self.running_flags & _UNWRITABLE:
            return PutStatus.SERVICE_NOT_AVAILABLE, f"store is not writable (flags {self.running_flags:#x})"
        if self.dispatch_thread is not None and self.dispatch_thread.exception is not None:
            return PutStatus.SERVICE_NOT_AVAILABLE, self.dispatch_loop.error
        begin = self._begin_in_lock
        if begin:
            held = self.clock() - begin
            if self.config.store.os_page_cache_busy_timeout_ms < held < 10_000_000:
                return PutStatus.OS_PAGE_CACHE_BUSY, f"put lock held for {held} ms"
        return None

    def lock_held_ms(self) -> int:
        """How long the current append has held the put lock (0 when free)."""
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
        key = (p.topic, p.queue_id)
        with self._put_lock:
            now = self._begin_in_lock = self._now_locked()
            try:
                qoff = self._queue_offsets.get(key, 0) if p.queued else 0
                try:
                    seg = self.commit_log.reserve_locked(p.size)
                except OSError as exc:
                    return PutResult(PutStatus.CREATE_MAPPED_FILE_FAILED, error=str(exc))
                phys = seg.start + seg.wrote
                self.writer.write(seg, appender.encode_single(
                    p, self.store_host, p.queue_id, qoff, phys, now))
                if p.queued:
                    self._queue_offsets[key] = qoff + 1
                self._last_append = (phys + p.size, now)
            finally:
                self._begin_in_lock = 0
        status = self.flush_policy.after_append(phys + p.size, p.wait)
        self._wake_dispatch()
        result = PutResult(status, p.queue_id, qoff, phys, p.size,
                           f"{self._msg_id_prefix}{phys:016X}", now)
        if self.hooks.has_after_append:
            self.hooks.after_append(BatchPutResult(
                status, np.array([p.queue_id]), np.array([qoff]), np.array([phys]),
                np.array([p.size]), now, self.store_host))
        return result

    def put_batch(self, messages: Sequence[Message]) -> BatchPutResult:
        """Append many messages (any topics/queues) under one lock.

        Messages of one queue get consecutive offsets. The batch is written as one block per
        commit-log segment: a block that does not fit rolls as a whole; a batch larger than a
        segment is split between messages. A rejected message rejects the whole batch and
        nothing is written.
        """
        refused = self._service_status()
        if refused is not None:
            return BatchPutResult.rejected(refused[0], refused[1])
        messages = list(messages)
        if not messages:
            raise ValueError("put_batch needs at least one message")
        self.hooks.before_append(messages)
        items = []
        for i, msg in enumerate(messages):
            try:
                p = appender.prepare(msg, self._put_ctx)
                if not p.queued or p.sysflag & 0xC:
                    raise appender.Rejected(PutStatus.MESSAGE_ILLEGAL,
                                            "a batch may not hold transaction messages")
                if p.delay:
                    raise appender.Rejected(PutStatus.MESSAGE_ILLEGAL,
                                            "a batch may not hold delayed messages (DELAY > 0)")
            except appender.Rejected as rej:
                result = BatchPutResult.rejected(rej.status, f"message {i}: {rej.reason}", i)
                self.hooks.after_append(result)
                return result
            items.append(p)
        queues = self.config.queue_select.queues_per_topic
        appender.select_queues(items, messages, lambda m: self.selector.select(m, queues))
        n = len(items)
        sizes = np.fromiter((p.size for p in items), dtype=np.int64, count=n)
        qids = np.fromiter((p.queue_id for p in items), dtype=np.int64, count=n)
        qoffs = np.empty(n, dtype=np.int64)
        phys = np.empty(n, dtype=np.int64)
        seg_limit = self.commit_log.segment_bytes - 8
        if int(sizes.max()) > seg_limit:
            i = int(np.argmax(sizes))
            result = BatchPutResult.rejected(
                PutStatus.MESSAGE_ILLEGAL,
                f"message {i}: record of {int(sizes[i])} bytes does not fit a commit-log segment",
                i)
            self.hooks.after_append(result)
            return result
        ends = np.cumsum(sizes)
        with self._put_lock:
            now = self._begin_in_lock = self._now_locked()
            try:
                table = self._queue_offsets
                for i, p in enumerate(items):
                    key = (p.topic, p.queue_id)
                    q = table.get(key, 0)
                    qoffs[i] = q
                    table[key] = q + 1
                start = 0
                while start < n:
                    base = int(ends[start - 1]) if start else 0
                    stop = int(np.searchsorted(ends, base + seg_limit, side="right"))
                    block = int(ends[stop - 1]) - base
                    try:
                        seg = self.commit_log.reserve_locked(block)
                    except (OSError, BlockTooLargeError) as exc:
                        for i, p in enumerate(items):  # give the offsets back
                            table[(p.topic, p.queue_id)] = min(
                                table[(p.topic, p.queue_id)], int(qoffs[i]))
                        return BatchPutResult.rejected(PutStatus.CREATE_MAPPED_FILE_FAILED, str(exc))
                    first_phys = seg.start + seg.wrote
                    phys[start:stop] = first_phys + (ends[start:stop] - sizes[start:stop] - base)
                    self.writer.write(seg, appender.encode_batch(
                        items[start:stop], self.store_host, qids[start:stop], qoffs[start:stop],
                        phys[start:stop], now))
                    start = stop
                self._last_append = (int(phys[-1] + sizes[-1]), now)
            finally:
                self._begin_in_lock = 0
        wait = any(p.wait for p in items)
        status = self.flush_policy.after_append(int(phys[-1] + sizes[-1]), wait)
        self._wake_dispatch()
        result = BatchPutResult(status, qids, qoffs, phys, sizes, now, self.store_host)
        self.hooks.after_append(result)
        return result

    def _wake_dispatch(self) -> None:
        thread = self.dispatch_thread
        if thread is not None and not thread.wake.is_set():
            thread.wake.set()

    # -- dispatch --------------------------------------------------------------------------
    def wait_dispatched(self, timeout: float = 5.0) -> None:
        """Block until the consume queues cover every byte visible to consumers now."""
        if self.read_only or self._closed:
            return
        target = self.confirm_offset()
        if not self.dispatch_loop.wait(target, timeout):
            if self.dispatch_loop.error:
                raise RuntimeError(self.dispatch_loop.error)
            raise TimeoutError(
                f"dispatch reached commit-log offset {self.dispatch_loop.dispatched}, "
                f"not {target}, within {timeout} s")

    def dispatch_behind_bytes(self) -> int:
        return 0 if self.read_only else self.dispatch_loop.behind_bytes()

    def consume_queue(self, topic: str, queue_id: int, create: bool = False) -> ConsumeQueue | None:
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        if cq is None and create:
            with self._cq_lock:
                cq = self.consume_queues.get(key)
                if cq is None:
                    cq = ConsumeQueue(self.root, topic, queue_id, self._cq_file_bytes,
                                      on_warning=log.warning)
                    self.consume_queues[key] = cq
        return cq

    # -- reads -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"store {self.root!r} is closed")

    def _compile_filter(self, expression: str | None, expression_type: str):
        key = (expression_type.upper(), expression)
        flt = self._filters.get(key)
        if flt is None:
            factory = self.hooks.filters.get(expression_type)
            flt = factory(expression, self.string_hash)
            self._filters[key] = flt
            if len(self._filters) > FILTER_CACHE_SIZE:
                self._filters.popitem(last=False)
        else:
            self._filters.move_to_end(key)
        return flt

    def get(self, group: str, topic: str, queue_id: int, offset: int, max_msgs: int = 32, *,
            expression: str | None = None, expression_type: str = "TAG",
            max_total_bytes: int | None = None) -> GetResult | None:
        """Pull up to ``max_msgs`` messages of ``topic``/``queue_id`` from queue ``offset``.

        Returns None when the store is closed (RocketMQ's null result).
        """
        if self._closed or self.running_flags & NOT_READABLE:
            return None
        if not isinstance(group, str):
            raise ValueError(f"group {group!r} must be a string")
        _check_read_topic(topic)
        appender.check_queue_id(queue_id)
        if isinstance(offset, bool) or not isinstance(offset, (int, np.integer)):
            raise ValueError(f"offset {offset!r} must be an int")
        if isinstance(max_msgs, bool) or not isinstance(max_msgs, int) or max_msgs < 0:
            raise ValueError(f"max_msgs {max_msgs!r} must be an int >= 0")
        flt = MATCH_ALL if expression is None else self._compile_filter(expression, expression_type)
        return get_messages(self, self.consume_queues.get((topic, queue_id)), int(offset),
                            max_msgs, flt, self._limits, max_total_bytes)

    def decode_message(self, raw) -> StoredMessage | None:
        try:
            return StoredMessage.from_bytes(bytes(raw))
        except (ValueError, IndexError, struct.error):
            return None

    def message_at(self, phys_offset: int) -> StoredMessage | None:
        """The message whose record starts at ``phys_offset``, or None."""
        self._check_open()
        head = self.commit_log.read(phys_offset, 4)
        if head is None:
            return None
        size = int.from_bytes(head, "big", signed=True)
        raw = self.commit_log.read(phys_offset, size) if size > 0 else None
        if raw is None:
            return None
        msg = self.decode_message(raw)
        return msg if msg is not None and msg.phys_offset == phys_offset else None

    def message_by_id(self, msg_id: str) -> StoredMessage | None:
        host, offset = parse_offset_msg_id(msg_id)
        msg = self.message_at(offset)
        return msg if msg is not None and msg.record.store_host == host else None

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int,
                       boundary: str = LOWER) -> int:
        self._check_open()
        _check_read_topic(topic)
        appender.check_queue_id(queue_id)
        if boundary not in (LOWER, UPPER):
            raise ValueError(f"boundary {boundary!r} must be 'lower' or 'upper'")
        return offset_by_time(self.commit_log, self.consume_queues.get((topic, queue_id)),
                              int(timestamp_ms), boundary)

    def min_offset(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        return cq.min_offset if cq is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        return cq.max_offset if cq is not None else 0

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        cq = self.consume_queues.get((topic, queue_id))
        if cq is None or cq.max_offset == cq.min_offset:
            return -1
        seg = cq.segments.find(cq.min_logic_offset)
        unit = cq.units_of(seg)[(cq.min_logic_offset - seg.start) // CQ_UNIT_SIZE]
        return store_time_at(self.commit_log, int(unit["phys_offset"]))

    def topics(self) -> list[str]:
        return sorted({t for t, _q in self.consume_queues})

    def queue_ids(self, topic: str) -> list[int]:
        return sorted(q for t, q in self.consume_queues if t == topic)

    @property
    def min_phys_offset(self) -> int:
        return self.commit_log.min_offset

    @property
    def max_phys_offset(self) -> int:
        return self.commit_log.max_offset

    # -- cleanup ---------------------------------------------------------------------------
    def delete_expired_segments(self, reserved_ms: int = 0, *, force: bool = False,
                                max_segments: int = 10) -> list[str]:
        """Delete the oldest commit-log segments, never the newest one.

        A segment goes when its file is older than ``reserved_ms`` (by file mtime and the
        wall clock) or ``force`` is set; deletion stops at the first segment that must stay, so
        it never skips one. Consume queues then drop files wholly below the new minimum and
        raise their min offsets. Returns the deleted paths.
        """
        self._check_open()
        if self.read_only:
            raise PermissionError(f"store {self.root!r} is open read-only")
        if reserved_ms < 0 or max_segments < 0:
            raise ValueError(f"reserved_ms {reserved_ms} and max_segments {max_segments} must be >= 0")
        now_ms = time.time() * 1000
        with self._put_lock:
            segs = self.commit_log.segments.segments
            count = 0
            for seg in segs[:-1][:max_segments]:
                if not force and os.path.getmtime(seg.path) * 1000 + reserved_ms > now_ms:
                    break
                count += 1
            removed = self.commit_log.segments.drop_first(count)
        if removed:
            min_phys = self.commit_log.min_offset
            for cq in list(self.consume_queues.values()):
                removed += cq.delete_files_below(min_phys)
                cq.correct_min_offset(min_phys)
        return removed

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # puts now answer SERVICE_NOT_AVAILABLE
        clean = False
        try:
            if not self.read_only:
                with self._put_lock:
                    pass  # let an in-flight append finish
                self.flush_policy.stop()
                try:
                    self.dispatch_loop.wait(self.confirm_offset(), DISPATCH_CATCH_UP_S)
                finally:
                    self.dispatch_thread.stop()
                for cq in self.consume_queues.values():
                    cq.flush()
                for dispatcher in self.dispatchers:
                    dispatcher.close()
                clean = (not self.running_flags & _UNWRITABLE
                         and self.dispatch_loop.behind_bytes() == 0
                         and self.dispatch_thread.exception is None)
        finally:
            self._release_files()
            if clean:
                remove_abort(self.root)
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _release_files(self) -> None:
        for part in ("checkpoint", "commit_log"):
            obj = getattr(self, part, None)
            if obj is not None:
                obj.close()
        for cq in getattr(self, "consume_queues", {}).values():
            cq.close()

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.read_only else "open")
        return f"MessageStore({self.root!r}, {state})"

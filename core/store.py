"""MessageStore: the public facade that wires storage, recovery, dispatch and plugins together.

Threads: any number of callers may put and get concurrently. Appends serialise on one put
lock; the dispatch loop and the flush policy run on their own threads. Reads never take the put
lock.
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util  # noqa: F401 - registers its exit handler before ours (see below)
import os
import threading
import time
import warnings
import weakref
from collections import OrderedDict
from typing import Callable

from mqstore import appender
from mqstore.config import StoreConfig, load_config, parse_delay_levels
from mqstore.errors import WorkerError
from mqstore.dispatch import DispatchLoop, DispatchThread, TagsCoder
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.format.hosts import parse_host
from mqstore.format.record import offset_msg_id
from mqstore.hashing import string_hasher
from mqstore.plugins_manager import PluginHooks, make_plugin_manager
from mqstore.pull import PullLimits
from mqstore.recovery import RecoveryReport, mend_range, recover
from mqstore.storage.checkpoint import (
    Checkpoint, StoreLock, abort_exists, create_abort, remove_abort,
)
from mqstore.storage.consume_queue import ConsumeQueue, load_consume_queues
from mqstore.storage.queue_manifest import ManifestKeeper, read_manifest
from mqstore.storage.shared_segment import store_segment_name, unlink_segment
from mqstore.storage.transient_pool import POOL_SEGMENT, salvage
from mqstore.storage.cq_ext import open_ext
from mqstore.store_meta import load_meta, settle_meta
from mqstore.subscriptions import Subscriptions
from mqstore.uninterrupted import shield
from mqstore.storage.commit_log import CommitLog
from mqstore.store_put import (  # noqa: F401 - flags are part of the store's API
    DISK_FULL, NOT_READABLE, NOT_WRITEABLE, UNWRITABLE, WRITE_INDEX_FILE_ERROR,
    WRITE_LOGICS_QUEUE_ERROR, PutMixin,
)
from mqstore.store_read import ReadMixin
from mqstore.workers import shm
from mqstore.workers.flush_client import FlushClient
from mqstore.workers.supervisor import DISPATCH_CATCH_UP_S, DispatchSupervisor

log = logging.getLogger("mqstore.store")

COMMIT_LOG_DIR = "commitlog"
DEFAULT_PHYSICAL_MEMORY = 24 << 30  # RocketMQ's fallback when total RAM is unknown

# Stores still open at interpreter exit are closed before multiprocessing's own exit handler
# terminates their workers (atexit runs handlers last registered first, and importing
# multiprocessing.util registers that one).
_open_stores: "weakref.WeakSet[MessageStore]" = weakref.WeakSet()


def _close_open_stores() -> None:
    for store in list(_open_stores):
        try:
            store.close()
        except Exception:
            log.exception("closing store %s at exit failed", store.root)


atexit.register(_close_open_stores)


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_PHYSICAL_MEMORY


def _system_clock() -> int:
    return time.time_ns() // 1_000_000


class MessageStore(PutMixin, ReadMixin):
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
        # What the store's own parts and plugins hold: a weak proxy, so that no reference
        # cycle runs through the store and a program that drops it has it closed at once
        # (see __del__) with every part still intact.
        self._view = weakref.proxy(self)
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
        self.consume_queue_exts: dict = {}
        self.dispatch_thread = None
        self.flush_policy = None
        self.dispatchers = []
        self.dispatch_role = "writer"
        self.positions = None  # shared with the dispatch and flush loops (writable stores)
        self.supervisor = None  # the dispatch worker's (process mode)
        self.flush_client = None
        self.writer = None
        self._visible_after_flush = False
        self._staged_writes = False
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
            if self.flush_client is not None:
                self.flush_client.stop()
            if self.dispatch_thread is not None:
                self.dispatch_thread.stop()
            if self.supervisor is not None:
                self.supervisor.stop()
            if self.positions is not None:
                self.positions.close()
            self._release_files()
            if self._lock is not None:
                self._lock.release()
                self._lock = None
            raise
        self._closed = False
        _open_stores.add(self)
        if not read_only:
            shield.install()  # NOTE [ Uninterrupted puts ]

    def _load(self, config: StoreConfig) -> None:
        ro = self.read_only
        cl_dir = os.path.join(self.root, COMMIT_LOG_DIR)
        meta, meta_problem = load_meta(self.root)
        self.store_host = parse_host(config.store.store_host)
        self._put_ctx = appender.PutContext(self.store_host, config.commit_log.max_message_bytes,
                                            config.commit_log.auto_v2_on_long_topic,
                                            self.store_host.is_v6)
        self._msg_id_prefix = offset_msg_id(self.store_host, 0)[:-16]
        self.delay_levels_ms = parse_delay_levels(config.store.message_delay_levels)

        self.hooks = PluginHooks(make_plugin_manager(
            modules=config.plugins.modules, disable=config.plugins.disable,
            load_entry_points=config.plugins.load_entry_points))

        # Sizes the store was written with win over the configured ones, which apply to new
        # stores; a read-only store with no segment yet learns the size from the first one.
        self.commit_log = CommitLog(cl_dir, None if ro else config.commit_log.segment_bytes,
                                    read_only=ro, on_warning=log.warning,
                                    known_bytes=meta.get("commit_log_segment_bytes"))
        notes = self.commit_log.load()
        if not ro:
            # A killed store leaves its shared memory behind: its transient pool may hold
            # acknowledged records its files lack (see NOTE [ Shutdown ]); reclaim both.
            notes += salvage(store_segment_name(self.root, POOL_SEGMENT), self.commit_log.segments)
            unlink_segment(store_segment_name(self.root, shm.POSITIONS_SEGMENT))
        self._cq_file_bytes = meta.get("consume_queue_file_bytes") or round_file_bytes(
            config.consume_queue.file_units * CQ_UNIT_SIZE)
        self.consume_queues.update(load_consume_queues(
            self.root, self._cq_file_bytes, read_only=ro, on_warning=log.warning, notes=notes,
            known_bytes=meta.get("consume_queue_file_bytes")))
        meta = settle_meta(self.root, meta, meta_problem, commit_log=self.commit_log,
                           consume_queues=self.consume_queues.values(),
                           configured_hash=config.store.hash,
                           configured_cq_bytes=self._cq_file_bytes, read_only=ro, notes=notes)
        self._cq_file_bytes = meta["consume_queue_file_bytes"]
        self.hash_kind = meta["hash"]
        self.string_hash = string_hasher(self.hash_kind)
        self.checkpoint = Checkpoint(self.root, read_only=ro)
        self.subscriptions = Subscriptions(self.root)
        abnormal = abort_exists(self.root)
        known_queues, manifest_problem = read_manifest(self.root)
        self._manifest = ManifestKeeper(self.root)
        if manifest_problem:
            notes.append(manifest_problem)
        self.recovery_report: RecoveryReport = recover(
            self.commit_log, list(self.consume_queues.values()), self.checkpoint,
            abnormal=abnormal, check_crc=config.commit_log.check_crc_on_recover, read_only=ro,
            known_queues=known_queues)
        self.recovery_report.notes[:0] = notes
        if not self.commit_log.segments.segments:
            self.consume_queues.clear()
        if not ro:
            # What recovery kept or mended is on disk before anything new is acknowledged.
            for seg in self.commit_log.segments.segments:
                if seg.end > self.recovery_report.scan_from:
                    seg.force()
            self.checkpoint.confirm_phy_offset = self.commit_log.max_offset
        self.flushed_where = self.commit_log.max_offset
        self._last_append = (self.commit_log.max_offset, self.checkpoint.physic_msg_timestamp)
        self._last_store_ts = self.checkpoint.physic_msg_timestamp
        self.physical_memory_bytes = (config.get.physical_memory_bytes
                                      if config.get.physical_memory_bytes is not None
                                      else _physical_memory())
        self._limits = PullLimits(config.get, self.physical_memory_bytes,
                                  config.store.role == "slave" and not config.get.offset_check_in_slave)
        self._closed = False  # dispatchers may read messages while they load
        self.dispatchers = [d for d in (factory(self._view) for _n, factory
                                        in self.hooks.dispatchers.items()) if d is not None]
        self._closed = True
        if ro:
            self.running_flags |= NOT_WRITEABLE
            return

        self.writer = self.hooks.writers.get(config.writer.kind)(self.commit_log, config)
        self.selector = self.hooks.queue_selectors.get(config.queue_select.selector)(
            config, self.string_hash)
        self.flush_policy = self.hooks.flush_policies.get(config.flush.mode)(self._view)
        self._visible_after_flush = bool(getattr(self.flush_policy, "visible_after_flush", False))
        self._staged_writes = getattr(self.writer, "pool", None) is not None
        resume = [d.resume_offset() for d in self.dispatchers if hasattr(d, "resume_offset")]
        start = max(min([self.recovery_report.redispatch_from, *resume]),
                    self.commit_log.min_offset)
        if start < self.recovery_report.scan_from:
            mend_range(self.commit_log, start, self.recovery_report.scan_from,
                       check_crc=config.commit_log.check_crc_on_recover, read_only=False,
                       report=self.recovery_report)
        self.dispatch_loop = DispatchLoop(
            self.commit_log, self.dispatchers, TagsCoder(self.string_hash, self.delay_levels_ms),
            lambda view=self._view: view.confirm_offset(), start,
            batch_bytes=config.dispatch.batch_bytes,
            after_dispatch=lambda batch, view=self._view: view._after_dispatch(batch))
        # Recovery's re-dispatch runs inline so queue offsets are known before the first put.
        began = time.perf_counter()
        self.dispatch_loop.run_until(self.commit_log.max_offset)
        self.recovery_report.redispatch_bytes = self.commit_log.max_offset - start
        self.recovery_report.redispatch_seconds = time.perf_counter() - began
        self._queue_offsets = {key: cq.max_offset for key, cq in self.consume_queues.items()}
        min_phys = self.commit_log.min_offset
        for cq in self.consume_queues.values():
            cq.correct_min_offset(min_phys)
        create_abort(self.root)
        p = self.positions = shm.SharedPositions(
            store_segment_name(self.root, shm.POSITIONS_SEGMENT), create=True)
        end = self.commit_log.max_offset
        p[shm.WRITTEN] = p[shm.COMMITTED] = p[shm.FLUSHED] = end
        p[shm.CONFIRMED] = self.confirm_offset()
        p[shm.DISPATCHED] = self.dispatch_loop.dispatched
        p[shm.MIN_PHYS] = max(self.commit_log.min_offset, 0)
        p[shm.ABNORMAL] = int(self.recovery_report.abnormal)
        p[shm.LOGICS_TS] = self.checkpoint.logics_msg_timestamp
        p[shm.INDEX_TS] = self.checkpoint.index_msg_timestamp
        if config.dispatch.mode == "process":
            self._start_dispatch_worker()
        else:
            self.dispatch_thread = DispatchThread(self.dispatch_loop, config.dispatch.interval_ms)
            self.dispatch_thread.start()
        self.flush_client = FlushClient(self._view, p, getattr(self.writer, "pool", None))
        self.flush_client.start()
        self.writer.wake_committer = lambda view=self._view: view._wake_committer()
        self.flush_policy.start()

    def _after_dispatch(self, batch) -> None:
        self._manifest.write_marked(self.consume_queues)  # new queues, once they hold units
        self.hooks.after_dispatch(batch)

    def _start_dispatch_worker(self) -> None:
        """Hand dispatch to a worker process: it owns consume queues and dispatcher files from
        here on; this process follows what it publishes (see NOTE [ Shutdown ])."""
        for d in self.dispatchers:
            d.close()
        self.dispatch_role = "follower"
        self._closed = False  # dispatchers may read messages while they load
        self.dispatchers = [d for d in (f(self._view) for _n, f in self.hooks.dispatchers.items())
                            if d is not None]
        self._closed = True
        self.supervisor = DispatchSupervisor(self.root, self.config, self.positions)
        self.supervisor.start()

    # -- positions -------------------------------------------------------------------------
    def confirm_offset(self) -> int:
        """End of what consumers may see: flushed bytes when the flush policy says so
        (sync flush), written bytes otherwise."""
        if self._visible_after_flush:
            return self.flushed_where
        return self.commit_log.max_offset

    def flush_metadata(self) -> None:
        """Persist consume queues and the checkpoint (flush policies call this every second),
        so an abnormal recovery can start near the end instead of at the first segment."""
        if self.supervisor is not None:  # the dispatch worker owns and flushes the queues
            self.checkpoint.logics_msg_timestamp = self.positions[shm.LOGICS_TS]
            self.checkpoint.index_msg_timestamp = self.positions[shm.INDEX_TS]
            self.checkpoint.flush()
            return
        logics = self.checkpoint.logics_msg_timestamp
        for cq in list(self.consume_queues.values()):
            cq.flush()
        self._manifest.update(self.consume_queues)
        self.checkpoint.flush(logics_msg_timestamp=logics)

    @property
    def flushed_offset(self) -> int:
        self._check_open()
        return self.flushed_where

    # -- dispatch --------------------------------------------------------------------------
    def wait_dispatched(self, timeout: float = 5.0) -> None:
        """Block until the consume queues cover every byte visible to consumers now (with the
        transient pool: every byte appended now, once the flush loop has committed it).

        Raises WorkerError once for each dispatch-worker failure (the worker was restarted),
        TimeoutError when dispatch does not get there in time."""
        self._check_open()
        if self.read_only:
            return
        if self._staged_writes and not self._visible_after_flush:
            self.flush_client.commit_now()
        target = self.confirm_offset()
        if self.supervisor is not None:
            self._wake_dispatch()
            failure = self.supervisor.take_failure()
            if failure is not None:
                raise WorkerError(failure)
            if self.supervisor.wait_dispatched(target, timeout):
                return
            failure = self.supervisor.take_failure()
            if failure is not None:
                raise WorkerError(failure)
            reached = self.positions[shm.DISPATCHED]
        elif self.dispatch_loop.wait(target, timeout):
            return
        else:
            if self.dispatch_loop.error:
                raise RuntimeError(self.dispatch_loop.error)
            reached = self.dispatch_loop.dispatched
        stuck = self._loops_failing()
        raise TimeoutError(
            f"dispatch reached commit-log offset {reached}, not {target}, within {timeout} s"
            + (f": {stuck}" if stuck else ""))

    def dispatch_behind_bytes(self) -> int:
        self._check_open()
        if self.read_only:
            return 0
        if self.supervisor is not None:
            return max(0, self.confirm_offset() - self.positions[shm.DISPATCHED])
        return self.dispatch_loop.behind_bytes()

    def worker_status(self) -> dict:
        """The dispatch worker as the supervisor sees it (process mode)."""
        self._check_open()
        sup = self.supervisor
        if sup is None:
            return {"mode": self.config.dispatch.mode, "alive": self.dispatch_thread is not None
                    and self.dispatch_thread.is_alive(), "failing": self._loops_failing()}
        return {"mode": "process", "alive": sup.alive(), "pid": sup.process.pid,
                "restarts": sup.restarts, "failures": list(sup.failures),
                "dispatched": self.positions[shm.DISPATCHED], "failing": self._loops_failing(),
                "gave_up": sup.gave_up is not None}

    def consume_queue_ext(self, topic: str, queue_id: int, create: bool = False):
        """The consume-queue extension of a queue (filter bitmaps), loaded on first use."""
        key = (topic, queue_id)
        ext = self.consume_queue_exts.get(key)
        if ext is None:
            with self._cq_lock:
                ext = self.consume_queue_exts.get(key)
                if ext is None:
                    ext = open_ext(self.root, topic, queue_id, self.config.consume_queue.ext_file_bytes,
                                   read_only=self.read_only or self.dispatch_role == "follower",
                                   create=create)
                    if ext is not None:
                        self.consume_queue_exts[key] = ext
        return ext

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
                    self._manifest.mark()
        return cq

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
            if count:
                # Queues stop offering the units first, then the records go: a reader never
                # sees a min offset whose record was already deleted.
                for cq in list(self.consume_queues.values()):
                    cq.correct_min_offset(segs[count].start)
            removed = self.commit_log.segments.drop_first(count)
        if removed:
            min_phys = self.commit_log.min_offset
            for cq in list(self.consume_queues.values()):
                removed += cq.delete_files_below(min_phys)
            for dispatcher in self.dispatchers:
                if hasattr(dispatcher, "after_cleanup"):
                    removed += dispatcher.after_cleanup(min_phys)
            if self.positions is not None:  # the worker drops its dispatchers' old files
                self.positions[shm.MIN_PHYS] = min_phys
            self.hooks.after_cleanup(min_phys)
        return removed

    def _run_cleanup(self, at_once: bool) -> None:
        """Carry out the flush worker's cleanup decision (spec 10.10)."""
        if self._closed:
            return
        cfg = self.config.cleanup
        removed = self.delete_expired_segments(int(cfg.file_reserved_hours * 3_600_000),
                                               force=at_once, max_segments=cfg.max_segments_per_run)
        if removed:
            log.info("cleanup removed %d file(s); commit log now starts at %d%s", len(removed),
                     self.commit_log.min_offset, " (disk too full: oldest first)" if at_once else "")

    def _apply_disk_state(self, full: bool) -> None:
        if full and not self.running_flags & DISK_FULL:
            log.error("disk of %s is over %d%% used: puts refused until cleanup frees space",
                      self.root, self.config.cleanup.disk_warning_ratio)
            self.running_flags |= DISK_FULL
        elif not full and self.running_flags & DISK_FULL:
            self.running_flags &= ~DISK_FULL

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._closed:
            return
        self._closed = True  # every call now raises StoreClosedError
        _open_stores.discard(self)
        clean = False
        try:
            if not self.read_only:
                with self._put_lock:
                    pass  # let an in-flight append finish
                self.flush_policy.stop()
                self.flush_client.stop()  # final commit and flush; the loop is gone after
                if self.supervisor is not None:
                    self._stop_dispatch_worker()
                    lag = self.confirm_offset() - self.positions[shm.DISPATCHED]
                    healthy = self._loops_failing() is None
                else:
                    try:
                        if self.dispatch_thread.is_alive():
                            self.dispatch_loop.wait(self.confirm_offset(), DISPATCH_CATCH_UP_S)
                    finally:
                        self.dispatch_thread.stop()
                    # Whatever the thread left (it ends early when the store was dropped).
                    self.dispatch_loop.run_until(self.confirm_offset())
                    lag = self.dispatch_loop.behind_bytes()
                    healthy = self.dispatch_thread.exception is None
                    for cq in self.consume_queues.values():
                        cq.flush()
                    self._manifest.update(self.consume_queues, final=True)
                self.flush_metadata()
                clean = (not self.running_flags & (UNWRITABLE & ~DISK_FULL) and lag == 0 and healthy
                         and self.flushed_where >= self._last_append[0])
        finally:
            self._release_files()
            if self.positions is not None:
                self.positions.close()
            if clean:
                remove_abort(self.root)
            if not self.read_only:
                shield.uninstall()
            if self._lock is not None:
                self._lock.release()
                self._lock = None

    def _stop_dispatch_worker(self) -> None:
        self._wake_dispatch()
        self.supervisor.wait_dispatched(self.confirm_offset(), DISPATCH_CATCH_UP_S)
        self.supervisor.stop()

    def _release_files(self) -> None:
        for dispatcher in getattr(self, "dispatchers", ()):
            dispatcher.close()
        self.dispatchers = []
        for ext in getattr(self, "consume_queue_exts", {}).values():
            ext.close()
        pool = getattr(getattr(self, "writer", None), "pool", None)
        if pool is not None and not self._pool_drained():
            # Acknowledged records may still be only in the pool (a close cut short, the
            # flush loop failing): it stays for the next open to write back (salvage).
            pool.keep_on_close = True
        writer_close = getattr(getattr(self, "writer", None), "close", None)
        if writer_close is not None:  # after the flush loop is gone: it reads the pool
            writer_close()
        for part in ("checkpoint", "commit_log"):
            obj = getattr(self, part, None)
            if obj is not None:
                obj.close()
        for cq in getattr(self, "consume_queues", {}).values():
            cq.close()

    def _pool_drained(self) -> bool:
        p = self.positions
        return p is None or p.values is None or p[shm.COMMITTED] >= self._last_append[0]

    def __del__(self) -> None:
        # A store its program dropped without closing is closed as a file would be: its
        # lock, workers and shared memory must not outlive it.
        if getattr(self, "_closed", True):
            return
        warnings.warn(f"store {self.root!r} was never closed; closing it now", ResourceWarning,
                      source=self)
        try:
            self.close()
        except Exception:
            log.exception("closing the dropped store %s failed", self.root)

    def __enter__(self) -> "MessageStore":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("read-only" if self.read_only else "open")
        return f"MessageStore({self.root!r}, {state})"

"""MessageStore: the public facade over one open store directory.

Opening wires the parts together (``_Opener``); afterwards the facade only delegates:

    Appender   put, put_batch: the put lock, the queue-offset table, the writer
    Reader     pulls and lookups (reads never take the put lock)
    Runtime    the dispatch, flush and cleanup loops of a writable store, and their channels

Threads: any number of callers may put and get concurrently. No reference cycle runs through
the facade: a store its program drops is closed at once (``__del__``).
"""

from __future__ import annotations

import atexit
import logging
import multiprocessing.util  # noqa: F401 - registers its exit handler before ours (see below)
import os
import warnings
import weakref
from typing import Callable

from mqstore import appender
from mqstore.appending import Appender, ReadOnlyAppender
from mqstore.clock import system_clock
from mqstore.config import StoreConfig, load_config
from mqstore.contracts import FOLLOWER, READER, WRITER, WriterContext
from mqstore.dispatchers import Dispatchers
from mqstore.errors import StoreClosedError, WorkerError  # noqa: F401 - re-exported
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.format.hosts import parse_host
from mqstore.plugins_manager import PluginHooks, make_plugin_manager
from mqstore.pull import PullLimits
from mqstore.reading import Reader
from mqstore.recovery import RecoveryReport, mend_range, recover
from mqstore.running_flags import (  # noqa: F401 - flags are part of the store's API
    DISK_FULL, NOT_READABLE, NOT_WRITEABLE, UNWRITABLE, WRITE_INDEX_FILE_ERROR,
    WRITE_LOGICS_QUEUE_ERROR, StoreState,
)
from mqstore.runtime import Runtime
from mqstore.storage.checkpoint import (
    Checkpoint, StoreLock, abort_exists, create_abort, remove_abort,
)
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.consume_queue import load_consume_queues
from mqstore.storage.queue_manifest import ManifestKeeper, read_manifest
from mqstore.storage.shared_segment import store_segment_name, unlink_segment
from mqstore.storage.transient_pool import POOL_SEGMENT, salvage
from mqstore.store_meta import load_meta, settle_meta
from mqstore.store_view import DirectoryView
from mqstore.uninterrupted import shield
from mqstore.workers import shm

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


class MessageStore:
    """An open store directory. Create with :meth:`open`; close with :meth:`close` or ``with``."""

    @classmethod
    def open(cls, root: str | os.PathLike, config: StoreConfig | None = None, *,
             read_only: bool = False, clock: Callable[[], int] | None = None) -> "MessageStore":
        if config is not None and not isinstance(config, StoreConfig):
            raise TypeError(f"config must be a StoreConfig (see load_config), got {type(config).__name__}")
        store = cls.__new__(cls)
        store._state = StoreState(os.path.abspath(os.fspath(root)), read_only)
        store._runtime = store._lock = None
        _Opener(store, config or load_config(), clock or system_clock).open()
        _open_stores.add(store)
        if not read_only:
            shield.install()  # NOTE [ Uninterrupted puts ]
        return store

    # -- state -----------------------------------------------------------------------------
    @property
    def root(self) -> str:
        return self._state.root

    @property
    def read_only(self) -> bool:
        return self._state.read_only

    @property
    def running_flags(self) -> int:
        return self._state.running_flags

    @running_flags.setter
    def running_flags(self, value: int) -> None:
        self._state.running_flags = value

    def _check_open(self) -> None:
        if self._state.closed:
            raise StoreClosedError(f"store {self.root!r} is closed")

    # -- writing ---------------------------------------------------------------------------
    def put(self, message):
        """Append one message. Bad arguments raise ValueError; store-level refusals return a
        status (``PutResult``)."""
        return self._appender.put(message)

    def put_batch(self, messages):
        """Append many messages (any topics/queues) under one lock.

        ``messages`` is a list of Message objects or a columnar ``MessageBatch`` (faster: no
        per-message objects). Messages of one queue get consecutive offsets. The batch is
        written as one block per commit-log segment: a block that does not fit rolls as a
        whole; a batch larger than a segment is split between messages. A rejected message
        rejects the whole batch and nothing is written.
        """
        return self._appender.put_batch(messages)

    def lock_held_ms(self) -> int:
        """How long the current append has held the put lock (0 when free)."""
        self._check_open()
        return self._appender.lock_held_ms()

    def flush_commit_log(self, least_pages: int = 0) -> int:
        """One flush pass now, as RocketMQ's MappedFileQueue.flush(least_pages), after
        committing everything staged in the transient pool; returns the flushed offset."""
        runtime = self._writable()
        failure = runtime.flush_client.take_failure()
        if failure is not None:
            raise WorkerError(failure)
        return runtime.flush_client.flush_now(least_pages)

    @property
    def flushed_offset(self) -> int:
        self._check_open()
        return self._runtime.flushed_where if self._runtime is not None else self.max_phys_offset

    def confirm_offset(self) -> int:
        """End of what consumers may see (RocketMQ's confirm offset)."""
        self._check_open()
        return self._runtime.confirm_offset() if self._runtime else self.commit_log.max_offset

    def _writable(self) -> Runtime:
        self._check_open()
        if self._runtime is None:
            raise PermissionError(f"store {self.root!r} is open read-only")
        return self._runtime

    # -- dispatch --------------------------------------------------------------------------
    def wait_dispatched(self, timeout: float = 5.0) -> None:
        """Block until the consume queues cover every byte visible to consumers now (with the
        transient pool: every byte appended now, once the flush loop has committed it).

        Raises WorkerError once for each dispatch-worker failure (the worker was restarted),
        TimeoutError when dispatch does not get there in time."""
        self._check_open()
        if self._runtime is not None:
            self._runtime.wait_dispatched(timeout)

    def dispatch_behind_bytes(self) -> int:
        self._check_open()
        if self._runtime is None:
            return 0
        return max(0, self._runtime.confirm_offset() - self._runtime.dispatched())

    def worker_status(self) -> dict:
        """The dispatch loop as the store sees it (pid, restarts, failures in process mode)."""
        return self._writable().worker_status()

    def flush_metadata(self) -> None:
        """Persist consume queues and the checkpoint now (the store does it every second)."""
        self._writable().flush_metadata()

    def consume_queue(self, topic: str, queue_id: int, create: bool = False):
        """The consume queue of ``topic``/``queue_id`` in this process (None if it has none)."""
        self._check_open()
        return self.view.consume_queue(topic, queue_id, create)

    @property
    def flush_client(self):
        return self._runtime.flush_client if self._runtime is not None else None

    @property
    def writer(self):
        return self._runtime.writer if self._runtime is not None else None

    @property
    def supervisor(self):
        """The dispatch worker's supervisor (``dispatch.worker: process``), or None."""
        return self._runtime.supervisor if self._runtime is not None else None

    @property
    def channels(self) -> shm.Channels | None:
        return self._runtime.channels if self._runtime is not None else None

    # -- cleanup ---------------------------------------------------------------------------
    def delete_expired_segments(self, reserved_ms: int = 0, *, force: bool = False,
                                max_segments: int = 10) -> list[str]:
        """Delete the oldest commit-log segments, never the newest one.

        A segment goes when its newest record is older than ``reserved_ms`` on the store
        clock (0: whatever its age), or with ``force``; deletion stops at the first segment that must stay, so it
        never skips one. The consume queues and the dispatchers' files below the new minimum
        are dropped before this returns (by the dispatch loop's process; see
        ``mqstore.cleanup``). Returns the deleted segment paths.
        """
        runtime = self._writable()
        if reserved_ms < 0 or max_segments < 0:
            raise ValueError(f"reserved_ms {reserved_ms} and max_segments {max_segments} must be >= 0")
        return runtime.delete_expired(0 if force else reserved_ms, max_segments)

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        state = self._state
        if state.closed:
            return
        state.closed = True  # every call now raises StoreClosedError
        _open_stores.discard(self)
        clean = False
        runtime = self._runtime
        try:
            if runtime is not None:
                with self._appender.lock:
                    pass  # let an in-flight append finish
                last_end = self._appender.last_append[0]
                caught_up = runtime.stop(last_end)
                clean = caught_up and not state.running_flags & (UNWRITABLE & ~DISK_FULL)
        finally:
            self._release_files()
            if clean:
                remove_abort(self.root)
            if runtime is not None:
                shield.uninstall()
            self._unlock()

    def _crash(self) -> None:
        """End abruptly, as a killed process would: no final flush, ``abort`` stays."""
        self._state.closed = True
        _open_stores.discard(self)
        if self._runtime is not None:
            self._runtime.kill()
            shield.uninstall()
        self._release_files()
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _release_files(self) -> None:
        runtime = self._runtime
        if getattr(self, "dispatchers", None) is not None:
            self.dispatchers.close()
        if getattr(self, "view", None) is not None:
            self.view.close()
        writer = runtime.writer if runtime is not None else None
        if writer is not None:
            last_end = getattr(self._appender, "last_append", (0, 0))[0]
            if writer.staging is not None and not runtime.pool_drained(last_end):
                # Acknowledged records may still be only in the pool (a close cut short, the
                # flush loop failing): it stays for the next open to write back (salvage).
                writer.staging.keep_on_close = True
            writer.close()  # after the flush loop is gone: it reads the pool
        if runtime is not None:
            runtime.close_channels()
        for part in ("checkpoint", "commit_log"):
            obj = getattr(self, part, None)
            if obj is not None:
                obj.close()

    def __del__(self) -> None:
        # A store its program dropped without closing is closed as a file would be: its
        # lock, workers and shared memory must not outlive it.
        state = getattr(self, "_state", None)
        if state is None or state.closed:
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
        state = "closed" if self._state.closed else ("read-only" if self.read_only else "open")
        return f"MessageStore({self.root!r}, {state})"


_READS = ("get", "message_at", "message_by_id", "offset_by_time", "min_offset", "max_offset",
          "earliest_message_time", "topics", "queue_ids", "query_by_key",
          "query_by_unique_key", "register_subscription", "unregister_subscription",
          "_key_index", "_queue")


def _delegate(name: str):
    def call(self, *args, **kwargs):
        return getattr(self._reader, name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = getattr(Reader, name).__doc__
    return call


for _name in _READS:
    setattr(MessageStore, _name, _delegate(_name))
MessageStore.min_phys_offset = property(lambda self: self._reader.min_phys_offset,
                                        doc="First stored commit-log byte.")
MessageStore.max_phys_offset = property(lambda self: self._reader.max_phys_offset,
                                        doc="End of the readable commit log.")


class _Opener:
    """Opens a store directory: files, recovery, the parts, the loops. A failed open leaves
    the directory as it found it: no threads, no workers, no lock."""

    def __init__(self, store: MessageStore, config: StoreConfig, clock) -> None:
        self.store = store
        self.state = store._state
        self.root = store._state.root
        self.config = config
        self.clock = clock

    def open(self) -> None:
        store, state = self.store, self.state
        store.config, store.clock = self.config, self.clock
        if state.read_only:
            if not os.path.isdir(self.root):
                raise FileNotFoundError(f"store directory {self.root!r} does not exist")
        else:
            os.makedirs(self.root, exist_ok=True)
            store._lock = StoreLock(self.root)
            store._lock.acquire()
        try:
            self._files()
            self._recover()
            self._parts()
            if not state.read_only:
                self._start()
        except BaseException:
            if store._runtime is not None:
                store._runtime.abort_start()
            store._release_files()
            store._unlock()
            raise
        state.closed = False

    def _files(self) -> None:
        """Commit log, consume queues and the store's recorded settings."""
        store, config, ro = self.store, self.config, self.state.read_only
        meta, meta_problem = load_meta(self.root)
        store.hooks = PluginHooks(make_plugin_manager(
            modules=config.plugins.modules, disable=config.plugins.disable,
            load_entry_points=config.plugins.load_entry_points))
        # Sizes the store was written with win over the configured ones, which apply to new
        # stores; a read-only store with no segment yet learns the size from the first one.
        store.commit_log = CommitLog(os.path.join(self.root, COMMIT_LOG_DIR),
                                     None if ro else config.commit_log.segment_bytes,
                                     read_only=ro, on_warning=log.warning,
                                     known_bytes=meta.get("commit_log_segment_bytes"))
        self.notes = notes = store.commit_log.load()
        if not ro:
            # A killed store leaves its shared memory behind: its transient pool may hold
            # acknowledged records its files lack (see NOTE [ Shutdown ]); reclaim both.
            notes += salvage(store_segment_name(self.root, POOL_SEGMENT), store.commit_log.segments)
            unlink_segment(store_segment_name(self.root, shm.POSITIONS_SEGMENT))
        cq_bytes = meta.get("consume_queue_file_bytes") or round_file_bytes(
            config.consume_queue.file_units * CQ_UNIT_SIZE)
        self.queues = load_consume_queues(
            self.root, cq_bytes, read_only=ro, on_warning=log.warning, notes=notes,
            known_bytes=meta.get("consume_queue_file_bytes"))
        self.meta = settle_meta(self.root, meta, meta_problem, commit_log=store.commit_log,
                                consume_queues=self.queues.values(),
                                configured_hash=config.store.hash,
                                configured_cq_bytes=cq_bytes, read_only=ro, notes=notes)
        store.hash_kind = self.meta["hash"]
        store.checkpoint = Checkpoint(self.root, read_only=ro)

    def _recover(self) -> None:
        store, ro = self.store, self.state.read_only
        self.abnormal = abort_exists(self.root)
        known_queues, manifest_problem = read_manifest(self.root)
        self.manifest = ManifestKeeper(self.root)
        if manifest_problem:
            self.notes.append(manifest_problem)
        report: RecoveryReport = recover(
            store.commit_log, list(self.queues.values()), store.checkpoint,
            abnormal=self.abnormal, check_crc=self.config.commit_log.check_crc_on_recover,
            read_only=ro, known_queues=known_queues)
        report.notes[:0] = self.notes
        store.recovery_report = report
        if not store.commit_log.segments.segments:
            self.queues.clear()
        if not ro:
            # What recovery kept or mended is on disk before anything new is acknowledged.
            for seg in store.commit_log.segments.segments:
                if seg.end > report.scan_from:
                    seg.force()
            store.checkpoint.confirm_phy_offset = store.commit_log.max_offset

    def _parts(self) -> None:
        """The view, the dispatchers of this process's role, the reader."""
        store, config, ro = self.store, self.config, self.state.read_only
        in_process = not ro and config.dispatch.worker == "thread"
        store.view = view = DirectoryView(
            self.root, config, clock=self.clock, hash_kind=store.hash_kind,
            commit_log=store.commit_log, checkpoint=store.checkpoint,
            recovery_report=store.recovery_report,
            cq_file_bytes=self.meta["consume_queue_file_bytes"], consume_queues=self.queues,
            filters=store.hooks.filters, writes_queues=in_process, manifest=self.manifest)
        store.consume_queues = view.consume_queues
        store.subscriptions = view.subscriptions
        store.string_hash = view.string_hash
        store.store_host = parse_host(config.store.store_host)
        self.role = READER if ro else (WRITER if in_process else FOLLOWER)
        store.dispatchers = Dispatchers(store.hooks.dispatchers, view, self.role)
        memory = (config.get.physical_memory_bytes if config.get.physical_memory_bytes is not None
                  else _physical_memory())
        limits = PullLimits(config.get, memory,
                            config.store.role == "slave" and not config.get.offset_check_in_slave)
        store._reader = Reader(self.state, view, limits, store.dispatchers,
                               self._follow_limit())
        store._appender = ReadOnlyAppender(self.state)
        if ro:
            self.state.running_flags |= NOT_WRITEABLE

    def _follow_limit(self):
        """How far this process's consume-queue views may advance (None: it writes them)."""
        store = self.store
        if self.state.read_only:
            return store.commit_log.follow_tail
        return lambda: None  # a follower's limit is the worker's channel, set by _start

    def _start(self) -> None:
        """Writer, selector, flush policy, the loops; recovery's re-dispatch first."""
        store, config, hooks = self.store, self.config, self.store.hooks
        runtime_ref: list = []
        writer = hooks.writers.get(config.writer.kind)(WriterContext(
            self.root, config, store.commit_log,
            lambda: runtime_ref[0]().wake_committer() if runtime_ref else None))
        try:
            flush_factory = hooks.flush_policies.get(config.flush.policy)
            runtime = store._runtime = Runtime(
                state=self.state, config=config, view=store.view, dispatchers=store.dispatchers,
                hooks=hooks, writer=writer, flush_schedule=flush_factory.schedule(config),
                clock=self.clock, manifest=self.manifest)
        except BaseException:
            writer.close()
            raise
        runtime_ref.append(weakref.ref(runtime))
        if self.role == FOLLOWER:
            store._reader._follow_limit = lambda ch=runtime.channels.dispatch: ch.dispatched
        policy = flush_factory(config, runtime.flush_client)
        runtime.visible_after_flush = bool(policy.visible_after_flush)
        store._appender = runtime.appender = Appender(
            state=self.state, commit_log=store.commit_log, writer=writer,
            selector=hooks.queue_selectors.get(config.queue_select.selector)(
                config, store.string_hash),
            flush_policy=policy, hooks=hooks, config=config,
            put_ctx=appender.PutContext(store.store_host, config.commit_log.max_message_bytes,
                                        config.commit_log.auto_v2_on_long_topic,
                                        store.store_host.is_v6),
            store_host=store.store_host, clock=self.clock, queue_offsets={},
            last_append=(store.commit_log.max_offset, store.checkpoint.physic_msg_timestamp),
            failing=runtime.failing, appended=runtime.appended)
        report = store.recovery_report
        commit_log = store.commit_log
        start = max(min([report.redispatch_from, *store.dispatchers.resume_offsets()]),
                    commit_log.min_offset)
        if start < report.scan_from:
            mend_range(commit_log, start, report.scan_from,
                       check_crc=config.commit_log.check_crc_on_recover, read_only=False,
                       report=report)
        create_abort(self.root)
        report.redispatch_bytes, report.redispatch_seconds = runtime.start(start, report.abnormal)
        store._appender.queue_offsets.update(self._queue_offsets())

    def _queue_offsets(self) -> dict:
        """Each queue's next offset, now that dispatch has caught up; queues also stop
        offering units below the first stored record."""
        reader, store = self.store._reader, self.store
        reader._discover_queues()
        offsets = {}
        min_phys = store.commit_log.min_offset
        for key in list(store.consume_queues):
            cq = reader._queue(*key)
            cq.correct_min_offset(min_phys)
            offsets[key] = cq.max_offset
        return offsets


__all__ = ["MessageStore"]

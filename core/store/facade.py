"""MessageStore: the public facade over one open store directory.

Opening builds the parts in dependency order (``lifecycle.opener.Opener``); afterwards the
facade only delegates:

    Appender   put, put_batch: the put lock, the queue-offset table, the writer
    Reader     pulls and lookups (reads never take the put lock)
    Runtime    the dispatch, flush and cleanup loops of a writable store, and their channels
    ConsumerService  the consumer calls, on what the consumers use of the store

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
from typing import TYPE_CHECKING, Callable, Sequence

from mqstore.append.appender import Appender
from mqstore.clock import check_clock, system_clock
from mqstore.config import StoreConfig, load_config
from mqstore.consumer.service import ConsumerService
from mqstore.errors import StoreClosedError, WorkerError
from mqstore.lifecycle.opener import Opener
from mqstore.store.consumer_calls import ConsumerCalls
from mqstore.store.internals import MovedToInternals, StoreInternals
from mqstore.store.reads import StoreReadsOf
from mqstore.store.roles import RoleCalls
from mqstore.store.topic_calls import TopicCalls
from mqstore.store.transaction_calls import TransactionCalls, transaction_side
from mqstore.message import (
    BatchPutResult, GetResult, Message, MessageBatch, PutCounts, PutResult, ReadBatch,
    StoredMessage,
)
from mqstore.read.reader import check_queue
from mqstore.running_flags import DISK_FULL, UNWRITABLE, StoreState
from mqstore.runtime.loops import Runtime
from mqstore.scheduler import Scheduler, system_scheduler
from mqstore.storage import clean_marker
from mqstore.storage.abort_file import remove_abort
from mqstore.uninterrupted import shield

if TYPE_CHECKING:
    from mqstore.append.appender import ReadOnlyAppender
    from mqstore.dispatch.dispatchers import Dispatchers
    from mqstore.format.hosts import Host
    from mqstore.lifecycle.parts import StoreParts
    from mqstore.plugin_api.contracts import Writer
    from mqstore.plugin_api.manager import PluginHooks
    from mqstore.plugin_api.recovery_report import RecoveryReport
    from mqstore.read.reader import Reader
    from mqstore.replication import Replication
    from mqstore.storage.checkpoint import Checkpoint
    from mqstore.runtime.workers.flush_client import FlushClient
    from mqstore.runtime.workers.shm import Channels
    from mqstore.runtime.workers.supervisor import DispatchSupervisor
    from mqstore.storage.commit_log import CommitLog
    from mqstore.storage.consume_queue import ConsumeQueue
    from mqstore.view.subscriptions import Subscriptions
    from mqstore.view.directory_view import DirectoryView

log = logging.getLogger(__name__)

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


class MessageStore(TopicCalls, ConsumerCalls, RoleCalls, TransactionCalls):
    """An open store directory. Create with :meth:`open`; close with :meth:`close` or ``with``."""

    config: StoreConfig
    clock: Callable[[], int]
    scheduler: Scheduler
    hash_kind: str
    checkpoint: Checkpoint
    recovery_report: RecoveryReport
    view: DirectoryView
    store_host: Host
    internals: StoreInternals  # what tools and tests reach; the old names below warn
    commit_log: MovedToInternals[CommitLog] = MovedToInternals()
    dispatchers: MovedToInternals[Dispatchers] = MovedToInternals()
    hooks: MovedToInternals[PluginHooks] = MovedToInternals()
    flush_client: MovedToInternals[FlushClient | None] = MovedToInternals()
    writer: MovedToInternals[Writer | None] = MovedToInternals()
    supervisor: MovedToInternals[DispatchSupervisor | None] = MovedToInternals()
    channels: MovedToInternals[Channels | None] = MovedToInternals()
    _state: StoreState
    _parts: StoreParts
    _commit_log: CommitLog
    _dispatchers: Dispatchers
    _reader: Reader
    _appender: Appender | ReadOnlyAppender
    _runtime: Runtime | None
    _consumers: ConsumerService

    @classmethod
    def open(cls, root: str | os.PathLike, config: StoreConfig | None = None, *,
             read_only: bool = False, clock: Callable[[], int] | None = None,
             scheduler: Scheduler | None = None) -> "MessageStore":
        """``clock``: the store clock (``mqstore.clock``); ``scheduler``: when the loops'
        periodic jobs are due (``mqstore.scheduler``). Both default to the system's."""
        if config is not None and not isinstance(config, StoreConfig):
            raise TypeError(f"config must be a StoreConfig (see load_config), got {type(config).__name__}")
        config = config or load_config()
        clock = clock or system_clock
        # Before anything touches the directory: a clock the workers cannot get is refused
        # here, not by a worker failing to start after the files were made.
        check_clock(clock, to_workers=not read_only and "process" in (
            config.dispatch.worker, config.flush.worker))
        store = cls.__new__(cls)
        store._state = StoreState(os.path.abspath(os.fspath(root)), read_only)
        store._opened(Opener(store._state, config, clock, scheduler or system_scheduler).open())
        return store

    def _opened(self, parts: StoreParts) -> None:  # an open's parts taken up (or a reopen's)
        self._adopt(parts)
        _open_stores.add(self)
        runtime = self._runtime
        if runtime is not None and runtime.cleanup_reads_store:  # checked when built
            # The plugin protocol's one call once the store has opened; it gets the reads
            # it declared (contracts.StoreReads), not the facade.
            runtime.cleanup_policy.bind(StoreReadsOf(self._reader, parts.clock,
                                                     self._consumers))
        if not self.read_only:
            shield.install()  # NOTE [ Uninterrupted puts ]
        self._wire_roles()
        if parts.schedule is not None:
            parts.schedule.start()
        this = weakref.ref(self)  # the checker's thread must not keep a dropped store alive
        self._transactions = parts.transactions = transaction_side(
            parts, lambda: this()._consumers.offsets)  # type: ignore[union-attr]
        if parts.transactions is not None:
            parts.transactions.checkers = self._transaction_checkers
            parts.transactions.start()

    def _adopt(self, parts: StoreParts) -> None:
        # An open that returned set every part but the runtime (none when read-only).
        assert parts.hooks is not None and parts.commit_log is not None
        assert parts.checkpoint is not None and parts.recovery_report is not None
        assert parts.view is not None and parts.store_host is not None
        assert parts.dispatchers is not None and parts.reader is not None
        assert parts.appender is not None
        self._parts = parts
        self.internals = StoreInternals(parts)
        self.config, self.clock = parts.config, parts.clock
        self.scheduler, self.hash_kind = parts.scheduler, parts.hash_kind
        self.checkpoint, self.recovery_report = parts.checkpoint, parts.recovery_report
        self.view, self.store_host = parts.view, parts.store_host
        self._commit_log, self._dispatchers = parts.commit_log, parts.dispatchers
        self._reader, self._appender, self._runtime = parts.reader, parts.appender, parts.runtime
        self._consumers = self._consumers_of(parts)

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
    def put(self, message: Message) -> PutResult:
        """Append one message. Bad arguments raise ValueError; store-level refusals return a
        status (``PutResult``)."""
        return self._appender.put(message)

    def put_batch(self, messages: Sequence[Message] | MessageBatch) -> BatchPutResult:
        """Append many messages (any topics/queues) under one lock.

        ``messages`` is a list of Message objects or a columnar ``MessageBatch`` (faster: no
        per-message objects). Messages of one queue get consecutive offsets. The batch is
        written as one block per commit-log segment: a block that does not fit rolls as a
        whole; a batch larger than a segment is split between messages. A rejected message
        rejects the whole batch and nothing is written.
        """
        return self._appender.put_batch(messages)

    def put_counts(self) -> PutCounts:
        """What puts did since the store opened: messages appended, the commit-log bytes
        their records took, and put calls answered with a status that stored nothing (the
        totals of RocketMQ's StoreStatsService; ``mqstore serve``'s ``/metrics``)."""
        self._check_open()
        return self._appender.put_counts()

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
        return self._runtime.confirm_offset() if self._runtime else self._commit_log.max_offset

    def _writable(self) -> Runtime:
        self._check_open()
        if self._runtime is None:
            raise PermissionError(f"store {self.root!r} is open read-only")
        return self._runtime

    # -- reading (``read.reader.Reader``; reads never take the put lock) --------------------
    def get(self, group: str, topic: str, queue_id: int, offset: int, max_msgs: int = 32, *,
            expression: str | None = None, expression_type: str = "TAG",
            max_total_bytes: int | None = None) -> GetResult | None:
        """Up to ``max_msgs`` messages of a queue from queue ``offset``, with RocketMQ's
        getMessage status and next offset (spec 10.6); ``expression`` filters by the filter
        type ``expression_type`` names. None when no such queue exists."""
        return self._reader.get(group, topic, queue_id, offset, max_msgs, expression=expression,
                                expression_type=expression_type,
                                max_total_bytes=max_total_bytes)

    def read(self, topic: str, queue_id: int, offset: int, max_msgs: int = 1024, *,
             expression: str | None = None, expression_type: str = "TAG",
             group: str | None = None, max_total_bytes: int | None = None,
             verify: bool = True) -> ReadBatch | None:
        """Like ``get``, as columns (``ReadBatch``): no per-message objects until asked for."""
        return self._reader.read(topic, queue_id, offset, max_msgs, expression=expression,
                                 expression_type=expression_type, group=group,
                                 max_total_bytes=max_total_bytes, verify=verify)

    def message_at(self, phys_offset: int) -> StoredMessage | None:
        """The checked message starting at commit-log offset ``phys_offset`` (None when none
        starts there; ``CorruptRecordError`` when one does but is damaged)."""
        return self._reader.message_at(phys_offset)

    def message_by_id(self, msg_id: str) -> StoredMessage | None:
        """The message of an offset message id (RocketMQ's ``viewMessage``)."""
        return self._reader.message_by_id(msg_id)

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int,
                       boundary: str = "lower") -> int:
        """The queue offset of the first (``"lower"``) or last (``"upper"``) message stored at
        ``timestamp_ms`` or, with none there, the nearest one (spec 10.7)."""
        return self._reader.offset_by_time(topic, queue_id, timestamp_ms, boundary)

    def min_offset(self, topic: str, queue_id: int) -> int:
        """The first queue offset still stored."""
        return self._reader.min_offset(topic, queue_id)

    def max_offset(self, topic: str, queue_id: int) -> int:
        """One past the last queue offset dispatched."""
        return self._reader.max_offset(topic, queue_id)

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        """The store time of the queue's first stored message (-1 when it has none)."""
        return self._reader.earliest_message_time(topic, queue_id)

    def topics(self, *, include_system: bool = False) -> list[str]:
        """Every topic with a consume queue; system topics (``rmq_sys_*``, the store's own)
        only with ``include_system``."""
        return self._reader.topics(include_system=include_system)

    def queue_ids(self, topic: str) -> list[int]:
        """The queue ids of ``topic``, ascending."""
        return self._reader.queue_ids(topic)

    def query_by_key(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (KEYS or UNIQ_KEY), newest first, stored in
        ``[begin_ms, end_ms]``, through the key index."""
        return self._reader.query_by_key(topic, key, max_num, begin_ms, end_ms)

    def query_by_unique_key(self, topic: str, uniq_key: str) -> StoredMessage | None:
        """The message whose UNIQ_KEY (client message id) is ``uniq_key``."""
        return self._reader.query_by_unique_key(topic, uniq_key)

    def register_subscription(self, group: str, topic: str, expression: str,
                              expression_type: str = "SQL92") -> None:
        """Register a subscription whose filter type precomputes (SQL92's): dispatch then
        keeps its answers as bloom bitmaps, so filtered pulls skip non-matching messages."""
        self._reader.register_subscription(group, topic, expression, expression_type)

    def unregister_subscription(self, group: str, topic: str) -> bool:
        return self._reader.unregister_subscription(group, topic)

    @property
    def min_phys_offset(self) -> int:
        """First stored commit-log byte."""
        return self._reader.min_phys_offset

    @property
    def max_phys_offset(self) -> int:
        """End of the readable commit log."""
        return self._reader.max_phys_offset

    @property
    def consume_queues(self) -> dict[tuple[str, int], ConsumeQueue]:
        """This process's consume queues by ``(topic, queue_id)``."""
        return self.view.consume_queues

    @property
    def subscriptions(self) -> Subscriptions:
        """The registered subscriptions whose filters dispatch precomputes."""
        return self.view.subscriptions

    @property
    def string_hash(self) -> Callable[[str], int]:
        return self.view.string_hash

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
        runtime = self._runtime
        return 0 if runtime is None else max(0, runtime.confirm_offset() - runtime.dispatched())

    def worker_status(self) -> dict:
        """The dispatch loop as the store sees it (pid, restarts, failures in process mode)."""
        return self._writable().worker_status()

    def schedule_status(self) -> dict | None:
        """The delay levels' schedule (docs/delays.md): ``running``, each level's next
        ``offsets`` and ``pending`` messages, copies ``delivered``, ``recovered`` at start,
        ``ticks``; None for a read-only store, which runs none."""
        self._check_open()
        schedule = self._parts.schedule
        return None if schedule is None else schedule.status()

    def flush_metadata(self) -> None:  # consume queues and the checkpoint (done every second)
        self._writable().flush_metadata()

    def consume_queue(self, topic: str, queue_id: int, create: bool = False
                      ) -> ConsumeQueue | None:
        """The consume queue of ``topic``/``queue_id`` in this process (None if it has none)."""
        self._check_open()
        check_queue(topic, queue_id)
        return self.view.consume_queue(topic, queue_id, create)

    # -- replication (docs/replication.md; the role calls: ``store.roles``) ------------------
    @property
    def replication(self) -> Replication | None:
        """The store's replication (None when read-only): ``start``, ``status``, ``stop``."""
        return self._parts.replication

    # -- cleanup ---------------------------------------------------------------------------
    def delete_expired_segments(self, reserved_ms: int = 0, *, force: bool = False,
                                max_segments: int = 10) -> list[str]:
        """Delete the oldest commit-log segments, never the newest one.

        A segment goes when its newest record is older than ``reserved_ms`` on the store
        clock (0: whatever its age), or with ``force``; deletion stops at the first segment that must stay, so it
        never skips one. The consume queues and the dispatchers' files below the new minimum
        are dropped before this returns (by the dispatch loop's process; see
        ``mqstore.runtime.cleanup``). Returns the deleted segment paths.
        """
        runtime = self._writable()
        if reserved_ms < 0 or max_segments < 0:
            raise ValueError(f"reserved_ms {reserved_ms} and max_segments {max_segments} must be >= 0")
        return runtime.delete_expired(0 if force else reserved_ms, max_segments)

    # -- closing ---------------------------------------------------------------------------
    def close(self) -> None:
        if self._state.closed:
            return
        # A Ctrl-C (or a program's own signal handler) landing inside the close is handled
        # once the store is closed: a close cut short would leave workers, files and the lock
        # held. NOTE [ Uninterrupted puts ]
        shield.enter()
        try:
            self._close()
        finally:
            shield.leave()

    def _close(self) -> None:
        state = self._state
        self._parts.stop_replication()  # no slave reads, and no master appends, from here on
        self._consumers.close()  # consumers commit (auto-commit) and leave their groups first
        state.closed = True  # every call now raises StoreClosedError
        _open_stores.discard(self)
        clean = False
        ends = None
        runtime = self._runtime
        try:
            if runtime is not None:
                appender = self._appender
                assert isinstance(appender, Appender)  # a writable store's
                with appender.lock:
                    pass  # let an in-flight append finish
                last_end = appender.last_append[0]
                caught_up = runtime.stop(last_end)
                clean = caught_up and not state.running_flags & (UNWRITABLE & ~DISK_FULL)
                lock = self._parts.lock
                changed = runtime.lock_changed or (lock.intact() if lock is not None else None)
                if changed:  # NOTE [ Store lock ]: a clean marker could describe files gone
                    clean = False
                    log.error("store %s closed, but not cleanly: %s while it was open; the "
                              "next open recovers it in full", self.root, changed)
                    if lock is not None:
                        lock.mark_unclean()
                if clean:
                    ends = self._ends()
        finally:
            self._parts.release_files()
            if clean:
                # Before ``abort`` goes: a crash between the two leaves both, and a marker
                # beside ``abort`` is never trusted. Written once every file is closed.
                if ends is not None:
                    clean_marker.leave(self.root, ends[0], segment_bytes=ends[1],
                                       index_active=ends[2],
                                       max_record_bytes=self.config.commit_log.max_message_bytes)
                remove_abort(self.root)
            if runtime is not None:
                shield.uninstall()
            self._parts.unlock()

    def _ends(self) -> tuple[int, int, bool] | None:
        """What the clean-shutdown marker records from this process (the rest is read from
        the files once closed): the commit-log end, the segment size and whether a key
        index was built; None when bytes are still staged past the readable end."""
        segq = self._commit_log.segments
        if segq.max_offset != segq.write_end or segq.segment_bytes is None:
            return None
        return segq.max_offset, segq.segment_bytes, self._dispatchers.key_lookup() is not None

    def _crash(self) -> None:
        """End abruptly, as a killed process would: no final flush, ``abort`` stays."""
        self._state.closed = True
        _open_stores.discard(self)
        self._parts.stop_replication()
        if self._runtime is not None:
            self._runtime.kill()
            shield.uninstall()
        self._parts.release_files()
        self._parts.unlock()

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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._state.closed else ("read-only" if self.read_only else "open")
        return f"MessageStore({self.root!r}, {state})"


__all__ = ["MessageStore"]

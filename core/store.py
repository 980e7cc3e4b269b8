"""MessageStore: the public facade over one open store directory.

Opening wires the parts together (``opening.Opener``); afterwards the facade only delegates:

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

from mqstore.clock import system_clock
from mqstore.config import StoreConfig, load_config
from mqstore.consumer.service import CONSUMER_CALLS, ConsumerService
from mqstore.errors import StoreClosedError, WorkerError  # noqa: F401 - re-exported
from mqstore.opening import Opener
from mqstore.reading import Reader
from mqstore.running_flags import (  # noqa: F401 - flags are part of the store's API
    DISK_FULL, NOT_READABLE, NOT_WRITEABLE, UNWRITABLE, WRITE_INDEX_FILE_ERROR,
    WRITE_LOGICS_QUEUE_ERROR, StoreState,
)
from mqstore.runtime import Runtime
from mqstore.storage import clean_marker
from mqstore.storage.checkpoint import remove_abort
from mqstore.uninterrupted import shield
from mqstore.workers import shm

log = logging.getLogger("mqstore.store")

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
        Opener(store, config or load_config(), clock or system_clock).open()
        store._consumers = ConsumerService(store)
        _open_stores.add(store)
        runtime = store._runtime
        if runtime is not None and runtime.cleanup_reads_store:  # checked when built
            runtime.cleanup_policy.bind(weakref.proxy(store))  # contracts.StoreReads
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
        self._consumers.close()  # consumers commit (auto-commit) and leave their groups first
        state.closed = True  # every call now raises StoreClosedError
        _open_stores.discard(self)
        clean = False
        ends = None
        runtime = self._runtime
        try:
            if runtime is not None:
                with self._appender.lock:
                    pass  # let an in-flight append finish
                last_end = self._appender.last_append[0]
                caught_up = runtime.stop(last_end)
                clean = caught_up and not state.running_flags & (UNWRITABLE & ~DISK_FULL)
                changed = runtime.lock_changed or (
                    self._lock.intact() if self._lock is not None else None)
                if changed:  # NOTE [ Store lock ]: a clean marker could describe files gone
                    clean = False
                    log.error("store %s closed, but not cleanly: %s while it was open; the "
                              "next open recovers it in full", self.root, changed)
                    self._lock.mark_unclean()
                if clean:
                    ends = self._ends()
        finally:
            self._release_files()
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
            self._unlock()

    def _ends(self) -> tuple[int, int, bool] | None:
        """What the clean-shutdown marker records from this process (the rest is read from
        the files once closed): the commit-log end, the segment size and whether a key
        index was built; None when bytes are still staged past the readable end."""
        segq = self.commit_log.segments
        if segq.max_offset != segq.write_end:
            return None
        return segq.max_offset, segq.segment_bytes, self.dispatchers.key_lookup() is not None

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
        if runtime is not None:
            runtime.close_writer(getattr(self._appender, "last_append", (0, 0))[0])
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


_READS = ("get", "read", "message_at", "message_by_id", "offset_by_time", "min_offset",
          "max_offset", "earliest_message_time", "topics", "queue_ids", "query_by_key",
          "query_by_unique_key", "register_subscription", "unregister_subscription")


def _delegate(name: str):
    def call(self, *args, **kwargs):
        return getattr(self._reader, name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = getattr(Reader, name).__doc__
    return call


for _name in _READS:
    setattr(MessageStore, _name, _delegate(_name))


def _consumer_call(name: str):
    def call(self, *args, **kwargs):
        self._check_open()
        return getattr(self._consumers, name)(*args, **kwargs)
    call.__name__ = name
    call.__doc__ = getattr(ConsumerService, name).__doc__
    return call


for _name in CONSUMER_CALLS:  # consumer, pop, ack, ... (docs/consumers.md)
    setattr(MessageStore, _name, _consumer_call(_name))
MessageStore.min_phys_offset = property(lambda self: self._reader.min_phys_offset,
                                        doc="First stored commit-log byte.")
MessageStore.max_phys_offset = property(lambda self: self._reader.max_phys_offset,
                                        doc="End of the readable commit log.")


__all__ = ["MessageStore"]

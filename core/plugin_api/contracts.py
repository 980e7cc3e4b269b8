"""The typed contracts between mqstore's core and its plugins.

Every strategy a plugin registers (``hookspecs.register_*``) is built by a factory of one of the
shapes below and returns an object of one of the protocols below. A third-party plugin needs
nothing else from mqstore: it is checked by type checkers against these ``typing.Protocol``
classes, and by the core at build time (``check_capabilities``).

Optional behaviour is *declared*, never probed: an object that can do more than its protocol
requires lists it in ``capabilities`` (a frozenset of the names below), and the core calls
the matching method only then. ``check_capabilities`` refuses an object that declares a
capability without its method, naming both.

Roles: a dispatcher is built once in each process that needs it, with the role of that
process for the dispatcher's files:

    WRITER    this process writes the files (the dispatch worker, or the store process with
              ``dispatch.worker: thread``)
    FOLLOWER  another process of the same store writes them; read them as they grow (the
              store process while its dispatch worker runs)
    READER    a read-only store, beside a writer in another process or none at all
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, ClassVar, Literal, NamedTuple, Protocol, Sequence

import numpy as np

# What plugins meet in these contracts, importable from here.
from mqstore.plugin_api.batch import DispatchBatch
from mqstore.plugin_api.cleanup import DiskUsage
from mqstore.format.record import SYSFLAG_TX_MASK, TX_COMMIT, TX_NOT, TX_PREPARED, TX_ROLLBACK
from mqstore.message import Message, MessageBatch, PutStatus, StoredMessage
from mqstore.plugin_api.views import Clock, CommitLogView, StoreView, StringHash, WritableSegment
from mqstore.storage.transient_pool import PoolExhaustedError

if TYPE_CHECKING:
    from mqstore.config import StoreConfig
    from mqstore.message import ReadBatch

Role = Literal["writer", "follower", "reader"]
WRITER: Role = "writer"
FOLLOWER: Role = "follower"
READER: Role = "reader"

# -- capabilities ---------------------------------------------------------------------------
RESUMES = "resumes"
"""Dispatcher: ``resume_offset() -> int``, the commit-log offset from which its files need the
records again (they were lost or cut); dispatch restarts there at open."""
LOOKS_UP_KEYS = "looks_up_keys"
"""Dispatcher: ``candidates(topic, key, begin_ms, end_ms) -> list[int]``, commit-log offsets
that may carry ``key`` (hash matches; the store confirms each message)."""
DROPS_OLD_FILES = "drops_old_files"
"""Dispatcher: ``drop_below(min_phys_offset) -> list[str]``, after cleanup deleted the commit
log below ``min_phys_offset``: delete the files that only cover removed records; returns their
paths. Called on the ``writer`` role only (in the dispatch loop's process); followers and
readers notice the files are gone."""
PERSISTS = "persists"
"""Dispatcher: ``persist() -> None``, force what it wrote to disk and record how far that
covers, so ``resume_offset`` after a crash redoes only what came later. Called about once a
second on the ``writer`` role, possibly from another thread than ``dispatch`` (the dispatcher
serialises the two); a failure is the dispatcher's to log, never raised."""
READS_STORE = "reads_store"
"""Cleanup policy: ``bind(store: StoreReads) -> None`` is called once in the store process after
the store opened, with the store held weakly (a ``weakref.proxy`` of the ``MessageStore``);
``decide`` may then read its queues (and, from ``root``, the consumer offsets) through the calls
``StoreReads`` lists. A call on a store that closed meanwhile raises ``ReferenceError`` or
``StoreClosedError``."""
CHECKPOINTS = "checkpoints"
"""Dispatcher: ``checkpoint_time() -> int``, the store time of the newest record its files on
disk cover for sure (0: none yet). The core records the least of these in the checkpoint as
RocketMQ's ``indexMsgTimestamp``, after each batch and each ``persist``; after an abnormal exit
a dispatcher reads it back (``view.checkpoint.index_msg_timestamp``) to tell files that may be
half written. Dispatchers never write the checkpoint themselves."""
PRECOMPUTES = "precomputes"
"""Filter: ``matches_properties(properties: dict[str, str]) -> bool``. Dispatch evaluates a
registered subscription of this filter type once per new message and keeps the answer as a
bloom bitmap in the consume-queue extension, so pulls skip non-matching messages unread."""


class CapabilityError(TypeError):
    pass


_METHOD_OF = {RESUMES: "resume_offset", LOOKS_UP_KEYS: "candidates",
              DROPS_OLD_FILES: "drop_below", PERSISTS: "persist",
              PRECOMPUTES: "matches_properties", READS_STORE: "bind",
              CHECKPOINTS: "checkpoint_time"}


def capabilities_of(obj: object) -> frozenset[str]:
    """What ``obj`` declares it can do beyond its protocol (empty when it declares nothing)."""
    return frozenset(getattr(obj, "capabilities", ()))


def check_capabilities(obj: object, what: str) -> frozenset[str]:
    """The declared capabilities of ``obj``, each checked to come with its method."""
    declared = capabilities_of(obj)
    for name in declared:
        method = _METHOD_OF.get(name)
        if method is None:
            raise CapabilityError(f"{what} declares unknown capability {name!r}; known: "
                                  f"{', '.join(sorted(_METHOD_OF))}")
        if not callable(getattr(obj, method, None)):
            raise CapabilityError(f"{what} declares capability {name!r} but has no "
                                  f"{method}() method")
    return declared


# -- writers ---------------------------------------------------------------------------------
class WriterContext(NamedTuple):
    """What a writer factory is given."""

    root: str
    config: "StoreConfig"
    commit_log: CommitLogView
    wake_committer: Callable[[], None]
    """Publishes what has been written so far and wakes the flush loop. Only the core's
    staging writer has anything for it to commit; a plain writer has no use for it."""
    store_id: str = ""
    """The store's id (``mqstore.json``), which its shared memory is named after."""


class Writer(Protocol):
    """Copies encoded records into the commit log. Called under the put lock.

    A writer is plain: the bytes it copies into the mapped segment are readable (and
    dispatched) once ``write`` returns, and the flush loop forces them to disk. That is all a
    plugin's writer can do. Staging (copying into buffers that the flush loop, in another
    process, commits into the files later) is the core's alone: ``writer.kind:
    transient_pool`` is ``mqstore.append.pool_writer.TransientPoolWriter``, whose pool the core
    salvages, commits and keeps across processes; no other writer is treated as staging.

    Subclass it to inherit the defaults below and write only ``write``.
    """

    def write(self, segment: WritableSegment, data: bytes | memoryview) -> int:
        """Copy ``data`` at the segment's write position; returns that position."""
        raise NotImplementedError(f"{type(self).__name__} must implement write()")

    def write_blank(self, segment: WritableSegment, data: bytes) -> int:
        """The end-of-segment blank record (same contract as ``write``)."""
        return self.write(segment, data)

    def before_roll(self) -> None:
        """Before a new segment opens; raise ``PoolExhaustedError`` to refuse the put."""

    def close(self) -> None:
        """The store is closing (after its flush loop stopped)."""


WriterFactory = Callable[[WriterContext], Writer]


class _StagingWriter:
    """Stands, in the writer registry, for the core's staging writer (the transient pool):
    ``registry.add(name, STAGING_WRITER)`` makes it selectable as ``writer.kind: <name>``. The
    core builds it; it is not a factory a plugin could call or wrap."""

    def __call__(self, ctx: WriterContext) -> Writer:
        raise TypeError("STAGING_WRITER is built by the store, not called")

    def __repr__(self) -> str:
        return "mqstore.plugin_api.STAGING_WRITER"


STAGING_WRITER = _StagingWriter()


# -- queue selectors -------------------------------------------------------------------------
class QueueSelector(Protocol):
    def select(self, message: "Message", queue_count: int) -> int:
        """The queue id (``0 <= id < queue_count``) of a message put without one."""


QueueSelectorFactory = Callable[["StoreConfig", StringHash], QueueSelector]


# -- filters ---------------------------------------------------------------------------------
class Filter(Protocol):
    """A compiled subscription expression. ``get`` asks the cheap question of a whole window
    of consume-queue units first, then the exact one of each candidate."""

    def match_units(self, tags_codes: np.ndarray) -> np.ndarray | None:
        """A boolean mask over tag codes (int64), or None when every unit passes. Must never
        reject a message that matches."""

    def match_message(self, message: "StoredMessage") -> bool: ...


class PrecomputedFilter(Filter, Protocol):
    """A filter declaring ``PRECOMPUTES``."""

    capabilities: ClassVar[frozenset[str]]

    def matches_properties(self, properties: dict[str, str]) -> bool: ...


FilterFactory = Callable[[str | None, StringHash], Filter]
"""``factory(expression, string_hash)``; raises ValueError for a bad expression."""


# -- dispatchers -----------------------------------------------------------------------------
class Dispatcher(Protocol):
    """Builds derived files (consume queues, indexes) from batches of committed records, in
    commit-log order. ``dispatch`` must be idempotent for records it has seen (a failed batch
    is retried, and a restarted worker resumes at the last published position).

    Subclass it to inherit ``capabilities`` (none) and ``close`` (nothing to do).
    """

    capabilities: ClassVar[frozenset[str]] = frozenset()

    def dispatch(self, batch: "DispatchBatch") -> None:
        raise NotImplementedError(f"{type(self).__name__} must implement dispatch()")

    def close(self) -> None:
        """The process is done with the dispatcher (flush and close its files)."""


DispatcherFactory = Callable[[StoreView, Role], "Dispatcher | None"]
"""``factory(view, role)``; None when the dispatcher has nothing to do in this role or config."""


# -- flush policies --------------------------------------------------------------------------
class FlushSchedule(NamedTuple):
    """How the flush loop forces the commit log (RocketMQ's MappedFileQueue.flush rule):
    every ``interval_s`` when at least ``least_pages`` 4 KiB pages are unflushed, and every
    ``thorough_s`` whatever is pending."""

    interval_s: float
    least_pages: int
    thorough_s: float


class Flusher(Protocol):
    """The flush loop as a put sees it."""

    def wait_flushed(self, end_offset: int, timeout_s: float) -> bool:
        """Group commit: ask for ``end_offset`` to be forced; True once it is, False on
        timeout."""


class FlushPolicy(Protocol):
    visible_after_flush: bool
    """True: consumers see only flushed bytes (RocketMQ's confirm offset under sync flush)."""

    def complete_put(self, end_offset: int, wait: bool) -> "PutStatus":
        """Called after each put / put_batch (outside the put lock) with the end of its
        records and the messages' WAIT property; returns the put's status."""


class FlushPolicyFactory(Protocol):
    def __call__(self, config: "StoreConfig", flusher: Flusher) -> FlushPolicy: ...

    def schedule(self, config: "StoreConfig") -> FlushSchedule:
        """The flush loop's passes (read in the flush loop's process, without a policy)."""


# -- cleanup policies ------------------------------------------------------------------------
class CleanupDecision(NamedTuple):
    delete: bool
    """Run a deletion pass now."""
    reserved_ms: int
    """Delete segments whose newest record is older than this; 0: the oldest ones whatever
    their age (the disk is too full)."""
    disk_full: bool | None
    """Set (True) or clear (False) the DISK_FULL flag that refuses puts; None: leave it."""
    keep_from_phys: int = -1
    """No segment holding commit-log bytes at or above this offset goes in this pass, whatever
    the rest of the decision says; -1: no such bound."""


class CleanupPolicy(Protocol):
    def decide(self, now_ms: int, disk_used: DiskUsage) -> CleanupDecision:
        """Called every ``cleanup.interval_ms`` with the store clock's time and the used
        fraction of the store's disk (a ``DiskUsage``: a float, -1 if unknown, that also
        carries ``total_bytes`` and ``free_bytes``; ``watermark_passed`` compares it with a
        ``cleanup.disk_*_ratio`` setting)."""


class StoreReads(Protocol):
    """What a cleanup policy declaring ``READS_STORE`` is given (``bind``): the store's read API,
    these calls and no others (the same ``MessageStore`` methods, documented there)."""

    root: str
    """The store directory."""

    clock: Clock
    """The store clock."""

    def topics(self) -> list[str]: ...

    def queue_ids(self, topic: str) -> list[int]: ...

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def read(self, topic: str, queue_id: int, offset: int, max_msgs: int = 1024, *,
             expression: str | None = None, expression_type: str = "TAG",
             group: str | None = None, max_total_bytes: int | None = None,
             verify: bool = True) -> "ReadBatch | None":
        """Up to ``max_msgs`` messages of a queue from queue ``offset``, as columns."""

    def consumed_floor(self) -> tuple[int, str | None]:
        """The lowest commit-log offset holding a message some consumer group has not
        consumed, and who (``(-1, None)``: none); ``CorruptStateError`` when a group's state
        cannot be read."""


class StoreReadingCleanupPolicy(CleanupPolicy, Protocol):
    """A cleanup policy declaring ``READS_STORE``."""

    capabilities: ClassVar[frozenset[str]]

    def bind(self, store: StoreReads) -> None:
        """Once, in the store process, when the store has opened (a ``decide`` during a long
        open may come first: it decides without the store)."""


CleanupPolicyFactory = Callable[["StoreConfig"], CleanupPolicy]


# -- consumer group allocation ---------------------------------------------------------------
class AllocationStrategy(Protocol):
    def allocate(self, group: str, member: str, members: Sequence[str],
                 queue_ids: Sequence[int]) -> list[int]:
        """The queues ``member`` consumes, given every live member of the group (sorted, the
        same list in every member) and the topic's queue ids (sorted). Every member computes
        its own share from the same inputs, so the shares must not overlap and should cover
        every queue."""


AllocationStrategyFactory = Callable[[], AllocationStrategy]


__all__ = [
    "DispatchBatch", "Message", "MessageBatch", "PutStatus", "StoredMessage", "PoolExhaustedError",
    "SYSFLAG_TX_MASK", "TX_NOT", "TX_PREPARED", "TX_COMMIT", "TX_ROLLBACK", "Clock", "StringHash", "Role", "WRITER", "FOLLOWER", "READER", "RESUMES", "LOOKS_UP_KEYS",
    "DROPS_OLD_FILES", "PERSISTS", "CHECKPOINTS", "PRECOMPUTES", "CapabilityError", "capabilities_of",
    "check_capabilities", "StoreView", "WriterContext", "Writer",
    "WriterFactory", "STAGING_WRITER", "QueueSelector", "QueueSelectorFactory", "Filter", "PrecomputedFilter",
    "FilterFactory", "Dispatcher", "DispatcherFactory", "FlushSchedule", "Flusher",
    "FlushPolicy", "FlushPolicyFactory", "CleanupDecision", "CleanupPolicy",
    "CleanupPolicyFactory", "READS_STORE", "StoreReads", "StoreReadingCleanupPolicy",
    "AllocationStrategy", "AllocationStrategyFactory",
]

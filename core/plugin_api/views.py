"""The store as a plugin sees it: read-only protocols with documented members.

A plugin is handed a ``StoreView`` (dispatchers, at build time) or ``StoreReads`` (cleanup
policies declaring ``READS_STORE``). Both are structural types: the core's objects satisfy them,
and a plugin must not rely on anything they do not list (the concrete classes behind them are
internal and change without notice). Nothing here writes: what a plugin derives it writes to
its own files, and how far it got it reports through its contract (``contracts.Dispatcher``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, Protocol

import numpy as np

if TYPE_CHECKING:
    from mqstore.config import StoreConfig
    from mqstore.message import StoredMessage
    from mqstore.plugin_api.contracts import Filter
    from mqstore.plugin_api.recovery_report import RecoveryReport

Clock = Callable[[], int]
"""Epoch milliseconds. One clock serves a store and its worker processes (it is pickled to
them: a module-level function, or ``mqstore.testing.ManualClock``)."""
StringHash = Callable[[str], int]
"""The store's tag/key hash (Java's ``String.hashCode`` or murmur3, see ``mqstore.hashing``)."""


class CommitLogView(Protocol):
    """The commit log, read-only, in this process."""

    @property
    def segment_bytes(self) -> int:
        """The size of one segment file (``commit_log.segment_bytes``)."""

    @property
    def min_offset(self) -> int:
        """The first commit-log offset still stored (0 until cleanup deleted a segment)."""

    @property
    def max_offset(self) -> int:
        """The end of the readable commit log."""

    def read(self, phys_offset: int, size: int) -> memoryview | None:
        """``size`` raw bytes at ``phys_offset`` inside one segment; None when they are not
        stored (deleted, or past the end). The view is valid until the segment is deleted."""


class WritableSegment(Protocol):
    """The commit-log segment a writer copies records into (under the put lock)."""

    def write(self, data: bytes | memoryview) -> int:
        """Copy ``data`` at the segment's write position and advance it; returns the
        position the data starts at."""


class ConsumeQueueView(Protocol):
    """One consume queue (``consumequeue/<topic>/<queue id>``), read-only."""

    topic: str
    queue_id: int

    @property
    def min_offset(self) -> int:
        """The first queue offset still stored."""

    @property
    def max_offset(self) -> int:
        """One past the last unit written."""

    def first_phys(self) -> int | None:
        """The commit-log offset of the first stored unit (None when the queue is empty)."""


class ConsumeQueueExtView(Protocol):
    """A consume queue's extension file (``consumequeue_ext``), read-only."""

    def resolve(self, addresses: np.ndarray
                ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The extension units at ``addresses`` (the tags-code column of units that point into
        the extension)."""


class SubscriptionsView(Protocol):
    """The subscriptions registered with the store (``subscriptions.json``), read-only."""

    def for_topic(self, topic: str) -> list[dict]:
        """The entries of ``topic``: ``group``, ``topic``, ``expression``, ``type`` and
        ``registered_at`` (store-clock ms), as registered."""

    def lookup(self, group: str, topic: str) -> dict | None:
        """The entry of ``group`` on ``topic``, if one is registered."""


class CheckpointTimesView(Protocol):
    """The store times the checkpoint recorded at the last open (read-only; the core records
    new ones from what dispatchers report)."""

    @property
    def logics_msg_timestamp(self) -> int:
        """Store time of the last record whose consume-queue units were forced."""

    @property
    def index_msg_timestamp(self) -> int:
        """Store time of the last record a forced key-index file covers."""


class StoreView(Protocol):
    """What a dispatcher (and any plugin given the store) sees of it, in every process.

    The core's one implementation (``mqstore.view.directory_view.DirectoryView``) serves the
    store process, its dispatch worker and read-only stores alike.
    """

    root: str
    """The store directory; a plugin keeps its own files under it, in a directory of its own."""
    config: "StoreConfig"
    hash_kind: str
    """``"java"`` or ``"mmh3"`` (``mqstore.json``'s ``hash``): what ``string_hash`` computes."""
    string_hash: StringHash
    clock: Clock
    recovery_report: "RecoveryReport"
    """What this open's recovery found and changed (``abnormal``, ``trusted_end``, ...)."""

    @property
    def checkpoint(self) -> CheckpointTimesView: ...

    @property
    def commit_log(self) -> CommitLogView: ...

    @property
    def subscriptions(self) -> SubscriptionsView: ...

    def consume_queue(self, topic: str, queue_id: int) -> ConsumeQueueView | None:
        """The queue's consume queue in this process (None when it has none yet)."""

    def consume_queue_ext(self, topic: str, queue_id: int) -> ConsumeQueueExtView | None:
        """The queue's extension file (None when it has none)."""

    def message_at(self, phys_offset: int) -> "StoredMessage | None":
        """The checked message starting at ``phys_offset`` (None when none starts there;
        ``CorruptRecordError`` when one does but is damaged)."""

    def compile_filter(self, expression: str | None, expression_type: str) -> "Filter":
        """A compiled subscription filter of a registered type (``ValueError`` when bad)."""


__all__ = [
    "Clock", "StringHash", "CommitLogView", "WritableSegment", "ConsumeQueueView", "ConsumeQueueExtView",
    "SubscriptionsView", "CheckpointTimesView", "StoreView",
]

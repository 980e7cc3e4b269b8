"""mqstore's plugin API: everything a plugin may import, and nothing else.

A plugin (built-in or third-party, see ``docs/plugin_hooks.md``) imports from this package
only::

    from mqstore.plugin_api import Dispatcher, StoreView, WRITER, hookimpl

and, for an index builder, from ``mqstore.plugin_api.index``. The names here are stable; the
modules behind them (``contracts``, ``views``, ``hookspecs``, ...) may be imported directly
too. The rest of mqstore is internal to plugins: an import contract keeps the built-in ones to
this surface (``pyproject.toml``, "plugins use only the plugin API").
"""

from mqstore.config import StoreConfig
from mqstore.errors import CorruptStateError, MQStoreError, PluginError, StoreClosedError
from mqstore.hashing import java_remainder
from mqstore.plugin_api.batch import DispatchBatch
from mqstore.plugin_api.cleanup import DiskUsage, parse_hours, watermark_passed
from mqstore.plugin_api.contracts import (
    CHECKPOINTS, DROPS_OLD_FILES, FOLLOWER, LOOKS_UP_KEYS, PERSISTS, PRECOMPUTES, READER,
    READS_STORE, RESUMES, STAGING_WRITER, SYSFLAG_TX_MASK, TX_COMMIT, TX_NOT, TX_PREPARED, TX_ROLLBACK, WRITER,
    AllocationStrategy, AllocationStrategyFactory, CapabilityError, CleanupDecision,
    CleanupPolicy, CleanupPolicyFactory, Dispatcher, DispatcherFactory, Filter, FilterFactory,
    Flusher, FlushPolicy, FlushPolicyFactory, FlushSchedule, Message, MessageBatch,
    PoolExhaustedError, PrecomputedFilter, PutStatus, QueueSelector, QueueSelectorFactory, Role,
    StoredMessage, StoreReadingCleanupPolicy, StoreReads, Writer, WriterContext, WriterFactory,
    capabilities_of, check_capabilities,
)
from mqstore.plugin_api.filtering import MATCH_ALL
from mqstore.plugin_api.hookspecs import hookimpl, hookspec
from mqstore.plugin_api.recovery_report import Quarantined, RecoveryReport
from mqstore.plugin_api.registry import Registry
from mqstore.plugin_api.views import (
    CheckpointTimesView, Clock, CommitLogView, ConsumeQueueExtView, ConsumeQueueView, StoreView,
    StringHash, SubscriptionsView, WritableSegment,
)

__all__ = [
    # hooks
    "hookimpl", "hookspec", "Registry",
    # what dispatchers are given and declare
    "DispatchBatch", "StoreView", "CommitLogView", "ConsumeQueueView", "ConsumeQueueExtView",
    "SubscriptionsView", "CheckpointTimesView", "RecoveryReport", "Quarantined", "Role",
    "WRITER", "FOLLOWER", "READER", "RESUMES", "LOOKS_UP_KEYS", "DROPS_OLD_FILES", "PERSISTS",
    "CHECKPOINTS", "PRECOMPUTES", "READS_STORE", "CapabilityError", "capabilities_of",
    "check_capabilities", "Dispatcher", "DispatcherFactory",
    # writers, queue selection, filters, flushing, cleanup, allocation
    "Writer", "WriterContext", "WriterFactory", "STAGING_WRITER", "WritableSegment", "PoolExhaustedError",
    "QueueSelector", "QueueSelectorFactory", "java_remainder", "Filter", "PrecomputedFilter",
    "FilterFactory", "MATCH_ALL", "Flusher", "FlushPolicy", "FlushPolicyFactory",
    "FlushSchedule", "CleanupDecision", "CleanupPolicy", "CleanupPolicyFactory",
    "StoreReadingCleanupPolicy", "StoreReads", "DiskUsage", "watermark_passed", "parse_hours",
    "AllocationStrategy", "AllocationStrategyFactory",
    # values plugins meet
    "StoreConfig", "Message", "MessageBatch", "StoredMessage", "PutStatus", "SYSFLAG_TX_MASK", "TX_NOT",
    "TX_PREPARED", "TX_COMMIT", "TX_ROLLBACK", "Clock", "StringHash",
    # errors
    "MQStoreError", "PluginError", "StoreClosedError", "CorruptStateError",
]

"""Exceptions raised by mqstore. Every message names the offending value and the rule."""

from __future__ import annotations


class MQStoreError(Exception):
    """Base class for mqstore errors."""


class ConfigError(MQStoreError, ValueError):
    """A configuration value is missing, unknown, of the wrong type or out of range."""


class StoreLockedError(MQStoreError):
    """Another process (or another store object) holds the store's write lock."""


class StoreCorruptError(MQStoreError):
    """The store directory cannot be loaded as it is (for example a segment of the wrong size)."""


class StoreClosedError(MQStoreError):
    """The store was closed."""


class PluginError(MQStoreError):
    """A plugin name is unknown or a plugin registered something invalid."""


class PluginConfigError(ConfigError, PluginError):
    """A config value names a plugin, or a strategy, that the configured plugins do not provide.

    Also a PluginError: callers that caught the store's open-time lookup error keep working.
    """


class WorkerError(MQStoreError):
    """A worker process died; the store restarted it. Raised once per failure."""


class DiskFullError(MQStoreError, OSError):
    """The file system has no room for a file the store must create or grow."""


class CorruptRecordError(MQStoreError, ValueError):
    """Bytes read from disk do not decode; the message names the field, the bad value and the
    offset. A ValueError, so callers that skip unreadable records keep working."""


class CorruptStateError(MQStoreError, ValueError):
    """A state file beside the data (consumer offsets, pop state) exists but does not parse;
    it is left as it is. Damaged data like ``CorruptRecordError``, not bad input."""


class TopicNotFoundError(MQStoreError, LookupError):
    """A topic the call names has no config (``config/topics.json``) and nothing stored."""


class SystemTopicError(MQStoreError, ValueError):
    """A consumer call names a system topic (``rmq_sys_*``): the store's own, which clients
    may not consume."""


class GroupNotFoundError(MQStoreError, LookupError):
    """A consumer group the call names has no offsets or pop state."""


class InUseError(MQStoreError):
    """Live consumer instances hold what the call would change (a topic, a group's offsets):
    they would go on from what they have in memory, so the call is refused."""


class CoordinationError(MQStoreError):
    """etcd refused a coordination call, or holds a value coordination cannot read (the
    message names the endpoint or the key and the rule)."""


class CoordinationUnavailable(CoordinationError):
    """No etcd endpoint answered a coordination call in time; the message names each endpoint
    tried and what failed there."""


class PromotionRefusedError(MQStoreError):
    """A slave's promotion is refused: its master still serves it, or it lacks bytes its
    master had answered PUT_OK for (the message says which, and how many); ``force`` promotes
    it anyway."""

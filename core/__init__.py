"""mqstore: an embeddable message store with RocketMQ-compatible on-disk formats."""

from mqstore import _moved
from mqstore.config import StoreConfig, load_config
from mqstore.plugin_api.hookspecs import hookimpl
from mqstore.message import (
    BatchPutResult, GetResult, GetStatus, Message, MessageBatch, PutCounts, PutResult,
    PutStatus, StoredMessage,
)
from mqstore.plugin_api.recovery_report import RecoveryReport
from mqstore.store import MessageStore

__all__ = [
    "MessageStore", "Message", "MessageBatch", "PutStatus", "GetStatus", "PutResult", "BatchPutResult",
    "PutCounts",
    "GetResult", "StoredMessage", "RecoveryReport", "StoreConfig", "load_config", "hookimpl",
]
__version__ = "0.2.0"

_moved.install()  # old import paths warn (DeprecationWarning) for one release

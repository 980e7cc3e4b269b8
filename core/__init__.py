"""mqstore: an embeddable message store with RocketMQ-compatible on-disk formats."""

from mqstore.config import StoreConfig, load_config
from mqstore.hookspecs import hookimpl
from mqstore.message import (
    BatchPutResult, GetResult, GetStatus, Message, MessageBatch, PutResult, PutStatus,
    StoredMessage,
)
from mqstore.recovery import RecoveryReport
from mqstore.store import MessageStore

__all__ = [
    "MessageStore", "Message", "MessageBatch", "PutStatus", "GetStatus", "PutResult", "BatchPutResult",
    "GetResult", "StoredMessage", "RecoveryReport", "StoreConfig", "load_config", "hookimpl",
]
__version__ = "0.1.0"

"""The store as its callers see it: ``MessageStore`` (``store.facade``), its topic calls
(``store.topic_calls``, ``store.topic_removal``) and what tools and tests may reach beneath
it."""

from mqstore.errors import StoreClosedError, WorkerError
from mqstore.running_flags import (
    DISK_FULL, NOT_READABLE, NOT_WRITEABLE, UNWRITABLE, WRITE_INDEX_FILE_ERROR,
    WRITE_LOGICS_QUEUE_ERROR,
)
from mqstore.store.facade import MessageStore

__all__ = [
    "MessageStore", "StoreClosedError", "WorkerError", "DISK_FULL", "NOT_READABLE",
    "NOT_WRITEABLE", "UNWRITABLE", "WRITE_INDEX_FILE_ERROR", "WRITE_LOGICS_QUEUE_ERROR",
]

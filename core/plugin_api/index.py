"""What a key-index plugin builds with: RocketMQ's index file, its progress record, and the
key columns of a dispatched batch.

The built-in ``mqstore.plugins.index_key`` is written against this module only; so is any
other index builder. ``layout`` is the index file's byte layout (header, hash slots, entries:
see ``docs/file_formats.md``); ``IndexFile`` one file on disk; ``IndexProgress`` the sealed
record of how far the forced files cover, so recovery redoes only what came later.
"""

from __future__ import annotations

from mqstore.format import index_layout as layout
from mqstore.format.murmur3 import hash_ranges
from mqstore.format.properties import PROPERTY_KEYS, PROPERTY_UNIQ_KEY
from mqstore.format.property_keys import key_ranges, record_keys
from mqstore.format.record import SYSFLAG_TX_MASK, TX_ROLLBACK
from mqstore.hashing import HASH_MMH3, bytes_hasher
from mqstore.storage.index_file import INDEX_DIR, IndexFile
from mqstore.storage.index_progress import (
    PROGRESS_FILE, IndexProgress, read_progress, write_progress,
)

__all__ = [
    "layout", "IndexFile", "INDEX_DIR", "IndexProgress", "PROGRESS_FILE", "read_progress",
    "write_progress", "hash_ranges", "key_ranges", "record_keys", "PROPERTY_KEYS", "PROPERTY_UNIQ_KEY",
    "SYSFLAG_TX_MASK", "TX_ROLLBACK", "HASH_MMH3", "bytes_hasher",
]

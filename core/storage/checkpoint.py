"""The checkpoint: where the last flushes of the commit log, consume queues and index ended.

checkpoint (exactly 4096 bytes, big-endian longs, rest zero):

    +------+----------------------+---------------------------------------------+
    | @0   | physicMsgTimestamp   | store time of the last flushed message      |
    | @8   | logicsMsgTimestamp   | store time of the last consume-queue write  |
    | @16  | indexMsgTimestamp    | end time of the last full index file        |
    | @24  | masterFlushedOffset  |                                             |
    | @32  | confirmPhyOffset     | flushed end of the commit log               |
    | @40  | (mqstore) appended   | end of the last complete append, zero after |
    |      |                      | a clean close                               |
    +------+----------------------+---------------------------------------------+

The first five fields are RocketMQ's. ``appended`` lies in what RocketMQ leaves zero and ignores:
the writer stores it after every append (a store into the map, no system call), so after a
crash it tells a record the writer completed (damaged since: bit rot) from a put the crash
interrupted (a torn write, to be cut). A clean close zeroes it: the file is RocketMQ's again.

The store's other small files have modules of their own: the abort marker
(``storage.abort_file``), ``mqstore.json`` (``storage.meta_file``), the lock file
(``storage.store_lock``).
"""

from __future__ import annotations

import mmap
import os
import struct

from mqstore import _moved
from mqstore.storage.mapped_file import reserve_file

CHECKPOINT_FILE = "checkpoint"
CHECKPOINT_BYTES = 4096
_FIELDS = struct.Struct(">qqqqq")
_APPENDED = struct.Struct(">q")
_APPENDED_AT = _FIELDS.size


class Checkpoint:
    def __init__(self, root: str, *, read_only: bool = False) -> None:
        self.path = os.path.join(root, CHECKPOINT_FILE)
        self.read_only = read_only
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0
        self.appended_offset = 0
        self._mm = None
        self._fd = -1
        if os.path.exists(self.path):
            with open(self.path, "rb") as f:
                head = f.read(_FIELDS.size + _APPENDED.size)
            head = head.ljust(_FIELDS.size + _APPENDED.size, b"\0")
            (self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
             self.master_flushed_offset, self.confirm_phy_offset) = _FIELDS.unpack_from(head)
            (self.appended_offset,) = _APPENDED.unpack_from(head, _APPENDED_AT)
        if not read_only:
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                if os.fstat(self._fd).st_size != CHECKPOINT_BYTES:
                    os.ftruncate(self._fd, CHECKPOINT_BYTES)
                # Its page must exist before the map is written (a hole on a full disk is SIGBUS).
                reserve_file(self._fd, CHECKPOINT_BYTES, self.path)
                self._mm = mmap.mmap(self._fd, CHECKPOINT_BYTES)
            except BaseException:
                os.close(self._fd)
                self._fd = -1
                raise

    def min_timestamp(self) -> int:
        """Oldest time recovery must rescan from: min(physic, logics) minus 3 s, at least 0."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    def flush(self, logics_msg_timestamp: int | None = None) -> None:
        """Write the fields to disk; ``logics_msg_timestamp`` overrides the in-memory value
        (a value sampled before the consume queues were flushed)."""
        if self._mm is None:
            return
        logics = self.logics_msg_timestamp if logics_msg_timestamp is None else logics_msg_timestamp
        self._mm[0:_FIELDS.size] = _FIELDS.pack(
            self.physic_msg_timestamp, logics, self.index_msg_timestamp,
            self.master_flushed_offset, self.confirm_phy_offset,
        )
        self._mm.flush()

    def note_appended(self, end: int) -> None:
        """Record the end of the last complete append (see the module docstring)."""
        if self._mm is not None:
            _APPENDED.pack_into(self._mm, _APPENDED_AT, end)

    def close(self) -> None:
        if self._mm is not None:
            _APPENDED.pack_into(self._mm, _APPENDED_AT, 0)
            self.flush()
            self._mm.close()
            os.close(self._fd)
            self._mm = None



def __getattr__(name: str) -> object:
    return _moved.moved_attribute(__name__, name)  # the abort, meta and small-file helpers

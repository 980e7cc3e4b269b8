"""Checkpoint, abort marker, process lock and the store's own metadata file.

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

abort: exists while a writer has the store open (holds its PID); a leftover one means the
last exit was not clean. lock: an exclusive OS lock on byte range [0, 1) while open for
writing, beside the lock on the directory itself (NOTE [ Store lock ] in
``storage.store_lock``). mqstore.json: which string hash the store uses; RocketMQ directories
have none.
"""

from __future__ import annotations

import contextlib
import errno
import json
import mmap
import os
import struct

from mqstore.errors import DiskFullError, StoreCorruptError
from mqstore.storage.mapped_file import reserve_file

CHECKPOINT_FILE = "checkpoint"
ABORT_FILE = "abort"
LOCK_FILE = "lock"
META_FILE = "mqstore.json"
CHECKPOINT_BYTES = 4096
WORKER_EXIT_WAIT_S = 10.0
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


def abort_exists(root: str) -> bool:
    return os.path.exists(os.path.join(root, ABORT_FILE))


def write_small_file(path: str, data: bytes, *, atomic: bool = False) -> None:
    """Write and fsync a small file (through a renamed temporary one when ``atomic``); a full
    disk raises DiskFullError naming the file, and leaves no temporary file behind."""
    target = path + ".tmp" if atomic else path
    try:
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            os.write(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
        if atomic:
            os.replace(target, path)
    except OSError as exc:
        if atomic:
            with contextlib.suppress(OSError):
                os.unlink(target)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(f"no space to write {path}: {os.strerror(exc.errno)}") from None
        raise


def create_abort(root: str) -> None:
    write_small_file(os.path.join(root, ABORT_FILE), str(os.getpid()).encode())


def remove_abort(root: str) -> None:
    try:
        os.unlink(os.path.join(root, ABORT_FILE))
    except FileNotFoundError:
        pass


def read_meta(root: str) -> dict | None:
    path = os.path.join(root, META_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            meta = json.load(f)
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        raise StoreCorruptError(f"cannot read store metadata {path}: {exc}") from None
    if not isinstance(meta, dict):
        raise StoreCorruptError(f"store metadata {path} must hold a JSON object")
    return meta


def write_meta(root: str, meta: dict) -> None:
    write_small_file(os.path.join(root, META_FILE),
                     json.dumps(meta, indent=2, sort_keys=True).encode(), atomic=True)

"""Small files written so that a crash leaves the old version or the new one, never a mix,
and read back whole: the one place the store's small files (``mqstore.json``, ``abort``,
the sealed JSON files, the queue manifest, ``topics.json``, the locked JSON documents, the
pop checkpoints) get their fsync, rename and directory sync.

A replacement is written to ``<path>.tmp`` (a leftover one, from a writer killed mid-write,
is removed first), forced to disk when asked, renamed over ``<path>``, and the directory
forced when asked (the rename itself survives a killed process; power loss needs the
directory synced). A full disk raises ``DiskFullError`` naming the file and leaves no
temporary file behind. A replaced state file of the registry (``storage.state_files``) is
noted in its store's change feed (``storage.state_feed``) once it is in place.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
from typing import Callable, TypeVar

from mqstore.errors import CorruptStateError, DiskFullError
from mqstore.storage import state_feed

_T = TypeVar("_T")

TMP_SUFFIX = ".tmp"
READ_CHUNK = 1 << 20


def write_small_file(path: str, data: bytes, *, atomic: bool = False) -> None:
    """Write and fsync a small file (through a renamed temporary one when ``atomic``)."""
    if atomic:
        replace_file(path, data, fsync=True)
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            write_all(fd, data)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise _disk_full(path, exc) from None


def replace_file(path: str, data: bytes, *, fsync: bool, sync_directory: bool = False) -> None:
    """Put ``data`` in place of ``path`` by a rename (see the module docstring); ``fsync``
    forces the new version before the rename, ``sync_directory`` the rename after it."""
    tmp = path + TMP_SUFFIX
    try:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            write_all(fd, data)
            if fsync:
                os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise _disk_full(path, exc) from None
    if sync_directory:
        sync_dir(os.path.dirname(path) or ".")
    state_feed.changed(path)


def sync_dir(directory: str) -> None:
    """Force a directory's entries (a rename, a new file) to disk."""
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_all(fd: int, data: bytes) -> None:
    """Write every byte (``os.write`` may write fewer than it is given)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def read_all(fd: int, path: str | None = None) -> bytes:
    """Every byte from the descriptor's position on. With ``path``, a descriptor that is not
    a regular file (a directory or a device in the file's place) raises CorruptStateError
    naming it."""
    if path is not None and not stat.S_ISREG(os.fstat(fd).st_mode):
        raise CorruptStateError(f"{path} is not a file (a directory or a device stands in its "
                                f"place); it is left as it is: remove it")
    chunks = []
    while True:
        chunk = os.read(fd, READ_CHUNK)
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)


def read_if_exists(path: str) -> bytes | None:
    """The file's bytes, or None when there is no file (``read_all``'s checks apply)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        return read_all(fd, path)
    finally:
        os.close(fd)


def read_document(path: str, decode: Callable[[str], _T], damaged: Callable[[str], str]
                  ) -> _T | None:
    """A broker's JSON document at ``path`` decoded (None: no file). A damaged one (empty,
    not UTF-8, or refused by ``decode`` with a ValueError) raises ``CorruptStateError`` with
    ``damaged(problem)``, and one that is not a file ``read_all``'s; the file is left as it
    is."""
    raw = read_if_exists(path)
    if raw is None:
        return None
    try:
        if not raw.strip():
            raise ValueError("the file is empty")
        return decode(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        problem = f"not UTF-8 ({exc.reason} at byte {exc.start})"
    except ValueError as exc:
        problem = str(exc)
    raise CorruptStateError(damaged(problem))


def write_hint(path: str, status: dict) -> None:
    """A JSON document describing the moment for other processes (a status, not data):
    replaced by rename, never in place, and not forced to disk."""
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(status, f, sort_keys=True)
    os.replace(tmp, path)


def read_hint(path: str) -> dict | None:
    """The document ``write_hint`` last wrote, or None (none written, or unreadable)."""
    try:
        with open(path, encoding="utf-8") as f:
            status = json.load(f)
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


def _disk_full(path: str, exc: OSError) -> OSError:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return DiskFullError(f"no space to write {path}: {os.strerror(exc.errno)}")
    return exc

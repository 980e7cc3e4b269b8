"""A JSON document that several processes read and rewrite without losing each other's changes.

NOTE [ Locked JSON files ]
    <name>          the document; always whole: it is replaced by a rename, never written in place
    <name>.lock     flock'ed (exclusive) around every read-modify-write; its first 8 bytes count
                    the rewrites made through this module (little-endian u64)
    <name>.tmp      the next version while it is written (a writer killed here leaves it; the
                    next writer removes it)

A writer takes the lock, reads the document (or reuses the one it wrote itself, when the
counter says nobody wrote since), applies its change, writes ``<name>.tmp``, renames it over
``<name>``, bumps the counter and lets go. Every change is applied to the latest document, so
writers in any number of processes never lose each other's changes; a reader without the lock
sees the old document or the new one, never a mix. A process killed at any instant leaves the
last renamed document, and its lock goes with it (flock belongs to the open file, which the
kernel closes). ``fsync`` also forces the new version and the rename to disk (power loss); the
rename alone survives a killed process.

A document that does not parse, or does not have the shape ``decode`` checks, is never
overwritten: the change (and a read) is refused with ``CorruptStateError`` naming the file, so
one damaged file cannot make a writer drop every entry it did not know about. Nesting too deep
for the parser and a directory in the document's place are refused the same way.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import struct
import threading
from typing import Any, Callable, Iterator

from mqstore.errors import CorruptStateError
from mqstore.storage.durable_file import read_all, replace_file

_COUNTER = struct.Struct("<Q")


def _identity(st: os.stat_result) -> tuple:
    return st.st_ino, st.st_size, st.st_mtime_ns


class LockedJson:
    """One such document. ``decode(text) -> dict`` parses it and checks its shape
    (ValueError, saying what is wrong, when it cannot); ``empty()`` is the document of a
    missing file. Thread-safe."""

    def __init__(self, path: str, *, empty: Callable[[], dict],
                 decode: Callable[[str], dict] = json.loads, fsync: bool = False) -> None:
        self.path = path
        self._empty = empty
        self._decode = decode
        self._fsync = fsync
        self._lock_fd = -1
        self._mutex = threading.Lock()  # flock does not exclude threads sharing our descriptor
        self._cached: tuple[tuple, int, dict] | None = None  # (identity, counter, document)

    # -- reading --------------------------------------------------------------------------
    def read(self) -> dict:
        """The document as it is now (no lock: renames make every version whole). The caller
        must not change it."""
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return self._empty()
        try:
            ident = _identity(os.fstat(fd))
            cached = self._cached
            if cached is not None and cached[0] == ident:
                return cached[2]
            return self._parse(read_all(fd, self.path))
        finally:
            os.close(fd)

    def _parse(self, text: bytes) -> dict:
        try:
            doc = self._decode(text.decode("utf-8"))
        except (ValueError, UnicodeDecodeError) as exc:
            raise CorruptStateError(f"{self.path} is not a valid document ({exc}); it is left "
                                    f"as it is: repair or remove it") from None
        except RecursionError:
            raise CorruptStateError(f"{self.path} is not a valid document (nested too deep to "
                                    f"parse); it is left as it is: repair or remove it") from None
        if not isinstance(doc, dict):
            raise CorruptStateError(f"{self.path} holds {type(doc).__name__}, not an object; "
                                    f"it is left as it is: repair or remove it")
        return doc

    # -- changing -------------------------------------------------------------------------
    @contextlib.contextmanager
    def locked(self, shared: bool) -> Iterator[None]:
        """Hold the lock: shared (beside other shared holders, never beside a rewrite) or
        exclusive. One holder per process at a time (threads share the descriptor, and one
        thread's unlock would end another's hold)."""
        with self._mutex:
            fd = self._lock()
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def update(self, change: Callable[[dict], tuple[bool, Any]],
               after: Callable[[], None] | None = None) -> Any:
        """Apply ``change(document) -> (changed, result)`` to the latest document under the
        exclusive lock, write the document when ``changed``, then call ``after()`` (still
        under the lock); return ``result``. ``change`` may raise to refuse: nothing is
        written."""
        with self.locked(shared=False):
            doc, counter = self._current(self._lock_fd)
            work = json.loads(json.dumps(doc))  # the cached copy stays intact if change raises
            changed, result = change(work)
            if changed:
                self._write(self._lock_fd, work, counter + 1)
            if after is not None:
                after()
            return result

    def _lock(self) -> int:
        if self._lock_fd < 0:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
        return self._lock_fd

    def _current(self, lock_fd: int) -> tuple[dict, int]:
        raw = os.pread(lock_fd, _COUNTER.size, 0)
        counter = _COUNTER.unpack(raw)[0] if len(raw) == _COUNTER.size else 0
        try:
            fd = os.open(self.path, os.O_RDONLY)
        except FileNotFoundError:
            return self._empty(), counter
        try:
            ident = _identity(os.fstat(fd))
            cached = self._cached
            # Both must match: the counter misses writers from outside this module, and a
            # recycled inode with the same size and coarse mtime could fool the identity.
            if cached is not None and cached[0] == ident and cached[1] == counter:
                return cached[2], counter
            doc = self._parse(read_all(fd, self.path))
        finally:
            os.close(fd)
        self._cached = (ident, counter, doc)
        return doc, counter

    def _write(self, lock_fd: int, doc: dict, counter: int) -> None:
        data = json.dumps(doc, separators=(",", ":")).encode("utf-8")
        replace_file(self.path, data, fsync=self._fsync, sync_directory=self._fsync)
        os.pwrite(lock_fd, _COUNTER.pack(counter), 0)
        self._cached = (_identity(os.stat(self.path)), counter, doc)

    def close(self) -> None:
        with self._mutex:
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            self._cached = None


"""One fixed-size segment file mapped into memory.

A segment is created at its full size and named by the 20-digit offset of its first byte in its
stream. Unlike RocketMQ's sparse files, its blocks are reserved on the file system before
anything is written into the map (``reserve``): a store write into a hole of a full file system
would otherwise kill the process with SIGBUS instead of failing with ENOSPC. Files created here
are reserved at creation; files loaded for writing are reserved before their first write. It tracks ``wrote`` (bytes appended),
``committed`` (bytes in the file, the readable limit) and ``flushed`` (bytes known to be on
disk). Appends copied straight into the map are committed at once; a segment fed from the
transient pool is ``staged``: its appends go to a pool buffer and become readable only when
the flush service has copied them into the file.

Not thread-safe: the owning queue serialises appends; reads of ``[0, wrote)`` are safe at any time.
"""

from __future__ import annotations

import errno
import mmap
import os

from mqstore.errors import DiskFullError

NAME_DIGITS = 20


def segment_name(start_offset: int) -> str:
    return f"{start_offset:0{NAME_DIGITS}d}"


class MappedFile:
    __slots__ = ("path", "start", "size", "read_only", "wrote", "flushed", "staged",
                 "reserved", "_committed", "_fd", "mm", "view")

    def __init__(self, path: str, start: int, size: int, *, read_only: bool = False,
                 create: bool = False) -> None:
        self.path = path
        self.start = start
        self.size = size
        self.read_only = read_only
        flags = os.O_RDONLY if read_only else os.O_RDWR
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self._fd = os.open(path, flags, 0o644)
        self.reserved = False
        try:
            if create:
                self.reserve()
            self.mm = mmap.mmap(
                self._fd, size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            )
        except BaseException:
            os.close(self._fd)
            if create:  # a file that could not be reserved is not left behind half made
                _unlink_quietly(path)
            raise
        self.view = memoryview(self.mm)
        # A loaded segment starts out full; recovery moves the positions back.
        self.wrote = 0 if create else size
        self.flushed = self.wrote
        self.staged = False
        self._committed = 0

    def reserve(self) -> None:
        """Allocate every block of the file now; raises DiskFullError when the file system
        cannot hold it (nothing is written, the file keeps its contents)."""
        if self.reserved:
            return
        reserve_file(self._fd, self.size, self.path)
        self.reserved = True

    @property
    def committed(self) -> int:
        return self._committed if self.staged else self.wrote

    def stage(self) -> None:
        """From now on appends are committed by someone else (see ``set_committed``)."""
        if not self.staged:
            self._committed = self.wrote
            self.staged = True

    def set_committed(self, position: int) -> None:
        if position > self._committed:
            self._committed = min(position, self.wrote)
        if self._committed >= self.size:
            self.staged = False  # whole segment in the file: nothing is staged any more

    @property
    def end(self) -> int:
        return self.start + self.size

    @property
    def remaining(self) -> int:
        return self.size - self.wrote

    def is_full(self) -> bool:
        return self.wrote >= self.size

    def write(self, data, at: int | None = None) -> int:
        """Copy ``data`` at ``at`` (default: the write position); returns the file position."""
        if not self.reserved:
            self.reserve()
        pos = self.wrote if at is None else at
        end = pos + len(data)
        self.mm[pos:end] = data
        if end > self.wrote:
            self.wrote = end
        return pos

    def flush(self) -> int:
        """Force ``[flushed, wrote)`` to disk; returns the new flushed position.

        ``fdatasync`` on the file writes back the pages dirtied through the map (as msync
        does) but, unlike ``mmap.flush``, releases the GIL while the disk works, so other
        producers keep appending and the next flush covers all of them (group commit).
        """
        wrote = self.wrote
        if wrote > self.flushed and not self.read_only and self._fd >= 0:
            os.fdatasync(self._fd)
            self.flushed = wrote
        return self.flushed

    def zero(self, begin: int, end: int) -> None:
        if not self.reserved:
            self.reserve()
        self.mm[begin:end] = bytes(end - begin)

    def close(self) -> None:
        if self._fd < 0:
            return
        self.view.release()
        try:
            self.mm.close()
        except BufferError:
            # A caller still holds a slice of the map; the mapping dies with the last slice.
            pass
        os.close(self._fd)
        self._fd = -1

    def destroy(self) -> None:
        self.close()
        _unlink_quietly(self.path)

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, start={self.start}, wrote={self.wrote})"


def _unlink_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def reserve_file(fd: int, size: int, path: str) -> None:
    """Allocate the blocks of ``[0, size)`` of ``fd``; DiskFullError when they do not fit."""
    try:
        os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"no space to reserve {size} bytes for {path}: {os.strerror(exc.errno)}"
            ) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # The file system cannot reserve at all: writes proceed as RocketMQ's do.

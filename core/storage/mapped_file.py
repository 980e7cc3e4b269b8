"""One fixed-size segment file mapped into memory.

A segment is created at its full size (sparse zeros, as RocketMQ's mapped files are) and named by
the 20-digit offset of its first byte in its stream. It tracks ``wrote`` (bytes appended),
``committed`` (bytes in the file, the readable limit) and ``flushed`` (bytes known to be on
disk). Appends copied straight into the map are committed at once; a segment fed from the
transient pool is ``staged``: its appends go to a pool buffer and become readable only when
the flush service has copied them into the file.

Not thread-safe: the owning queue serialises appends; reads of ``[0, wrote)`` are safe at any time.
"""

from __future__ import annotations

import mmap
import os

NAME_DIGITS = 20


def segment_name(start_offset: int) -> str:
    return f"{start_offset:0{NAME_DIGITS}d}"


class MappedFile:
    __slots__ = ("path", "start", "size", "read_only", "wrote", "flushed", "staged",
                 "_committed", "_fd", "mm", "view")

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
        try:
            if create:
                os.ftruncate(self._fd, size)
            self.mm = mmap.mmap(
                self._fd, size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            )
        except BaseException:
            os.close(self._fd)
            raise
        self.view = memoryview(self.mm)
        # A loaded segment starts out full; recovery moves the positions back.
        self.wrote = 0 if create else size
        self.flushed = self.wrote
        self.staged = False
        self._committed = 0

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
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def __repr__(self) -> str:
        return f"MappedFile({self.path!r}, start={self.start}, wrote={self.wrote})"

"""One fixed-size segment file mapped into memory.

A segment is created at its full size, sparse, and named by the 20-digit offset of its first
byte in its stream. Blocks are reserved on the file system before anything is written into the
map over them: a write into a hole of a full file system would kill the process with SIGBUS
instead of failing with ENOSPC. Reservations run ahead of the appends, as RocketMQ's files stay
sparse until written: a ``growing`` file (commit-log segments) reserves steps as large as what it
holds already (``first_step`` to ``MOST_STEP_BYTES``), so a segment of one message costs a
megabyte while a busy one takes few ``fallocate`` calls; others (consume queues, index files)
reserve ``RESERVE_AHEAD_BYTES`` ahead of their appends and page by page where they write
elsewhere (``reserve_span``). A reservation that fails raises DiskFullError before any byte of
the write, which is then refused whole.

It tracks ``wrote`` (bytes appended),
``committed`` (bytes in the file, the readable limit) and ``flushed`` (bytes known to be on
disk). Appends copied straight into the map are committed at once; a segment fed from the
transient pool is ``staged``: its appends go to a pool buffer and become readable only when
the flush service has copied them into the file.

Not thread-safe: the owning queue serialises appends; reads of ``[0, wrote)`` are safe at any time.

A segment may be ``park``-ed: its map and descriptor go (two descriptors: Python's mmap keeps a
duplicate of the one it was made from), its positions stay, and ``unpark`` maps the file again.
Consume queues park the files of queues nobody has used lately (``storage.mapped_budget``).
"""

from __future__ import annotations

import errno
import mmap
import os

import numpy as np

from mqstore.errors import DiskFullError

NAME_DIGITS = 20
PAGE = 4096
RESERVE_AHEAD_BYTES = 1 << 20  # how far a sparse file reserves ahead of its appends
FIRST_STEP_BYTES = 1 << 20  # a growing file's first step (a sixteenth of a smaller file)
MOST_STEP_BYTES = 64 << 20  # and its largest


def segment_name(start_offset: int) -> str:
    return f"{start_offset:0{NAME_DIGITS}d}"


def first_step(size: int) -> int:
    """The first reservation step of a growing file of ``size`` bytes: small files (the tests'
    64 KiB segments) step through several reservations as large ones do."""
    return min(FIRST_STEP_BYTES, max(PAGE, size // 16 // PAGE * PAGE))


class MappedFile:
    __slots__ = ("path", "start", "size", "read_only", "wrote", "flushed", "staged", "growing",
                 "reserved_to", "_pages", "_committed", "_fd", "mm", "view", "parked")

    def __init__(self, path: str, start: int, size: int, *, read_only: bool = False,
                 create: bool = False, growing: bool = True, reserve: int = PAGE) -> None:
        """``create``: a new file, sparse, with the blocks of its first ``reserve`` bytes (the
        first page at least: headers and blanks live there) reserved, and for a growing file
        the step ahead of them; a file that cannot get them is not left behind."""
        self.path = path
        self.start = start
        self.size = size
        self.read_only = read_only
        self.growing = growing
        flags = os.O_RDONLY if read_only else os.O_RDWR
        if create:
            flags |= os.O_CREAT | os.O_EXCL
        self._fd = os.open(path, flags, 0o644)
        self.reserved_to = 0  # blocks of [0, reserved_to) exist
        self._pages = None  # pages reserved beyond it (scattered writes), as a bool array
        try:
            if create:
                os.ftruncate(self._fd, size)
                first = min(size, max(reserve, PAGE))
                if growing:
                    self._reserve_prefix(first)
                else:  # appends reserve ahead as they go
                    reserve_file(self._fd, first, path)
                    self.reserved_to = first
            self.mm = mmap.mmap(
                self._fd, size, access=mmap.ACCESS_READ if read_only else mmap.ACCESS_WRITE
            )
        except BaseException:
            os.close(self._fd)
            if create:  # a file that could not be reserved is not left behind half made
                _unlink_quietly(path)
            raise
        self.view = memoryview(self.mm)
        self.parked = False
        # A loaded segment starts out full; recovery moves the positions back.
        self.wrote = 0 if create else size
        self.flushed = self.wrote
        self.staged = False
        self._committed = 0

    def _reserve_prefix(self, end: int) -> None:
        """Blocks for ``[0, end)`` and a step beyond; DiskFullError when the file system
        cannot hold them (``reserved_to`` stays where it was)."""
        if end <= self.reserved_to:
            return
        if self.growing:  # steps as large as what is reserved already: few calls, small files
            ahead = min(MOST_STEP_BYTES, max(first_step(self.size), self.reserved_to))
        else:
            ahead = RESERVE_AHEAD_BYTES
        target = min(self.size, -(-(end + ahead) // PAGE) * PAGE)
        reserve_file(self._fd, target, self.path, begin=self.reserved_to)
        self.reserved_to = target

    def reserve_span(self, begin: int, end: int) -> None:
        """Blocks for a write into ``[begin, end)`` anywhere in the file."""
        if end <= self.reserved_to:
            return
        if begin <= self.reserved_to or self.growing:  # a growing file's blocks form a prefix
            self._reserve_prefix(end)
            return
        pages = self._page_map()
        first, last = begin // PAGE, -(-end // PAGE)
        if pages[first:last].all():
            return
        reserve_file(self._fd, min(self.size, last * PAGE), self.path, begin=first * PAGE)
        pages[first:last] = True

    def reserve_pages(self, offsets) -> None:
        """Blocks for small writes at ``offsets`` (a numpy array of file positions)."""
        pages = np.unique(np.asarray(offsets, dtype=np.int64) // PAGE)
        pages = pages[pages * PAGE >= self.reserved_to]
        if not len(pages):
            return
        reserved = self._page_map()
        for page in pages[~reserved[pages]].tolist():
            reserve_file(self._fd, min(self.size, (page + 1) * PAGE), self.path,
                         begin=page * PAGE)
            reserved[page] = True

    def _page_map(self) -> np.ndarray:
        """Which pages past ``reserved_to`` have their blocks (files written out of order)."""
        if self._pages is None:
            self._pages = np.zeros(-(-self.size // PAGE), dtype=bool)
        return self._pages

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
        if end > self.reserved_to:
            self.reserve_span(pos, end)
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
        if wrote > self.flushed and not self.read_only:
            if self._fd >= 0:
                os.fdatasync(self._fd)
            elif self.parked:  # unmapped since it was written: its pages wait in the cache
                fd = os.open(self.path, os.O_RDWR)
                try:
                    os.fdatasync(fd)
                finally:
                    os.close(fd)
            else:
                return self.flushed
            self.flushed = wrote
        return self.flushed

    def data_end(self) -> int:
        """End of the file's first run of allocated blocks: everything past it reads as zeros.
        Scans stop here, because on tmpfs even reading a hole through the map must allocate a
        page, and a full tmpfs answers that with SIGBUS."""
        try:
            return min(self.size, os.lseek(self._fd, 0, os.SEEK_HOLE))
        except OSError:  # no hole reporting here: the whole file counts
            return self.size

    def pread(self, at: int, size: int) -> bytes:
        """Bytes read with a system call, not through the map: a hole reads as zeros whatever
        the file system's free space (see ``data_end``)."""
        return os.pread(self._fd, size, at).ljust(size, b"\0")

    def force(self) -> None:
        """fdatasync the whole file, whatever the positions say."""
        if not self.read_only and self._fd >= 0:
            os.fdatasync(self._fd)

    def overwrite(self, at: int, data) -> None:
        """Replace bytes in place (recovery mending damaged records); positions stay."""
        self.reserve_span(at, at + len(data))
        self.mm[at:at + len(data)] = data

    def zero(self, begin: int, end: int) -> None:
        self.reserve_span(begin, end)
        self.mm[begin:end] = bytes(end - begin)

    @property
    def mapped(self) -> bool:
        """The file is mapped (neither parked nor closed)."""
        return self._fd >= 0

    def park(self) -> bool:
        """Unmap the file and close its descriptor, keeping every position; ``unpark`` maps it
        again. What was written stays in the page cache, and ``flush`` forces it through a
        descriptor of its own. False, and the file still mapped, while a caller holds a slice
        of the map (it would outlive the unmap)."""
        if self._fd < 0:
            return not self.parked
        self.view.release()
        try:
            self.mm.close()
        except BufferError:  # exported: the map stays until the slice goes
            self.view = memoryview(self.mm)
            return False
        os.close(self._fd)
        self._fd = -1
        self.parked = True
        return True

    def unpark(self) -> None:
        """Map the file again after ``park``; FileNotFoundError when it was deleted since."""
        if not self.parked:
            return
        fd = os.open(self.path, os.O_RDONLY if self.read_only else os.O_RDWR)
        try:
            self.mm = mmap.mmap(
                fd, self.size, access=mmap.ACCESS_READ if self.read_only else mmap.ACCESS_WRITE)
        except BaseException:
            os.close(fd)
            raise
        self._fd = fd
        self.view = memoryview(self.mm)
        self.parked = False

    def close(self) -> None:
        self.parked = False  # a closed file is never mapped again
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


def reserve_file(fd: int, size: int, path: str, begin: int = 0) -> None:
    """Allocate the blocks of ``[begin, size)`` of ``fd`` (the file grows to ``size`` if it is
    shorter); DiskFullError when they do not fit."""
    try:
        os.posix_fallocate(fd, begin, size - begin)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise DiskFullError(
                f"no space to reserve {size - begin} bytes for {path}: {os.strerror(exc.errno)}"
            ) from None
        if exc.errno not in (errno.EOPNOTSUPP, errno.EINVAL):
            raise
        # The file system cannot reserve at all: writes proceed as RocketMQ's do.

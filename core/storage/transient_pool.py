"""The transient store pool: segment-sized write buffers in shared memory.

With the pool, appends land in a buffer lent to the segment being written; the flush service
(another process, usually) copies committed ranges from the buffer into the segment file.
Readers map the file, so a record becomes readable only once it is committed, as with
RocketMQ's ``transientStorePoolEnable``. The buffers live in one shared-memory block:

    [owners: int64 x buffers, padded to 4096][buffer 0][buffer 1]...

``owners[i]`` is the start offset of the segment holding buffer ``i``, or -1 when it is free.
Only the store process changes owners: it lends a buffer when a segment opens for appends and
takes it back once the flush service reports the segment fully committed, so the flush
service never sees a buffer change hands under it.
"""

from __future__ import annotations

import errno
import shutil

import numpy as np

from mqstore.format.record import SCAN_BLANK, SCAN_OK, scan_record
from mqstore.storage.shared_segment import close_segment, open_segment, unlink_segment

POOL_SEGMENT = "pool"  # the kind in ``store_segment_name``
HEADER_BYTES = 4096
PAGE = 4096
FREE = -1
SHM_DIR = "/dev/shm"
MADV_POPULATE_READ, MADV_POPULATE_WRITE = 22, 23  # Linux 5.14+


class PoolTooLargeError(OSError):
    """The shared-memory file system cannot hold every buffer of the pool."""


class PoolExhaustedError(RuntimeError):
    """No free buffer: every one holds a segment whose bytes are not yet committed."""


class TransientPool:
    def __init__(self, buffers: int, buffer_bytes: int, name: str | None = None, *,
                 create: bool = False, tracked: bool | None = None) -> None:
        """An anonymous pool when ``name`` is None; else the store's named pool, created with
        ``create`` or attached, kept out of the resource tracker so that a killed store's
        pool outlives it for ``salvage``."""
        if buffers < 1 or buffers * 8 > HEADER_BYTES:
            raise ValueError(f"a transient pool holds 1 to {HEADER_BYTES // 8} buffers, not {buffers}")
        self.buffers = buffers
        self.buffer_bytes = buffer_bytes
        self.keep_on_close = False
        self._tracked = (name is None) if tracked is None else tracked
        if create or name is None:
            self._check_room(buffers * buffer_bytes)
        self.shm, self.owner = open_segment(name, HEADER_BYTES + buffers * buffer_bytes,
                                            create=create or name is None,
                                            tracked=self._tracked)
        self.owners = np.ndarray((buffers,), dtype=np.int64, buffer=self.shm.buf)
        if self.owner:
            self.owners[:] = FREE
        self._views = [self.shm.buf[HEADER_BYTES + i * buffer_bytes:
                                    HEADER_BYTES + (i + 1) * buffer_bytes] for i in range(buffers)]

    @property
    def name(self) -> str:
        return self.shm.name

    def warm(self) -> None:
        """Map every page of the buffers into this process now.

        RocketMQ's pool allocates and locks its buffers when the store starts; here the
        creating process populates them writable and an attaching one maps them, so neither
        appends nor commits stop on page faults, and the cost is paid once at open. Kernels
        without ``MADV_POPULATE_*`` (before 5.14) get the same effect from reading one byte of
        every page (a read fault on shared memory allocates the page and maps it writable).
        (A pool the shared-memory file system cannot hold was refused with its sizes when it
        was created, not left to fail with SIGBUS on some later append.)
        """
        size = self.buffers * self.buffer_bytes
        advice = MADV_POPULATE_WRITE if self.owner else MADV_POPULATE_READ
        mapping = getattr(self.shm, "_mmap", None)
        try:
            mapping.madvise(advice, HEADER_BYTES, size)
            return
        except AttributeError:
            pass
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise OSError(exc.errno, f"transient pool of {self.buffers} x {self.buffer_bytes} "
                                         f"bytes could not be mapped ({exc.strerror}); "
                                         f"{SHM_DIR} must hold {size} bytes "
                                         f"(writer.transient_pool_buffers)") from None
        np.frombuffer(self.shm.buf, dtype=np.uint8)[HEADER_BYTES::PAGE].max()

    def _check_room(self, size: int) -> None:
        try:
            free = shutil.disk_usage(SHM_DIR).free
        except OSError:
            return  # no such file system to ask: madvise reports what goes wrong
        if free < size:
            raise PoolTooLargeError(
                f"transient pool of {self.buffers} x {self.buffer_bytes} bytes = {size} bytes "
                f"does not fit the {free} bytes free in {SHM_DIR}; lower "
                f"writer.transient_pool_buffers or commit_log.segment_bytes, or enlarge {SHM_DIR}")

    def free_count(self) -> int:
        return int(np.count_nonzero(self.owners == FREE))

    def lend(self, segment_start: int) -> memoryview:
        """The buffer for the segment starting at ``segment_start`` (lent now if it has none)."""
        owners = self.owners
        hit = np.flatnonzero(owners == segment_start)
        if len(hit):
            return self._views[int(hit[0])]
        free = np.flatnonzero(owners == FREE)
        if not len(free):
            raise PoolExhaustedError(
                f"transient pool has no free buffer: all {self.buffers} hold segments "
                f"{sorted(owners.tolist())} whose bytes are not committed yet "
                f"(writer.transient_pool_buffers={self.buffers})")
        i = int(free[0])
        owners[i] = segment_start
        return self._views[i]

    def buffer_of(self, segment_start: int) -> memoryview | None:
        hit = np.flatnonzero(self.owners == segment_start)
        return self._views[int(hit[0])] if len(hit) else None

    def take_back(self, committed: int) -> int:
        """Free the buffers of segments that lie wholly below ``committed``; returns how many."""
        owners = self.owners
        done = (owners != FREE) & (owners + self.buffer_bytes <= committed)
        count = int(np.count_nonzero(done))
        if count:
            owners[done] = FREE
        return count

    def close(self) -> None:
        """Detach; the owner removes the pool unless ``keep_on_close`` says it still holds
        records not yet in their files (the next open salvages them)."""
        if self.owners is None:
            return
        self.owners = None
        for view in self._views:
            view.release()
        self._views = []
        close_segment(self.shm, self.owner and not self.keep_on_close, self._tracked)


def salvage(name: str, segments) -> list[str]:
    """Write back what a killed store's pool held and its files did not, then remove the pool.

    Each owned buffer mirrors its segment from where the segment was lent on. After the
    records the segment file already holds intact, every record the buffer holds intact at its
    own offset (CRC checked) is copied into the file, up to the first that is not, or the
    blank that closes the segment. Returns notes on what was written back.
    """
    try:
        shm, _owner = open_segment(name, 0, create=False, tracked=False)
    except FileNotFoundError:
        return []
    notes = []
    try:
        count = HEADER_BYTES // 8
        owners = np.ndarray((count,), dtype=np.int64, buffer=shm.buf).copy()
        size = segments.segment_bytes
        buffers = (shm.size - HEADER_BYTES) // size if size else 0
        for i, start in enumerate(owners[:buffers].tolist()):
            seg = segments.find(start) if start != FREE else None
            if seg is None or seg.start != start or seg.read_only:
                continue
            at = HEADER_BYTES + i * size
            written = _write_back(seg, shm.buf[at:at + size])
            if written:
                notes.append(f"transient pool held {written} bytes of segment {seg.path} that "
                             f"were not in the file: written back")
    finally:
        shm.close()
        unlink_segment(name)
    return notes


def _write_back(seg, buf) -> int:
    begin = _intact_end(seg.mm, seg.start, seg.size)
    end = _intact_end(buf, seg.start, seg.size, begin)
    if end > begin:
        copied = nonzero_end(buf, begin, end) if end == seg.size else end
        seg.overwrite(begin, bytes(buf[begin:copied]))
        seg.force()
    return end - begin


def nonzero_end(buf, begin: int, end: int) -> int:
    """End of the last non-zero byte of ``buf[begin:end]`` (``begin`` when there is none).

    A segment closed in a pool buffer ends with the blank's header and zeros to the segment's
    end: copies into the file stop here, leaving that tail a hole as the mmap writer does (no
    reader looks past a closing blank, and no append reserved blocks for it)."""
    data = np.frombuffer(buf, dtype=np.uint8)
    hi, chunk = end, 1 << 16
    while hi > begin:  # from the end, in growing chunks: the tail is usually short
        lo = max(begin, hi - chunk)
        nz = np.flatnonzero(data[lo:hi])
        if len(nz):
            return lo + int(nz[-1]) + 1
        hi, chunk = lo, min(chunk * 2, 1 << 24)
    return begin


def _intact_end(buf, start: int, size: int, pos: int = 0) -> int:
    """End of the intact records (or the blank closing the segment) ``buf`` holds from ``pos``,
    for a segment starting at commit-log offset ``start``."""
    while pos < size:
        kind, length, _head = scan_record(buf, pos, size, True, expected_phys=start + pos)
        if kind == SCAN_OK:
            pos += length
        elif kind == SCAN_BLANK and length == size - pos:
            return size
        else:
            break
    return pos

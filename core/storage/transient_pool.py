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

from mqstore.storage.shared_segment import close_segment, open_segment

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
    def __init__(self, buffers: int, buffer_bytes: int, name: str | None = None) -> None:
        if buffers < 1 or buffers * 8 > HEADER_BYTES:
            raise ValueError(f"a transient pool holds 1 to {HEADER_BYTES // 8} buffers, not {buffers}")
        self.buffers = buffers
        self.buffer_bytes = buffer_bytes
        self.shm, self.owner = open_segment(name, HEADER_BYTES + buffers * buffer_bytes)
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
        A pool the shared-memory file system cannot hold is refused here with its sizes, not
        left to fail with SIGBUS on some later append.
        """
        size = self.buffers * self.buffer_bytes
        if self.owner:
            self._check_room(size)
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
        if self.owners is None:
            return
        self.owners = None
        for view in self._views:
            view.release()
        self._views = []
        close_segment(self.shm, self.owner)

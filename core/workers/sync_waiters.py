"""Sync-flush puts woken straight by the flush loop, one pipe per waiting put.

A put waiting for its bytes to reach the disk takes a free slot: it writes its end offset into
the slot's shared cell and sleeps on the slot's pipe. After every force the flush loop writes
one byte into the pipe of each slot its new flushed end covers. The wake-ups thus come from
the flush process, which does not hold the store's GIL: the store process spends no time
releasing waiters one by one, and every woken producer takes the GIL as the one before it goes
back to sleep. A put that finds every slot taken polls the flushed end each millisecond
instead (RocketMQ's 1 ms retry loop).

Each cell has one writer, the store (end offset, 0 when free); the flush loop keeps, in its
own memory, the end it last woke each slot for, so it never wakes a slot twice for one put. A
stale byte (left by a put that timed out just before its wake-up came) only makes the next
user of the slot look at the flushed end once more. Store-load order: the put publishes its
cell under a lock and reads FLUSHED after releasing it; the loop stores FLUSHED and passes a
lock before it reads the cells, so one of the two always sees the other. A put also re-reads
FLUSHED every RECHECK_S, which bounds the cost of any lost wake-up.
"""

from __future__ import annotations

import os
import select
import threading
import time

import numpy as np

from mqstore.workers import shm

RECHECK_S = 0.01
OVERFLOW_POLL_S = 0.001
_fence = threading.Lock()


def fence() -> None:
    """A full memory barrier on the way (a lock round trip is a locked instruction)."""
    with _fence:
        pass


class SyncWaiters:
    """The store's side: slots, their pipes, and the wait."""

    def __init__(self, positions: shm.SharedPositions, ctx) -> None:
        self.p = positions
        self.cells = positions.waiters
        self.cells[:] = 0
        pipes = [ctx.Pipe(duplex=False) for _ in range(len(self.cells))]
        self.readers = [r for r, _ in pipes]
        self.writers = [w for _, w in pipes]  # the flush loop's ends (passed to its process)
        self._read_fds = [r.fileno() for r in self.readers]
        for w in self.writers:
            os.set_blocking(w.fileno(), False)
        self._free = list(range(len(self.cells)))
        self._lock = threading.Lock()
        self._inside = 0
        self.cancelled = False

    def wait(self, end: int, timeout_s: float, ask) -> bool:
        """Wait until FLUSHED >= ``end`` (True) or ``timeout_s`` passes (False). ``ask()`` runs
        once the slot is published: it requests the flush and wakes the loop."""
        p = self.p
        with self._lock:
            if p[shm.FLUSHED] >= end:
                return True
            if self.cancelled:
                return False
            slot = self._free.pop() if self._free else None
            if slot is not None:
                self.cells[slot] = end
            self._inside += 1
        try:
            ask()
            deadline = time.monotonic() + timeout_s
            fd = self._read_fds[slot] if slot is not None else None
            while p[shm.FLUSHED] < end and not self.cancelled:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if fd is None:
                    time.sleep(min(left, OVERFLOW_POLL_S))
                elif select.select((fd,), (), (), min(left, RECHECK_S))[0]:
                    os.read(fd, 64)
            return p[shm.FLUSHED] >= end
        finally:
            with self._lock:
                if slot is not None:
                    self.cells[slot] = 0
                    self._free.append(slot)
                self._inside -= 1

    def cancel(self) -> None:
        """Send every waiting put back now (the flush loop is gone without a final flush)."""
        self.cancelled = True
        for w in self.writers:
            try:
                os.write(w.fileno(), b"\0")
            except OSError:
                pass

    def close(self, timeout_s: float = 1.0) -> None:
        """Close the pipes once no put sleeps on them (bounded by ``timeout_s``)."""
        self.cancel()
        deadline = time.monotonic() + timeout_s
        while self._inside and time.monotonic() < deadline:
            time.sleep(OVERFLOW_POLL_S)
        for conn in self.readers + self.writers:
            conn.close()


class Waker:
    """The flush loop's side: after each force, wake the slots the flushed end covers."""

    def __init__(self, positions: shm.SharedPositions, writer_fds: list[int]) -> None:
        self.cells = positions.waiters
        self.fds = writer_fds
        self.woken = np.zeros(len(writer_fds), dtype=np.int64)

    def wake(self, flushed: int) -> int:
        """Wake the puts ``flushed`` covers; returns how many."""
        fence()  # FLUSHED is stored: read the cells only after it is visible
        cells = self.cells.copy()  # one snapshot: a slot may change hands meanwhile
        due = np.flatnonzero((cells > 0) & (cells <= flushed) & (cells != self.woken))
        for slot in due.tolist():
            self.woken[slot] = cells[slot]
            try:
                os.write(self.fds[slot], b"\0")
            except BlockingIOError:  # a full pipe wakes its reader all the same
                pass
        return len(due)

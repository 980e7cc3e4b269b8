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
lock before it reads the cells. On x86 a lock round trip is a full barrier, so one of the two
always sees the other; wherever it is not, a put still re-reads FLUSHED every RECHECK_S, which
bounds the cost of any lost wake-up.
"""

from __future__ import annotations

import logging
import os
import select
import threading
import time

import numpy as np

from mqstore.runtime.workers import shm

log = logging.getLogger(__name__)
RECHECK_S = 0.01
OVERFLOW_POLL_S = 0.001
_fence = threading.Lock()


def fence() -> None:
    """A full memory barrier on the way (a lock round trip is a locked instruction)."""
    with _fence:
        pass


class SyncWaiters:
    """The store's side: slots, their pipes, and the wait."""

    def __init__(self, channels: shm.Channels, ctx) -> None:
        self.flush = channels.flush
        self.cells = channels.waiters
        self.cells[:] = 0
        pipes = [ctx.Pipe(duplex=False) for _ in range(len(self.cells))]
        self.readers = [r for r, _ in pipes]
        self.writers = [w for _, w in pipes]  # the flush loop's ends (passed to its process)
        self._polls = []
        for r in self.readers:
            poller = select.poll()  # poll, unlike select, takes descriptors past 1024
            poller.register(r.fileno(), select.POLLIN)
            self._polls.append(poller)
        for w in self.writers:
            os.set_blocking(w.fileno(), False)
        self._free = list(range(len(self.cells)))
        self._lock = threading.Lock()
        self._inside = 0
        self.cancelled = False

    def wait(self, end: int, timeout_s: float, ask) -> bool:
        """Wait until the flushed end >= ``end`` (True) or ``timeout_s`` passes (False). ``ask()`` runs
        once the slot is published: it requests the flush and wakes the loop."""
        flush = self.flush
        with self._lock:
            if flush.flushed >= end:
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
            poller = self._polls[slot] if slot is not None else None
            while flush.flushed < end and not self.cancelled:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if poller is None:
                    time.sleep(min(left, OVERFLOW_POLL_S))
                elif poller.poll(1000.0 * min(left, RECHECK_S)):
                    os.read(self.readers[slot].fileno(), 64)
            return flush.flushed >= end
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
        """Close the pipes once no put sleeps on them; if one still does after ``timeout_s``,
        leave them open rather than pull a descriptor from under it."""
        self.cancel()
        deadline = time.monotonic() + timeout_s
        while self._inside and time.monotonic() < deadline:
            time.sleep(OVERFLOW_POLL_S)
        if self._inside:
            log.warning("%d sync-flush puts still waiting at close; their pipes stay open",
                        self._inside)
            return
        for conn in self.readers + self.writers:
            conn.close()


class Waker:
    """The flush loop's side: after each force, wake the slots the flushed end covers. It
    holds its own duplicates of the pipes' write ends, closed by ``close``, so the store
    closing its ends never leaves this side writing to a descriptor number reused since."""

    def __init__(self, channels: shm.Channels, writers) -> None:
        self.cells = channels.waiters
        self.fds = [os.dup(w.fileno()) for w in writers]
        for fd in self.fds:
            os.set_blocking(fd, False)
        self.woken = np.zeros(len(self.fds), dtype=np.int64)

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
            except OSError:  # the store is gone; its puts re-read FLUSHED anyway
                pass
        return len(due)

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []

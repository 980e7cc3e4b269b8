"""Dispatch wake-ups for coroutines: long-polling receives sleep in the event loop, not in
threads.

One thread sleeps on the store's wakeup word (NOTE [ Long polling ] in
``mqstore.runtime.workers.wakeup``: the dispatch loop advances it after each batch it made visible and
wakes its futex). Each time the word moves, the thread has the event loop resolve the current
"changed" future and put a fresh one in its place; every waiting receive awaits that future.
A waiter reads the word before it pops and waits only while the word still equals what it
read: a batch dispatched between its pop and its wait has moved the word already, so it pops
again at once and nothing is missed. ``stop`` resolves the future for good, so every waiter
returns at once and sees the endpoint stopping.

The thread watches only while some receive waits (a busy producer makes the dispatch loop
advance the word per batch; waking a thread and the loop for each, with nobody to tell, would
cost every send). It then sleeps on an event the first waiter sets. Coming back, it tells the
waiters at once if the word moved since it last told them, since a batch may have been
dispatched after a waiter looked but before the thread watched again; at worst that is one
extra pop per waiter.
"""

from __future__ import annotations

import asyncio
import threading

from mqstore.runtime.workers.wakeup import Wakeup

WATCH_SLICE_S = 0.5  # the watching thread looks at the stop flag at least this often


class DispatchWaiter:
    """The store's wakeup word, watched for ``loop``. ``wait`` runs on the loop's thread."""

    def __init__(self, root: str, loop: asyncio.AbstractEventLoop) -> None:
        self._wakeup = Wakeup(root)
        self._loop = loop
        self._changed: asyncio.Future = loop.create_future()
        self._stopped = False
        self._waiting = 0  # receives in ``wait`` now
        self._active = threading.Event()  # set by the first of them: watch the word
        self._thread = threading.Thread(target=self._watch, name="mqstore-grpc-wakeup",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def stopped(self) -> bool:
        return self._stopped

    @property
    def waiting(self) -> int:
        """Receives waiting now (an int read: any thread may ask)."""
        return self._waiting

    def sequence(self) -> int:
        return self._wakeup.sequence()

    async def wait(self, seen: int, timeout_s: float) -> None:
        """Return when the word differs from ``seen``, ``timeout_s`` passed, or ``stop``."""
        if self._stopped or timeout_s <= 0:
            return
        self._waiting += 1  # before the look below: the thread sees us, or we see the batch
        try:
            if self._wakeup.sequence() != seen:
                return
            if self._waiting == 1:
                self._active.set()
            await asyncio.wait_for(asyncio.shield(self._changed), timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiting -= 1

    def _watch(self) -> None:
        told = self._wakeup.sequence()  # the word as the waiters were last told it
        while not self._stopped:
            if not self._waiting:
                self._active.wait(WATCH_SLICE_S)
                self._active.clear()
                continue
            now = self._wakeup.sequence()
            if now == told:
                self._wakeup.wait(told, WATCH_SLICE_S)
                now = self._wakeup.sequence()
            if now != told and not self._stopped:
                told = now
                try:
                    self._loop.call_soon_threadsafe(self._fire)
                except RuntimeError:  # the loop closed under us: nobody is waiting
                    return

    def _fire(self) -> None:
        changed = self._changed
        if not self._stopped:
            self._changed = self._loop.create_future()
        if not changed.done():
            changed.set_result(None)

    def stop(self) -> None:
        """Every waiter returns now and later waits return at once. Loop thread only."""
        self._stopped = True
        self._fire()
        self._active.set()
        self._wakeup.wake_all()

    def close(self) -> None:
        """After ``stop``: join the watching thread, unmap the word."""
        self._thread.join(2 * WATCH_SLICE_S + 1)
        if not self._thread.is_alive():
            self._wakeup.close()


__all__ = ["DispatchWaiter"]

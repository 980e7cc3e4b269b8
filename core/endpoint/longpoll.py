"""Dispatch wake-ups for coroutines: long-polling receives sleep in the event loop, not in
threads.

A ``WakeupWatch`` thread (``mqstore.runtime.workers.wakeup_watch``) has the event loop
resolve the current "changed" future each time the store's wakeup word moves (NOTE [ Long
polling ] in ``mqstore.runtime.workers.wakeup``) and put a fresh one in its place; every waiting
receive awaits that future. A waiter reads the word before it pops and waits only while the word
still equals what it read: a batch dispatched between its pop and its wait has moved the word
already, so it pops again at once and nothing is missed. ``stop`` resolves the future for good,
so every waiter returns at once and sees the endpoint stopping. The thread watches only while
some receive waits.
"""

from __future__ import annotations

import asyncio

from mqstore.runtime.workers.wakeup_watch import WakeupWatch


class DispatchWaiter:
    """The store's wakeup word, watched for ``loop``. ``wait`` runs on the loop's thread."""

    def __init__(self, root: str, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._changed: asyncio.Future = loop.create_future()
        self._stopped = False
        self._waiting = 0  # receives in ``wait`` now
        self._watch = WakeupWatch(root, loop, self._fire, lambda: self._waiting > 0,
                                  name="mqstore-grpc-wakeup")
        self._wakeup = self._watch.wakeup

    def start(self) -> None:
        self._watch.start()

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
                self._watch.poke()
            await asyncio.wait_for(asyncio.shield(self._changed), timeout_s)
        except asyncio.TimeoutError:
            pass
        finally:
            self._waiting -= 1

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
        self._watch.stop()

    def close(self) -> None:
        """After ``stop``: join the watching thread, unmap the word."""
        self._watch.close()


__all__ = ["DispatchWaiter"]

"""A thread that hands moves of the store's wakeup word to an asyncio loop (NOTE [ Long
polling ] in ``mqstore.runtime.workers.wakeup``), for servers whose held requests wait in the
loop rather than in threads (the gRPC endpoint's receives, the remoting server's pulls).

The thread watches only while its owner says someone waits (``wanted``): a busy producer makes
the dispatch loop advance the word per batch, and waking a thread and the loop for each, with
nobody to tell, would cost every send. Otherwise it sleeps on an event the owner sets
(``poke``) once ``wanted`` turned true. Coming back, it tells the loop at once if the word moved
since it last told it, since a batch may have been dispatched after a waiter looked but before
the thread watched again; at worst that is one extra look per waiter.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Callable

from mqstore.runtime.workers.wakeup import Wakeup

WATCH_SLICE_S = 0.5  # the thread looks at the stop flag at least this often


class WakeupWatch:
    """``on_change`` runs on ``loop``'s thread each time the word moved while ``wanted()``
    (read from the watching thread: a plain flag or counter). Set what ``wanted`` reads
    before ``poke``, so the thread either sees it or is woken to look again."""

    def __init__(self, root: str, loop: asyncio.AbstractEventLoop,
                 on_change: Callable[[], None], wanted: Callable[[], bool], name: str) -> None:
        self.wakeup = Wakeup(root)
        self._loop = loop
        self._on_change = on_change
        self._wanted = wanted
        self._stopped = False
        self._poked = threading.Event()
        self._thread = threading.Thread(target=self._watch, name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def poke(self) -> None:
        self._poked.set()

    def _watch(self) -> None:
        told = self.wakeup.sequence()  # the word as the loop was last told it
        while not self._stopped:
            if not self._wanted():
                self._poked.wait(WATCH_SLICE_S)
                self._poked.clear()
                continue
            now = self.wakeup.sequence()
            if now == told:
                self.wakeup.wait(told, WATCH_SLICE_S)
                now = self.wakeup.sequence()
            if now != told and not self._stopped:
                told = now
                try:
                    self._loop.call_soon_threadsafe(self._on_change)
                except RuntimeError:  # the loop closed under us: nobody waits
                    return

    def stop(self) -> None:
        """The thread ends within a slice; any thread may call it."""
        self._stopped = True
        self._poked.set()
        self.wakeup.wake_all()

    def close(self) -> None:
        """After ``stop``: join the thread, unmap the word."""
        self._thread.join(2 * WATCH_SLICE_S + 1)
        if not self._thread.is_alive():
            self.wakeup.close()


__all__ = ["WakeupWatch"]

"""Dispatch wake-ups for held pulls: one thread sleeps on the store's wakeup word (NOTE [ Long
polling ] in ``mqstore.runtime.workers.wakeup``: the dispatch loop advances it after each batch
it made visible) while pulls are held, and has the event loop look at them each time it moves.

The thread watches only while some pull is held (``watch``/``idle``): a busy producer
advances the word per batch, and waking a thread and the loop for each with nobody to tell
would cost every send. Coming back to watch, it tells the loop at once if the word moved since
it last told it, since a batch may have been dispatched after a pull was held but before the
thread watched again.
"""

from __future__ import annotations

import threading

from mqstore.runtime.workers.wakeup import Wakeup

WATCH_SLICE_S = 0.5  # the thread looks at the stop flag at least this often


class DispatchWatch:
    def __init__(self, root: str, loop, on_change) -> None:
        self._wakeup = Wakeup(root)
        self._loop = loop
        self._on_change = on_change  # called on the loop's thread
        self._stopped = False
        self._active = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="mqstore-remoting-wakeup",
                                        daemon=True)

    def start(self) -> None:
        self._thread.start()

    def watch(self) -> None:
        """Some pull is held: watch the word."""
        self._active.set()

    def idle(self) -> None:
        """No pull is held."""
        self._active.clear()

    def _watch(self) -> None:
        told = self._wakeup.sequence()
        while not self._stopped:
            if not self._active.is_set():
                self._active.wait(WATCH_SLICE_S)
                continue
            now = self._wakeup.sequence()
            if now == told:
                self._wakeup.wait(told, WATCH_SLICE_S)
                now = self._wakeup.sequence()
            if now != told and not self._stopped:
                told = now
                try:
                    self._loop.call_soon_threadsafe(self._on_change)
                except RuntimeError:  # the loop closed: nobody is held
                    return

    def stop(self) -> None:
        self._stopped = True
        self._active.set()
        self._wakeup.wake_all()
        self._thread.join(2 * WATCH_SLICE_S + 1)
        if not self._thread.is_alive():
            self._wakeup.close()


__all__ = ["DispatchWatch"]

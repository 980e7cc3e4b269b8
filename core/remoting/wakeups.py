"""Dispatch wake-ups for held pulls: while pulls are held (``watch``/``idle``), a
``WakeupWatch`` thread (``mqstore.runtime.workers.wakeup_watch``) has the event loop look at
them each time the store's wakeup word moves (NOTE [ Long polling ] in
``mqstore.runtime.workers.wakeup``).
"""

from __future__ import annotations

from mqstore.runtime.workers.wakeup_watch import WakeupWatch


class DispatchWatch:
    def __init__(self, root: str, loop, on_change) -> None:
        self._held = False
        self._watch = WakeupWatch(root, loop, on_change, lambda: self._held,
                                  name="mqstore-remoting-wakeup")

    def start(self) -> None:
        self._watch.start()

    def watch(self) -> None:
        """Some pull is held: watch the word."""
        self._held = True
        self._watch.poke()

    def idle(self) -> None:
        """No pull is held."""
        self._held = False

    def stop(self) -> None:
        self._watch.stop()
        self._watch.close()


__all__ = ["DispatchWatch"]

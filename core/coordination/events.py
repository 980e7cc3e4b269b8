"""The integration's callbacks, run one at a time and in the order the events happened, on a
thread of their own (``mqstore-coordination-events``).

So a slow callback (a promotion that takes a second) never delays a keepalive or the fencing
watchdog, and ``on_elected`` is always seen before the ``on_fenced`` that ends the same term.
What actually stops writes is ``may_write()``, which needs no callback to have run. A callback
that raises is logged and the next event still runs.
"""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

log = logging.getLogger(__name__)
JOIN_S = 5.0


class Events:
    def __init__(self) -> None:
        self._queue: queue.Queue[tuple[Callable[..., Any], tuple] | None] = queue.Queue()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name="mqstore-coordination-events")
            self._thread.start()

    def fire(self, callback: Callable[..., Any] | None, *args: Any) -> None:
        if callback is not None:
            self._queue.put((callback, args))

    def stop(self) -> None:
        """Run what is queued, then end (bounded by ``JOIN_S``)."""
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join(JOIN_S)
            self._thread = None

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            callback, args = item
            try:
                callback(*args)
            except Exception:
                log.exception("coordination: callback %s%r failed",
                              getattr(callback, "__name__", callback), args)


__all__ = ["Events"]

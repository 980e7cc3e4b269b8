"""A thread of the writer that ticks while its store is a master: the one of the schedule
(``runtime.schedule``) and the one of the transaction checker (``runtime.transactions``).

Every ``tick_s`` it runs its service's tick, unless the store's role refuses writes (a slave,
whose schedule and checks are its master's): then it runs ``on_slave`` instead, so that the
service reads its state anew once it is a master again. A tick that returns true left work
waiting, and the next one runs at once. A tick that raises is logged on the service's logger
(a ``CorruptStateError`` as its message, anything else with its traceback), and the next one
waits ``retry_s``.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable

from mqstore.errors import CorruptStateError


class MasterTicker:
    """The ticking thread of one service (see the module docstring); ``what`` begins its
    log lines."""

    def __init__(self, name: str, tick: Callable[[], object], *, role,
                 on_slave: Callable[[], None], log: logging.Logger, what: str,
                 tick_s: float, retry_s: float) -> None:
        self.name = name
        self.tick = tick
        self.role = role
        self.on_slave = on_slave
        self.log = log
        self.what = what
        self.tick_s = tick_s
        self.retry_s = retry_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """End the thread, after the tick under way; for good (a stopped ticker ticks no
        more)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def pause(self, seconds: float) -> None:
        """Wait ``seconds`` within a tick, or until the thread is stopped."""
        self._stop.wait(seconds)

    def _run(self) -> None:
        while not self._stop.is_set():
            pause = self.tick_s
            try:
                if self.role.refusal() is not None:
                    self.on_slave()
                elif self.tick():
                    pause = 0
            except CorruptStateError as exc:
                self.log.error("%s: %s", self.what, exc)
                pause = self.retry_s
            except Exception:
                self.log.exception("%s: a tick failed; trying again", self.what)
                pause = self.retry_s
            if pause:
                self._stop.wait(pause)

"""Whether a long poll is asleep on the dispatch notification (``Wakeup.wait``, NOTE [ Long
polling ] in mqstore.runtime.workers.wakeup) before a test sends what must wake it: without
that, a message put before the poll went to sleep is found by its first look, and the test
never sees a wake-up."""

from __future__ import annotations

import threading

from mqstore.runtime.workers.wakeup import Wakeup

ASLEEP_TIMEOUT_S = 60.0


class WakeupWatch:
    """Counts the waits on ``Wakeup`` begun in this process (a poll, a pop, a peek, a bare
    waiter), with ``monkeypatch``: ``mark()`` before starting the waiter, then
    ``asleep(mark)`` returns once a wait began after it."""

    def __init__(self, monkeypatch) -> None:
        self._changed = threading.Condition()
        self.begun = 0
        real = Wakeup.wait

        def wait(wakeup, seen, timeout_s):
            with self._changed:
                self.begun += 1
                self._changed.notify_all()
            # A put landing between the count and the futex changes the word first: the wait
            # then returns at once, through the notification still.
            return real(wakeup, seen, timeout_s)
        monkeypatch.setattr(Wakeup, "wait", wait)

    def mark(self) -> int:
        with self._changed:
            return self.begun

    def asleep(self, mark: int, waiters: int = 1, timeout: float = ASLEEP_TIMEOUT_S) -> None:
        """Until ``waiters`` waits began after ``mark``; AssertionError after ``timeout``."""
        with self._changed:
            if not self._changed.wait_for(lambda: self.begun >= mark + waiters, timeout):
                raise AssertionError(f"{waiters} waits on the notification did not begin "
                                     f"within {timeout} s ({self.begun - mark} did)")

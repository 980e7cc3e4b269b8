"""What the broker counts for ``mqadmin`` (``BrokerStatsManager``, ``StoreStatsService``):
messages put and got today, and throughput over the last minute. Loop thread only."""

from __future__ import annotations

import time
from collections import deque

WINDOW_S = 60.0
MAX_GROUP_WINDOWS = 4096  # (group, topic) pairs counted; past it the counts start over


class Stats:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self.started_ms = int(time.time() * 1000)
        self.put_messages = 0
        self.got_messages = 0
        self.got_bytes = 0
        self._puts: deque = deque()  # (time, messages)
        self._gets: deque = deque()
        self._group_gets: dict[tuple[str, str], deque] = {}

    def put(self, n: int) -> None:
        self.put_messages += n
        self._add(self._puts, n)

    def got(self, group: str, topic: str, n: int, nbytes: int) -> None:
        self.got_messages += n
        self.got_bytes += nbytes
        self._add(self._gets, n)
        windows = self._group_gets
        window = windows.get((group, topic))
        if window is None:
            if len(windows) >= MAX_GROUP_WINDOWS:
                windows.clear()
            window = windows[(group, topic)] = deque()
        self._add(window, n)

    def _add(self, window: deque, n: int) -> None:
        now = self._clock()
        window.append((now, n))
        while window and now - window[0][0] > WINDOW_S:
            window.popleft()

    def _tps(self, window: deque) -> float:
        now = self._clock()
        while window and now - window[0][0] > WINDOW_S:
            window.popleft()
        return sum(n for _t, n in window) / WINDOW_S

    def put_tps(self) -> float:
        return self._tps(self._puts)

    def get_tps(self) -> float:
        return self._tps(self._gets)

    def group_tps(self, group: str, topic: str) -> float:
        window = self._group_gets.get((group, topic))
        return self._tps(window) if window is not None else 0.0


__all__ = ["Stats"]

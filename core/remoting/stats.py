"""What the broker counts for ``mqadmin`` (``StoreStatsService``, ``BrokerStats``): messages
put and got, pulls that found messages and pulls that did not, their rates over the last 10,
60 and 600 seconds, and the totals at this morning's and yesterday's midnight.

NOTE [ Broker stats ]
A request only adds to counters (pulls here; puts are the store's own count, ``put_counts``).
``sample`` runs once a second (the remoting server's loop) and appends a snapshot of the
counters to a ring of ``MAX_SAMPLES`` + 1, as RocketMQ's sampling thread does: a rate over the
last N seconds is the growth between the newest snapshot and the one N snapshots older, per
second of the time between them, and is empty until N + 1 snapshots exist (``putTps`` reads
"12.5  " for the first minute, mqadmin's clusterList reading its first figure). The first
snapshot after the local date changed moves this morning's totals to yesterday's and takes the
current totals as this morning's (``BrokerStats.record``, which RocketMQ runs at each local
midnight): both read 0 until the broker has seen a midnight, as a 4.9.8 broker's do.

Loop thread only.
"""

from __future__ import annotations

import datetime
import time
from collections import deque
from decimal import Decimal

SAMPLE_INTERVAL_S = 1.0  # StoreStatsService.FREQUENCY_OF_SAMPLING
MAX_SAMPLES = 600  # StoreStatsService.MAX_RECORDS_OF_SAMPLING: ten minutes of them
TPS_SPANS = (10, 60, 600)
GROUP_WINDOW_S = 60.0
MAX_GROUP_WINDOWS = 4096  # (group, topic) pairs counted; past it the counts start over
# What a snapshot holds, in order (after its time).
PUTS, FOUND, MISSED, GOT = range(4)


def java_double(value: float) -> str:
    """``String.valueOf(double)``: the shortest digits that read back, in plain notation from
    1e-3 up to 1e7 and as ``d.dddE±n`` outside it."""
    if value == 0 or 1e-3 <= abs(value) < 1e7:
        return repr(float(value))
    sign, digits, exponent = Decimal(repr(float(value))).as_tuple()
    power = len(digits) - 1 + exponent  # type: ignore[operator]
    rest = "".join(map(str, digits[1:])).rstrip("0") or "0"
    return f"{'-' if sign else ''}{digits[0]}.{rest}E{power}"


class Stats:
    def __init__(self, clock=time.monotonic, wall=time.time) -> None:
        self._clock = clock
        self._wall = wall
        self.started_ms = int(wall() * 1000)
        self.got_messages = 0
        self.got_bytes = 0
        self.found = 0  # pulls that found messages
        self.missed = 0  # pulls that did not
        self._samples: deque = deque(maxlen=MAX_SAMPLES + 1)  # (time, puts, found, ...)
        self._day = self._today()
        self.put_today_morning = self.put_yesterday_morning = 0
        self.got_today_morning = self.got_yesterday_morning = 0
        self._group_gets: dict[tuple[str, str], deque] = {}

    # -- what requests add -------------------------------------------------------------------
    def got(self, group: str, topic: str, n: int, nbytes: int) -> None:
        """A pull found ``n`` messages (``nbytes``) of ``topic`` for ``group``."""
        self.found += 1
        self.got_messages += n
        self.got_bytes += nbytes
        windows = self._group_gets
        window = windows.get((group, topic))
        if window is None:
            if len(windows) >= MAX_GROUP_WINDOWS:
                windows.clear()
            window = windows[(group, topic)] = deque()
        now = self._clock()
        window.append((now, n))
        self._expire(window, now)

    def miss(self) -> None:
        """A pull found nothing (no message, a filter matching none, an offset out of range)."""
        self.missed += 1

    # -- sampling -----------------------------------------------------------------------------
    def sample(self, puts_total: int) -> None:
        """One snapshot (NOTE [ Broker stats ]); ``puts_total`` is the store's put count."""
        today = self._today()
        if today != self._day:
            self._day = today
            self.put_yesterday_morning = self.put_today_morning
            self.got_yesterday_morning = self.got_today_morning
            self.put_today_morning = puts_total
            self.got_today_morning = self.got_messages
        self._samples.append((self._clock(), puts_total, self.found, self.missed,
                              self.got_messages))

    def _today(self) -> datetime.date:
        return datetime.date.fromtimestamp(self._wall())

    def rate(self, what: int, span: int) -> float | None:
        """Per second of ``what`` (``PUTS``, ``FOUND``, ``MISSED``, ``GOT``) over the last
        ``span`` samples; None until there are ``span`` + 1 of them."""
        samples = self._samples
        if len(samples) <= span:
            return None
        last, before = samples[-1], samples[-1 - span]
        elapsed = last[0] - before[0]
        return (last[1 + what] - before[1 + what]) / elapsed if elapsed > 0 else 0.0

    def rates(self, what: int) -> str:
        """``"10s 60s 600s"`` as RocketMQ prints them, a span without samples enough empty."""
        return " ".join("" if r is None else java_double(r)
                        for r in (self.rate(what, span) for span in TPS_SPANS))

    def total_get_rates(self) -> str:
        """Found plus missed pulls per second; 0 where samples are too few (``getTotalTps``)."""
        return " ".join(java_double((self.rate(FOUND, span) or 0.0)
                                    + (self.rate(MISSED, span) or 0.0)) for span in TPS_SPANS)

    # -- consume rates of a group (GET_CONSUME_STATS) -----------------------------------------
    def _expire(self, window: deque, now: float) -> None:
        while window and now - window[0][0] > GROUP_WINDOW_S:
            window.popleft()

    def group_tps(self, group: str, topic: str) -> float:
        """Messages per second ``group`` pulled of ``topic`` over the last minute."""
        window = self._group_gets.get((group, topic))
        if window is None:
            return 0.0
        self._expire(window, self._clock())
        return sum(n for _t, n in window) / GROUP_WINDOW_S


__all__ = ["Stats", "java_double", "SAMPLE_INTERVAL_S", "MAX_SAMPLES", "TPS_SPANS", "PUTS",
           "FOUND", "MISSED", "GOT"]

"""UNIQ_KEYs as RocketMQ's producers make them (``MessageClientIDSetter.createUniqID``).

    address (4 bytes) + process id (low 2 bytes) + a number drawn once per process (4 bytes)
    + milliseconds since the start of the current month, local time (4 bytes) + counter (2)

as 32 upper-case hex digits. The first 20 are the producer's own and fixed for a process; the
last 12 put the ids of one producer in the order they were made, which is store-time order: a
later id never sorts before an earlier one within a month. RocketMQ's counter wraps every
65,536 ids whatever the clock says; here an id that would wrap within the millisecond of the
one before waits for the next millisecond, so ordering never depends on the rate. The address
is the one this host reaches other hosts from, else (no route, loopback only) RocketMQ's stand-in
taken from the clock.
"""

from __future__ import annotations

import datetime as dt
import os
import random
import socket
import time
from typing import Callable

COUNTER_SPAN = 1 << 16
UNIQ_KEY_HEX = 32
ROUTE_PROBE = ("192.0.2.1", 9)  # TEST-NET-1 (RFC 5737): a route is looked up, nothing is sent


def host_address() -> bytes:
    """This host's IPv4 address as RocketMQ's ``UtilAll.getIP`` would pick it (not loopback),
    else ``createFakeIP``'s: the low four bytes of the clock in ms."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(ROUTE_PROBE)  # UDP: binds a local address, sends nothing
            address = probe.getsockname()[0]
        if not address.startswith(("127.", "0.")):
            return socket.inet_aton(address)
    except OSError:
        pass
    return (time.time_ns() // 1_000_000).to_bytes(8, "big")[4:]


def month_start_ms(now_ms: int) -> tuple[int, int]:
    """The local-time start of the month holding ``now_ms``, and of the next one (epoch ms)."""
    # Naive local times: ``timestamp`` reads each in the offset (daylight saving) it falls in.
    start = dt.datetime.fromtimestamp(now_ms / 1000).replace(
        day=1, hour=0, minute=0, second=0, microsecond=0)
    following = (start + dt.timedelta(days=32)).replace(day=1)
    return int(start.timestamp() * 1000), int(following.timestamp() * 1000)


class UniqKeys:
    """Makes the UNIQ_KEYs of one producing process, many at a time."""

    def __init__(self, address: bytes | None = None, pid: int | None = None,
                 salt: int | None = None, now_ms: Callable[[], int] | None = None,
                 counter: int = 0) -> None:
        address = host_address() if address is None else address
        pid = os.getpid() if pid is None else pid
        salt = random.getrandbits(32) if salt is None else salt
        self.prefix = (address + (pid & 0xFFFF).to_bytes(2, "big")
                       + salt.to_bytes(4, "big")).hex().upper()
        self._now_ms = now_ms or (lambda: time.time_ns() // 1_000_000)
        self._counter = counter % COUNTER_SPAN
        self._month = (0, 0)
        self._last = -1  # the ms field of the last id made

    def take(self, n: int) -> list[str]:
        """``n`` new ids, in the order they sort."""
        ids: list[str] = []
        while len(ids) < n:
            elapsed = self._elapsed()
            if self._counter == 0 and elapsed == self._last:
                elapsed = self._wait_past(elapsed)  # the counter wrapped in this millisecond
            run = min(n - len(ids), COUNTER_SPAN - self._counter)
            head = f"{self.prefix}{elapsed:08X}"
            ids += [f"{head}{c:04X}" for c in range(self._counter, self._counter + run)]
            self._counter = (self._counter + run) % COUNTER_SPAN
            self._last = elapsed
        return ids

    def _elapsed(self) -> int:
        """Milliseconds since the month's start, never less than the last id's."""
        now = self._now_ms()
        if not self._month[0] <= now < self._month[1]:
            self._month = month_start_ms(now)
            self._last = -1  # a new month starts the field again, as RocketMQ's does
        return max(now - self._month[0], self._last)

    def _wait_past(self, elapsed: int) -> int:
        """The first millisecond field after ``elapsed`` (or of a new month), waited for."""
        month = self._month
        while (later := self._elapsed()) <= elapsed and self._month == month:
            time.sleep(0.0005)
        return later

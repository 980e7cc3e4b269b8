"""Repeated log records, rate-limited: what a stranger can make a server log (a malformed
request, a cancelled call) must not fill its log.

``RateLimit`` is a ``logging.Filter``: the first record of a kind in an interval passes, as
one line (its exception summarised as ``Type: message``, the traceback dropped); the others
of that kind in the interval are counted, and the next one to pass says how many were
suppressed. A kind is the logger, the level, the message template and the exception's type
(``kind_of``). ``limit(logger, ...)`` puts one on a logger and returns it (``remove`` takes
it off).

    limiter = log_limit.limit(logging.getLogger("grpc._cython.cygrpc"), level=logging.WARNING)
"""

from __future__ import annotations

import logging
import threading
import time

DEFAULT_INTERVAL_S = 60.0
MAX_KINDS = 1024  # kinds remembered; past it the oldest are forgotten


def kind_of(record: logging.LogRecord) -> tuple:
    exc = record.exc_info[1] if record.exc_info else None
    return (record.name, record.levelno, str(record.msg),
            type(exc).__name__ if exc is not None else None)


class RateLimit(logging.Filter):
    """At most one record of each kind per ``interval_s`` (by ``clock``), as one line; records
    below ``level`` pass as they are."""

    def __init__(self, interval_s: float = DEFAULT_INTERVAL_S, clock=time.monotonic,
                 level: int = logging.NOTSET) -> None:
        super().__init__()
        self.interval_s = interval_s
        self.level = level
        self._clock = clock
        self._lock = threading.Lock()
        self._kinds: dict = {}  # kind -> [when it last passed, suppressed since]

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < self.level:
            return True
        kind = kind_of(record)
        now = self._clock()
        with self._lock:
            seen = self._kinds.get(kind)
            if seen is not None and now - seen[0] < self.interval_s:
                seen[1] += 1
                return False
            suppressed = seen[1] if seen is not None else 0
            self._kinds.pop(kind, None)
            self._kinds[kind] = [now, 0]
            if len(self._kinds) > MAX_KINDS:
                del self._kinds[next(iter(self._kinds))]
        _one_line(record, suppressed, self.interval_s)
        return True


def _one_line(record: logging.LogRecord, suppressed: int, interval_s: float) -> None:
    """The record as one line: its exception summarised, the count of those suppressed."""
    message = record.getMessage()
    if record.exc_info and record.exc_info[1] is not None:
        exc = record.exc_info[1]
        message = f"{message}: {type(exc).__name__}: {exc}"
    message = " ".join(message.split())
    if suppressed:
        message += (f" ({suppressed} more like it in the last {interval_s:g} s were not "
                    f"logged)")
    record.msg, record.args = message, None
    record.exc_info = record.exc_text = record.stack_info = None


def limit(logger: logging.Logger, interval_s: float = DEFAULT_INTERVAL_S,
          clock=time.monotonic, level: int = logging.NOTSET) -> RateLimit:
    """Rate-limit ``logger``'s own records (not its children's) from ``level`` up; returns the
    filter."""
    limiter = RateLimit(interval_s, clock, level)
    logger.addFilter(limiter)
    return limiter


def remove(logger: logging.Logger, limiter: RateLimit) -> None:
    logger.removeFilter(limiter)


__all__ = ["RateLimit", "limit", "remove", "kind_of", "DEFAULT_INTERVAL_S"]

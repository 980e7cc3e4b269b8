"""``mqstore.log_limit``: repeated records of a kind pass once an interval, as one line, and the
next one to pass counts those suppressed."""

from __future__ import annotations

import logging

from mqstore import log_limit


def records(logger_name: str):
    logger = logging.getLogger(logger_name)
    logger.propagate = False
    logger.setLevel(logging.DEBUG)
    caught: list[logging.LogRecord] = []

    class Catch(logging.Handler):
        def emit(self, record):
            caught.append(record)
    logger.addHandler(Catch())
    return logger, caught


def fail(logger, exc: BaseException, method: str = "/S/M") -> None:
    try:
        raise exc
    except type(exc):
        logger.exception("Unexpected [%s] raised by servicer method [%s]",
                         type(exc).__name__, method)


def test_one_line_per_kind_per_interval_with_the_count_suppressed():
    now = [0.0]
    logger, caught = records("test.log_limit.kinds")
    limiter = log_limit.limit(logger, interval_s=60, clock=lambda: now[0],
                              level=logging.WARNING)
    try:
        for _ in range(50):
            fail(logger, ValueError("wire format was corrupt"))
        for _ in range(3):
            fail(logger, KeyError("other"))  # another kind: its own line
        logger.info("below the level: %d", 1)
        logger.info("below the level: %d", 2)  # passes as it is
        assert [r.getMessage() for r in caught] == [
            "Unexpected [ValueError] raised by servicer method [/S/M]: ValueError: wire "
            "format was corrupt",
            "Unexpected [KeyError] raised by servicer method [/S/M]: KeyError: 'other'",
            "below the level: 1", "below the level: 2"]
        assert all(r.exc_info is None for r in caught)  # one line: no traceback
        now[0] = 59.9
        fail(logger, ValueError("again"))
        assert len(caught) == 4
        now[0] = 60.0
        fail(logger, ValueError("later"))
        assert caught[-1].getMessage() == (
            "Unexpected [ValueError] raised by servicer method [/S/M]: ValueError: later (50 "
            "more like it in the last 60 s were not logged)")
    finally:
        log_limit.remove(logger, limiter)
    fail(logger, ValueError("unlimited"))
    assert caught[-1].exc_info is not None  # taken off: records pass untouched


def test_the_kinds_remembered_are_bounded():
    logger, caught = records("test.log_limit.bounded")
    limiter = log_limit.limit(logger, interval_s=60, clock=lambda: 0.0)
    try:
        for i in range(log_limit.MAX_KINDS + 10):
            logger.warning(f"distinct {i}")  # each message its own kind
        assert len(caught) == log_limit.MAX_KINDS + 10
        assert len(limiter._kinds) == log_limit.MAX_KINDS
    finally:
        log_limit.remove(logger, limiter)

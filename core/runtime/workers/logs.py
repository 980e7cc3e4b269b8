"""What a worker process logs: one line per record on stderr, named, at the store's level, in
the store's style.

A worker is a process of its own (forked from multiprocessing's forkserver), so the embedding
program's logging configuration never reaches it. Left alone, Python's last-resort handler
would print a record's bare message and any traceback into the program's stderr. A worker
instead logs through the ``mqstore`` logger with one handler of its own, in the line format
of ``mqstore serve`` (``runtime.log_format``):

    2026-11-01 12:00:00,123 ERROR mqstore.dispatch[4711]: dispatch of the records at
    commit-log offset 97 failed 1 time(s): DiskFullError: no space to reserve 4096 bytes for
    ...; retrying

one line per record (time, level, logger name, pid, message; an exception as its type and
message; the example is folded here), or one JSON object per line when the store process's
``mqstore`` logger writes JSON (``server.log_format: json``), at the level that logger had
when it started the worker, so a program that quiets mqstore quiets its workers too.
Tracebacks are written only when that level is DEBUG.
"""

from __future__ import annotations

import logging
import sys
from typing import NamedTuple

from mqstore.runtime.log_format import LINE_FORMAT, JsonLines, short_exception, style_of

ROOT_LOGGER = "mqstore"


class LogSetup(NamedTuple):
    """What a worker logs like: its level and style ("text" or "json")."""

    level: int
    style: str


def store_level() -> int:
    """The level a worker started now logs at (read in the store process)."""
    logger = logging.getLogger(ROOT_LOGGER)
    return logging.CRITICAL + 1 if logger.disabled else logger.getEffectiveLevel()


def store_style() -> str:
    """The style of the first handler an ``mqstore`` record reaches in this process."""
    logger: logging.Logger | None = logging.getLogger(ROOT_LOGGER)
    while logger is not None:
        if logger.handlers:
            return style_of(logger.handlers[0].formatter)
        logger = logger.parent if logger.propagate else None
    return "text"


def store_logging() -> LogSetup:
    """Read in the store process when it starts a worker."""
    return LogSetup(store_level(), store_style())


class OneLine(logging.Formatter):
    """A record as one text line: its exception, if any, as type and message after the text,
    and no traceback (an ``exc_info`` naming no exception adds nothing); all of it at DEBUG."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__(LINE_FORMAT)
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if self.tracebacks:
            return super().format(record)
        exc = short_exception(record)
        if record.exc_info or record.exc_text or record.stack_info:
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None,
                                            "exc_text": None, "stack_info": None})
        text = super().format(record)
        if exc is not None:
            text = f"{text} ({exc})"
        return text.replace("\n", " | ")


def worker_formatter(setup: LogSetup) -> logging.Formatter:
    tracebacks = setup.level <= logging.DEBUG
    return JsonLines(tracebacks) if setup.style == "json" else OneLine(tracebacks)


def setup(log: LogSetup) -> None:
    """Called first thing in a worker process, with ``store_logging()`` of its store."""
    logger = logging.getLogger(ROOT_LOGGER)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(worker_formatter(log))
    logger.addHandler(handler)
    logger.setLevel(log.level)
    logger.propagate = False  # the forkserver's root logger holds nothing of the program's

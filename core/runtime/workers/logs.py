"""What a worker process logs: one line per record on stderr, named, at the store's level.

A worker is a process of its own (forked from multiprocessing's forkserver), so the embedding
program's logging configuration never reaches it. Left alone, Python's last-resort handler
would print a record's bare message and any traceback into the program's stderr. A worker
instead logs through the ``mqstore`` logger with one handler of its own:

    ERROR mqstore.dispatch[4711]: dispatch of the records at commit-log offset 97 failed 1
    time(s): DiskFullError: no space to reserve 4096 bytes for ...; retrying

one line per record (level, logger name, pid, message; an exception as its type and message;
the example is folded here),
at the level the ``mqstore`` logger had in the store process when it started the worker, so a
program that quiets mqstore quiets its workers too. Tracebacks are written only when that
level is DEBUG.
"""

from __future__ import annotations

import logging
import sys

LINE_FORMAT = "%(levelname)s %(name)s[%(process)d]: %(message)s"
ROOT_LOGGER = "mqstore"


def store_level() -> int:
    """The level a worker started now logs at (read in the store process)."""
    logger = logging.getLogger(ROOT_LOGGER)
    return logging.CRITICAL + 1 if logger.disabled else logger.getEffectiveLevel()


class OneLine(logging.Formatter):
    """A record as one line: its exception, if any, as type and message after the text, and
    no traceback (an ``exc_info`` naming no exception adds nothing); all of it at DEBUG."""

    def __init__(self, tracebacks: bool) -> None:
        super().__init__(LINE_FORMAT)
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        if self.tracebacks:
            return super().format(record)
        exc = record.exc_info[1] if record.exc_info else None
        if record.exc_info or record.exc_text or record.stack_info:
            record = logging.makeLogRecord({**record.__dict__, "exc_info": None,
                                            "exc_text": None, "stack_info": None})
        text = super().format(record)
        if exc is not None:
            text = f"{text} ({type(exc).__name__}: {exc})"
        return text.replace("\n", " | ")


def setup(level: int) -> None:
    """Called first thing in a worker process, with ``store_level()`` of its store."""
    logger = logging.getLogger(ROOT_LOGGER)
    for old in list(logger.handlers):
        logger.removeHandler(old)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(OneLine(tracebacks=level <= logging.DEBUG))
    logger.addHandler(handler)
    logger.setLevel(level)
    logger.propagate = False  # the forkserver's root logger holds nothing of the program's

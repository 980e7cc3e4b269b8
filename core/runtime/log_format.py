"""How a log line of mqstore looks, in ``mqstore serve`` and in its worker processes alike.

Two styles (``server.log_format``):

    text   2026-11-01 12:00:00,123 ERROR mqstore.runtime.workers.flush_worker[27381]: commit-log flush failed: ...
    json   {"timestamp": "2026-11-01T12:00:00.123+00:00", "level": "ERROR",
            "logger": "mqstore.runtime.workers.flush_worker", "pid": 27381, "message": "commit-log flush
            failed: ...", "exception": null}

A JSON line is one object with always the same keys (folded above; one physical line): the
time in UTC, ISO 8601 with milliseconds; ``exception`` is null, or the exception as its
traceback (or as ``Type: message`` where tracebacks are left out: ``tracebacks=False``); a
record's stack, if it has one, joins the exception. A log shipper reads it line by line.

Worker processes log in the style their store process's ``mqstore`` logger writes in
(``style_of``, read by ``workers.logs``), so all lines of one deployment parse alike.
"""

from __future__ import annotations

import json
import logging
from datetime import datetime, timezone

LINE_FORMAT = "%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s"
STYLES = ("text", "json")


def short_exception(record: logging.LogRecord) -> str | None:
    """The record's exception as ``Type: message`` (None: it has none)."""
    exc = record.exc_info[1] if record.exc_info else None
    return None if exc is None else f"{type(exc).__name__}: {exc}"


class JsonLines(logging.Formatter):
    """A record as one JSON object on one line (the keys above)."""

    def __init__(self, tracebacks: bool = True) -> None:
        super().__init__()
        self.tracebacks = tracebacks

    def format(self, record: logging.LogRecord) -> str:
        return json.dumps({
            "timestamp": datetime.fromtimestamp(record.created, timezone.utc).isoformat(
                timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "pid": record.process,
            "message": record.getMessage(),
            "exception": self._exception(record),
        }, ensure_ascii=False, default=str)

    def _exception(self, record: logging.LogRecord) -> str | None:
        if not self.tracebacks:
            return short_exception(record)
        parts = []
        if record.exc_info and record.exc_info[0] is not None:
            parts.append(self.formatException(record.exc_info))
        elif record.exc_text:
            parts.append(record.exc_text)
        if record.stack_info:
            parts.append(self.formatStack(record.stack_info))
        return "\n".join(parts) or None


def formatter(style: str) -> logging.Formatter:
    """The formatter of a process's own lines in ``style`` (tracebacks in full)."""
    if style == "json":
        return JsonLines()
    if style == "text":
        return logging.Formatter(LINE_FORMAT)
    raise ValueError(f"log format {style!r} must be one of {', '.join(STYLES)}")


def style_of(fmt: logging.Formatter | None) -> str:
    return "json" if isinstance(fmt, JsonLines) else "text"


__all__ = ["LINE_FORMAT", "STYLES", "JsonLines", "formatter", "style_of", "short_exception"]

"""``mqstore serve``'s log: every line of serve and of its worker processes in one format,
with a timestamp; ``server.log_format: json`` makes each line one JSON object."""

from __future__ import annotations

import json
import logging
import os
import re
import signal

import pytest

from mqstore.runtime.log_format import JsonLines, formatter
from mqstore.testing import wait_for
from cli_support import SMALL_CONFIG
from serve_support import STOP_TIMEOUT_S, start

pytestmark = pytest.mark.usefixtures("no_plugin_env")
TEXT_LINE = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3}) (DEBUG|INFO|WARNING|ERROR|CRITICAL) "
                       r"(mqstore(?:\.\w+)*)\[(\d+)\]: (\S.*)")
JSON_KEYS = ["timestamp", "level", "logger", "pid", "message", "exception"]


def parsed(line: str, style: str) -> dict:
    if style == "json":
        record = json.loads(line)
        assert list(record) == JSON_KEYS, line
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00",
                            record["timestamp"]), line
        return record
    found = TEXT_LINE.fullmatch(line)
    assert found, line
    return {"timestamp": found[1], "level": found[2], "logger": found[3],
            "pid": int(found[4]), "message": found[5]}


@pytest.mark.slow
@pytest.mark.parametrize("style", ["text", "json"])
def test_serve_and_its_workers_log_alike(tmp_path, style):
    root = tmp_path / "store"
    yaml_path = tmp_path / "deploy.yaml"
    chosen = "" if style == "text" else f", log_format: {style}"  # text: the default
    yaml_path.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}}}\n"
                         f"server: {{metrics_listen: \"127.0.0.1:0\"{chosen}}}\n")
    log_path = tmp_path / "serve.log"
    proc, _url = start(yaml_path, log_path)
    try:
        # The store process killed: each worker notices and logs it, on serve's stderr.
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(STOP_TIMEOUT_S)
        wait_for(lambda: log_path.read_text().count("is gone") == 2, 60,
                 what="both workers' last lines")
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
    records = [parsed(line, style) for line in log_path.read_text().splitlines()]
    serves = [r for r in records if r["pid"] == proc.pid]
    workers = [r for r in records if r["pid"] != proc.pid]
    assert serves and serves[0]["logger"] == "mqstore.ops.server", records
    assert any(r["message"].startswith("serving metrics on http://") for r in serves)
    assert sorted(r["logger"] for r in workers if "is gone" in r["message"]) == [
        "mqstore.runtime.workers.dispatch_worker",
        "mqstore.runtime.workers.flush_worker"], records
    assert all(r["level"] == "ERROR" for r in workers if "is gone" in r["message"])


def record_with(exc: BaseException | None) -> logging.LogRecord:
    return logging.LogRecord("mqstore.serve", logging.ERROR, __file__, 1, "it failed: %s",
                             ("why",), (type(exc), exc, exc.__traceback__) if exc else None)


def test_a_json_line_holds_the_exception_and_stays_one_line():
    try:
        raise ValueError("bad\nvalue")
    except ValueError as exc:
        record = record_with(exc)
    line = formatter("json").format(record)
    assert "\n" not in line
    out = json.loads(line)
    assert (out["level"], out["logger"], out["pid"], out["message"]) == (
        "ERROR", "mqstore.serve", os.getpid(), "it failed: why")
    assert out["exception"].startswith("Traceback (most recent call last):")
    assert out["exception"].endswith("ValueError: bad\nvalue")
    # Without tracebacks (a worker's, above DEBUG): the exception's type and message.
    assert json.loads(JsonLines(tracebacks=False).format(record))["exception"] == \
        "ValueError: bad\nvalue"
    assert json.loads(formatter("json").format(record_with(None)))["exception"] is None


def test_an_unknown_style_is_refused():
    with pytest.raises(ValueError, match="log format 'xml' must be one of text, json"):
        formatter("xml")

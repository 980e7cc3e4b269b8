"""Every command on a real mqstore store, run as a subprocess; --json outputs asserted exactly."""

from __future__ import annotations

import base64
import json
import os
import re

import click
import pytest
from click.testing import CliRunner

from mqstore.cli import main
from mqstore.cli.app import MqstoreGroup
from mqstore.consumer import CorruptStateError, ReceiptHandleError
from mqstore.errors import ConfigError, CorruptRecordError, StoreLockedError
from mqstore.plugins.sql92 import FilterSyntaxError
from mqstore.format.record import record_size
from cli_support import SMALL_CONFIG, error_line, mqstore, mqstore_json

pytestmark = pytest.mark.usefixtures("no_plugin_env")

COMMANDS = ("init", "produce", "consume", "query", "inspect", "check", "stats", "serve", "bench",
            "demo", "info", "export")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "small.yaml"
    path.write_text(SMALL_CONFIG + "store: {hash: java}\n")
    return str(path)


@pytest.fixture(scope="module")
def store(tmp_path_factory, config):
    """A store made by `init`, then two `produce` runs (arguments with keys, and stdin)."""
    root = tmp_path_factory.mktemp("cli") / "store"
    mqstore("init", root, "-c", config)
    first = mqstore_json("produce", root, "-c", config, "-t", "orders", "--tags", "paid",
                         "--keys", "order-1", "--keys", "shared", "-p", "region=eu",
                         "-q", "0", "hello", "world")
    lines = "".join(f"line-{i}\n" for i in range(50))
    second = mqstore_json("produce", root, "-c", config, "-t", "logs", "--summary",
                          "--lines", "-", input=lines)
    return {"root": root, "first": first, "second": second}


def test_every_command_has_help():
    # In process: --help only parses (the commands themselves run as subprocesses below).
    runner = CliRunner()
    assert "Commands:" in mqstore("--help").stdout
    for name in COMMANDS:
        result = runner.invoke(main, [name, "--help"], prog_name="mqstore")
        assert result.exit_code == 0 and f"Usage: mqstore {name}" in result.output
    for sub in ("key", "unique-key", "id", "time", "offset"):
        result = runner.invoke(main, ["query", ".", sub, "--help"], prog_name="mqstore")
        assert result.exit_code == 0 and f"Usage: mqstore query ROOT {sub}" in result.output


def test_init_records_the_settings(tmp_path, config):
    root = tmp_path / "new"
    out = mqstore_json("init", root, "-c", config)
    meta = json.loads((root / "mqstore.json").read_text())
    st = os.stat(root)
    assert out == {"root": str(root), "format": 1, "hash": "java",
                   "commit_log_segment_bytes": 65536, "consume_queue_file_bytes": 2000,
                   "store_id": meta["store_id"],
                   "directory": {"path": os.path.realpath(root), "device": st.st_dev,
                                 "inode": st.st_ino}}
    assert meta["hash"] == "java" and re.fullmatch("[0-9a-f]{32}", meta["store_id"])
    again = mqstore("init", root, check=1)
    assert error_line(again).startswith(f"Error: '{root}' already holds a store")


def test_produce_reports_every_message(store):
    first = store["first"]
    uniq = first["messages"][0]["uniq_key"]  # every message gets one, 32 hex digits
    size = record_size(5, len("orders"), len(
        f"TAGS\x01paid\x02KEYS\x01order-1 shared\x02region\x01eu\x02UNIQ_KEY\x01{uniq}\x02"
        .encode()))
    assert first["count"] == 2 and first["bytes"] == 2 * size and first["queues"] == [0]
    assert [(m["queue_id"], m["queue_offset"], m["phys_offset"], m["size"])
            for m in first["messages"]] == [(0, 0, 0, size), (0, 1, size, size)]
    assert first["messages"][1]["msg_id"] == "7F00000100002A9F" + f"{size:016X}"
    second = store["second"]
    assert second["count"] == 50 and second["queues"] == [0, 1, 2, 3]
    assert second["messages"][0]["phys_offset"] == 2 * size
    # the default selector takes queues round robin, batch by batch
    assert sorted(m["queue_offset"] for m in second["messages"] if m["queue_id"] == 0) == list(
        range(len([m for m in second["messages"] if m["queue_id"] == 0])))


@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(store, tmp_path):
    bad = mqstore("produce", store["root"], "-t", "bad topic", "x", check=2)
    assert error_line(bad) == ("Error: topic 'bad topic' must match "
                               "[%|a-zA-Z0-9_-]+ (letters, digits, %|_-)")
    assert error_line(mqstore("query", store["root"], "id", "XYZ", check=2)) == \
        "Error: msg id 'XYZ' is not a hex string"
    missing = mqstore("stats", tmp_path / "nowhere", check=2)
    assert "does not exist" in missing.stderr
    assert error_line(mqstore("produce", store["root"], "-t", "t", "-p", "novalue", "x",
                              check=2)).endswith("'novalue' is not NAME=VALUE")


@pytest.mark.parametrize("error, code", [
    (FilterSyntaxError("unexpected '='", "a = = 1", 1, 5), 2),  # a store error, and bad input
    (ConfigError("flush.interval_ms: -1 must be >= 0"), 2),
    (ReceiptHandleError("receipt handle 'x' is not one this store hands out"), 2),
    (ValueError("offset -1 must be an int >= 0"), 2),
    (CorruptRecordError("record at 96: body crc 0x1 != 0x2"), 1),  # a ValueError, but damage
    (CorruptStateError("config/consumerOffset.json is not a valid document"), 1),
    (StoreLockedError("another process holds the store"), 1),
    (OSError(28, "No space left on device"), 1),
])
def test_bad_input_exits_2_and_damaged_data_1_whatever_else_they_are(error, code):
    @click.command("fail")
    def fail() -> None:
        raise error
    result = CliRunner().invoke(MqstoreGroup(commands=[fail]), ["fail"])
    assert result.exit_code == code, result.output
    assert result.stderr.splitlines() == [f"Error: {' '.join(str(error).split())}"]


def test_query_lookups(store, config):
    root, first = store["root"], store["first"]
    by_key = mqstore_json("query", root, "key", "orders", "shared", "-c", config)["messages"]
    assert [m["phys_offset"] for m in by_key] == [m["phys_offset"] for m in first["messages"]]
    m = by_key[0]
    assert (m["topic"], m["queue_id"], m["queue_offset"], m["tags"], m["keys"]) == (
        "orders", 0, 0, "paid", ["order-1", "shared"])
    assert m["properties"]["region"] == "eu" and m["crc_ok"] is True
    assert (m["body"], base64.b64decode(m["body_base64"])) == ("hello", b"hello")
    one = first["messages"][1]
    by_id = mqstore_json("query", root, "id", one["msg_id"], "-c", config)["messages"]
    assert [(x["phys_offset"], x["body"]) for x in by_id] == [(one["phys_offset"], "world")]
    at = mqstore_json("query", root, "offset", one["phys_offset"], "-c", config)["messages"]
    assert at == by_id
    uniq = mqstore("query", root, "unique-key", "orders", "no-such-key", "-c", config, "--json",
                   check=1)  # nothing matched: said on stderr, exit 1 (as grep's)
    assert json.loads(uniq.stdout) == {"messages": []}
    assert uniq.stderr == "no message of topic 'orders' has UNIQ_KEY 'no-such-key'\n"
    stamp = m["store_timestamp"]
    timed = mqstore_json("query", root, "time", "orders", 0, stamp, "-c", config)
    assert (timed["queue_offset"], timed["boundary"]) == (0, "lower")
    assert [x["phys_offset"] for x in timed["messages"]] == [0]


def test_stats(store, config):
    s = mqstore_json("stats", store["root"], "-c", config)
    assert set(s) == {"store", "commit_log", "topics", "consumers", "dispatch", "flush", "disk",
                      "cleanup", "replication", "schedule", "coordination"}
    assert s["schedule"] == {"levels": {}, "timers": {"queued": 0, "queue_offset": 0,
                                                      "read_time_ms": 0}}
    assert s["replication"] == {"live": False, "role": "async_master"}  # none ever ran
    assert s["consumers"] == []  # no group has consumed (tests/cli/test_cli_consume.py: with groups)
    end = store["second"]["messages"][-1]["phys_offset"] + store["second"]["messages"][-1]["size"]
    assert s["commit_log"] == {"min_offset": 0, "max_offset": end, "bytes": end,
                               "segments": 1, "segment_bytes": 65536}
    assert (s["store"]["hash"], s["store"]["writer"]) == ("java", "none")
    topics = {t["topic"]: t for t in s["topics"]}
    assert topics["orders"]["queues"] == [{"queue_id": 0, "min_offset": 0, "max_offset": 2,
                                           "messages": 2, "bytes": store["first"]["bytes"]}]
    assert topics["logs"]["messages"] == 50 and topics["logs"]["bytes"] == store["second"]["bytes"]
    assert s["dispatch"] == {"consume_queues_cover": end, "consume_queue_lag_bytes": 0,
                             "live": False}
    assert s["flush"]["checkpoint_flushed"] == end and s["flush"]["live"] is False
    assert s["cleanup"]["expired_segments"] == 0 and s["cleanup"]["disk_full"] is False
    assert s["disk"]["by_entry"]["commitlog"] > 0


def test_stats_judges_byte_watermarks(store, tmp_path):
    """Watermarks given as free space are shown as set and judged against the disk's bytes:
    no disk has a petabyte free, and every disk has more than one byte free."""
    path = tmp_path / "bytes.yaml"
    path.write_text(SMALL_CONFIG + "store: {hash: java}\n"
                    "cleanup: {disk_max_used_ratio: 1000TB, disk_forcibly_ratio: 1B, "
                    "disk_warning_ratio: 1B}\n")
    c = mqstore_json("stats", store["root"], "-c", str(path))["cleanup"]
    assert (c["disk_max_used_ratio"], c["disk_max_used_passed"]) == ("1000TB free", True)
    assert (c["disk_forcibly_ratio"], c["disk_forcibly_passed"]) == ("1B free", False)
    assert c["disk_warning_passed"] is False and c["disk_full"] is False
    assert c["would_delete_now"] is True


@pytest.mark.slow
def test_inspect_each_file(store, config, tmp_path):
    root, first = store["root"], store["first"]
    seg = mqstore_json("inspect", root / "commitlog" / f"{0:020d}", "-n", 3)
    third = store["second"]["messages"][0]
    assert seg["kind"] == "commitlog" and seg["next_at"] == third["phys_offset"] + third["size"]
    assert [(r["offset"], r["size"], r["type"], r["crc"], r["topic"], r["queue_offset"],
             r["tags"], r["keys"]) for r in seg["rows"][:2]] == [
        (m["phys_offset"], m["size"], "record", "ok", "orders", m["queue_offset"], "paid",
         ["order-1", "shared"]) for m in first["messages"]]
    more = mqstore_json("inspect", root / "commitlog" / f"{0:020d}", "--at", seg["next_at"],
                        "-n", 1000)
    assert len(seg["rows"]) + len(more["rows"]) == 52 and more["next_at"] is None
    cq = mqstore_json("inspect", root / "consumequeue" / "orders" / "0" / f"{0:020d}")
    assert [(r["queue_offset"], r["phys_offset"], r["size"], r["type"], r["record"])
            for r in cq["rows"]] == [(m["queue_offset"], m["phys_offset"], m["size"], "unit", "ok")
                                     for m in first["messages"]]
    (index_name,) = [p.name for p in (root / "index").iterdir()]
    idx = mqstore_json("inspect", root / "index" / index_name, "-c", config)
    assert idx["fields"]["slots"] == 64 and idx["fields"]["index count"] == 1 + len(idx["rows"])
    # one entry for the UNIQ_KEY and one per KEYS token (order-1, shared) of each orders
    # message, in put order, then one for the UNIQ_KEY of each logs message
    second_phys = first["messages"][1]["phys_offset"]
    assert [r["phys_offset"] for r in idx["rows"]] == [0, 0, 0, second_phys, second_phys,
                                                        second_phys] + [
        m["phys_offset"] for m in store["second"]["messages"]]
    assert len({r["key_hash"] for r in idx["rows"][:6]}) == 4
    cp = mqstore_json("inspect", root / "checkpoint")
    assert cp["kind"] == "checkpoint" and cp["fields"]["file bytes"] == 4096
    meta = mqstore_json("inspect", root / "mqstore.json")
    assert meta["fields"]["hash"] == "java"
    manifest = mqstore_json("inspect", root / "config" / "mqstore_queues.json")
    assert {(r["topic"], r["queue_id"], r["max_offset"]) for r in manifest["rows"]} >= {
        ("orders", 0, 2)}
    (tmp_path / "abort").write_text("999999999")  # no such process: a crashed writer's
    abort = mqstore_json("inspect", tmp_path / "abort")
    assert (abort["kind"], abort["fields"]["pid"], abort["fields"]["writer alive"]) == (
        "abort", 999999999, False)
    not_a_file = mqstore("inspect", root, check=2)
    assert "is a directory" in error_line(not_a_file)


def test_check_clean_store(store, config):
    report = mqstore_json("check", store["root"], "-c", config)
    assert report == {"root": str(store["root"]), "clean": True, "records": 52,
                      "commit_log_bytes": store["first"]["bytes"] + store["second"]["bytes"],
                      "crc_ok": 52, "crc_bad": 0, "queues": 5, "index_checked": True,
                      "problems": [], "notes": []}


def test_a_locked_store_is_one_line_exit_1(store, config):
    from mqstore import MessageStore, load_config
    with MessageStore.open(store["root"], config=load_config(config).replace(
            dispatch={"worker": "thread"}, flush={"worker": "thread"})):
        busy = mqstore("produce", store["root"], "-c", config, "-t", "t", "x", check=1)
        assert "is open for writing by another process" in error_line(busy)
        refused = mqstore("check", store["root"], "-c", config, check=1)
        assert f"is open for writing by another process (pid {os.getpid()}); check it once" \
            in error_line(refused)


def test_bench_small(tmp_path):
    out = mqstore_json("bench", "-n", 2000, "--body-bytes", 100, "--batch", 500,
                       "--segment-bytes", 1 << 20, "--dispatch", "thread")
    phases = {p["phase"]: p for p in out["phases"]}
    assert list(phases) == ["put_batch", "dispatch", "get", "baseline"]
    assert phases["put_batch"]["messages"] == phases["get"]["messages"] == 2000
    assert phases["baseline"]["bytes"] == phases["put_batch"]["bytes"]
    assert phases["baseline"]["x_base"] == 1.0 and phases["put_batch"]["x_base"] > 0

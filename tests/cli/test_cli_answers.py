"""What the commands answer is true: a directory that is not a store is refused, a lookup that
finds nothing says so (exit 1, as grep's), settings recorded by ``init`` stay the store's,
progress counts the work done, and ``bench`` times what it says. Real subprocesses."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from rich import filesize

from cli_support import mqstore, mqstore_json, mqstore_tty

pytestmark = pytest.mark.usefixtures("no_plugin_env")
NOT_A_STORE = ("is not a store directory: it has no mqstore.json, commitlog/, consumequeue/ "
               "or checkpoint (mqstore init makes a store)")


@pytest.fixture(scope="module")
def store(tmp_path_factory, config):
    """A store with two orders messages in queue 0 (keys order-1 and order-2)."""
    root = tmp_path_factory.mktemp("answers") / "store"
    mqstore("init", root, "-c", config)
    put = [mqstore_json("produce", root, "-c", config, "-t", "orders", "-q", "0", "--keys",
                        f"order-{i}", body)["messages"][0]
           for i, body in ((1, "first"), (2, "second"))]
    return root, put


def tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("command", [
    ("check",), ("check", "--fix"), ("stats",), ("stats", "--group", "g"), ("info",),
    ("query", "key", "orders", "k"), ("query", "time", "orders", "0", "0"),
    ("consume", "-t", "logs", "-g", "x", "-n", "1"),
    ("consume", "-t", "logs", "-g", "x", "--no-commit"),
    ("export", "--to", "out"),
    ("produce", "-t", "logs", "hello"),  # a writer too: it makes stores, not in other files
])
def test_a_directory_that_is_not_a_store_is_refused_and_left_alone(tmp_path, command):
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("buy milk\n")
    name, *rest = command
    proc = mqstore(name, notes, *rest, check=2)
    assert proc.stdout == ""
    assert proc.stderr.splitlines() == [f"Error: '{notes}' {NOT_A_STORE}"]
    assert tree(notes) == ["todo.txt"]  # consume used to create consumer/ here


@pytest.mark.parametrize("command", [("check",),
                                     ("query", "id", "7F00000100002A9F0000000000000000"),
                                     ("consume", "-t", "logs", "-g", "x")])
def test_a_missing_directory_or_a_file_is_one_line(tmp_path, command):
    name, *rest = command
    missing = mqstore(name, tmp_path / "nowhere", *rest, check=2)
    assert missing.stderr.splitlines() == [f"Error: store directory "
                                           f"'{tmp_path / 'nowhere'}' does not exist"]
    (tmp_path / "file").write_text("x")
    a_file = mqstore(name, tmp_path / "file", *rest, check=2)
    assert a_file.stderr.splitlines() == [f"Error: '{tmp_path / 'file'}' is not a directory"]
    assert not (tmp_path / "nowhere").exists()


def test_an_empty_store_made_by_init_is_a_store(tmp_path, config):
    root = tmp_path / "empty"
    mqstore("init", root, "-c", config)
    assert mqstore("check", root, "-c", config).stdout == (
        "0 records, 0 bytes, CRC bad 0, 0 consume queues, index checked: clean\n")
    assert mqstore_json("stats", root, "-c", config)["topics"] == []
    assert ", segment 65536 bytes, hash mmh3\n" in mqstore("info", root).stdout
    missing = mqstore("query", root, "key", "orders", "k", check=1)
    assert (missing.stdout, missing.stderr) == (
        "", "topic 'orders' does not exist in this store\n")


def test_consume_of_a_topic_that_does_not_exist_says_so_and_writes_nothing(store, config):
    root, _put = store
    before = tree(root)
    for options in ((), ("--no-commit",), ("--json",)):
        proc = mqstore("consume", root, "-c", config, "-t", "nope", "-g", "g", *options,
                       check=1)
        assert (proc.stdout, proc.stderr) == ("", "topic 'nope' does not exist in this store\n")
    assert tree(root) == before


def test_lookups_that_find_nothing_say_so_and_exit_1(store, config):
    root, put = store
    cases = [
        (("key", "orders", "order-9"), "no message of topic 'orders' carries key 'order-9'"),
        (("key", "nope", "order-1"), "topic 'nope' does not exist in this store"),
        (("unique-key", "orders", "0" * 32),
         f"no message of topic 'orders' has UNIQ_KEY '{'0' * 32}'"),
        (("unique-key", "nope", "0" * 32), "topic 'nope' does not exist in this store"),
        (("id", "7F00000100002A9F00000000000FFFF0"),
         "no message of this store has msg id '7F00000100002A9F00000000000FFFF0'"),
        (("offset", 1), "no message starts at commit-log offset 1"),
        (("time", "orders", 7, 0), "topic 'orders' has no queue 7 (its queues: 0)"),
        (("time", "nope", 0, 0), "topic 'nope' does not exist in this store"),
    ]
    for args, said in cases:
        proc = mqstore("query", root, *args, "-c", config, check=1)
        assert (proc.stdout, proc.stderr) == ("", said + "\n"), args
    # --json still prints the (empty) answer for scripts; the status says nothing matched
    proc = mqstore("query", root, "key", "orders", "order-9", "-c", config, "--json", check=1)
    assert json.loads(proc.stdout) == {"messages": []}
    # found: exit 0, nothing on stderr
    found = mqstore("query", root, "key", "orders", "order-2", "-c", config, "--json")
    assert [m["body"] for m in json.loads(found.stdout)["messages"]] == ["second"]
    assert found.stderr == ""


def test_a_time_search_answers_only_messages_on_the_asked_side(store, config):
    root, put = store
    (first,) = mqstore_json("query", root, "offset", put[0]["phys_offset"], "-c",
                            config)["messages"]
    stored = first["store_timestamp"]
    after = mqstore("query", root, "time", "orders", 0, stored + 3_600_000, "-c", config,
                    "--json", check=1)
    assert json.loads(after.stdout) == {"topic": "orders", "queue_id": 0,
                                        "timestamp": stored + 3_600_000, "boundary": "lower",
                                        "queue_offset": 2, "messages": []}
    assert after.stderr.startswith("no message of orders/0 was stored at or after ")
    # the nearest message is after the time: not "the last stored at or before it"
    before = mqstore("query", root, "time", "orders", 0, stored - 3_600_000, "--boundary",
                     "upper", "-c", config, "--json", check=1)
    assert json.loads(before.stdout)["messages"] == []
    assert before.stderr.startswith("no message of orders/0 was stored at or before ")
    hit = mqstore_json("query", root, "time", "orders", 0, stored, "-c", config)
    assert [m["body"] for m in hit["messages"]] == ["first"]


def test_init_settings_stay_the_stores_when_produce_has_no_config(tmp_path, config):
    root = tmp_path / "small"
    mqstore("init", root, "-c", config)
    recorded = (root / "mqstore.json").read_text()
    assert json.loads(recorded)["commit_log_segment_bytes"] == 65536
    assert ", segment 65536 bytes, hash mmh3\n" in mqstore("info", root).stdout
    out = mqstore_json("produce", root, "-t", "logs", "hello")  # no -c: the defaults
    assert out["count"] == 1
    assert (root / "mqstore.json").read_text() == recorded
    assert [(p.name, p.stat().st_size) for p in (root / "commitlog").iterdir()] == [
        (f"{0:020d}", 65536)]
    assert mqstore_json("stats", root)["commit_log"]["segment_bytes"] == 65536


def test_check_progress_counts_the_records_walked_not_the_segments_size(tmp_path, config):
    root = tmp_path / "progress"
    mqstore("init", root, "-c", config)
    mqstore("produce", root, "-c", config, "-t", "logs", "--summary",
            input="".join(f"line {i}\n" for i in range(60)))
    data = mqstore_json("check", root, "-c", config)["commit_log_bytes"]
    assert 0 < data < 65536  # one segment, mostly unwritten
    status, shown = mqstore_tty("check", root, "-c", config)
    assert status == 0
    unit, suffix = filesize.pick_unit_and_suffix(data, ["bytes", "kB", "MB", "GB"], 1000)
    want = f"{data / unit:,.1f}/{data / unit:,.1f} {suffix}"  # as rich's DownloadColumn
    bars = re.findall(r"checking .*? (\S+/\S+ (?:bytes|kB|MB|GB))", shown)
    assert bars and bars[-1] == want, shown
    assert all(bar.endswith(f"/{data / unit:,.1f} {suffix}") or bar.endswith("/? bytes")
               for bar in bars), bars


def test_bench_dispatch_row_covers_every_message(tmp_path):
    # Puts waiting for their fsync (sync flush), in batches of 100: dispatch keeps up beside
    # them, so what is left when the puts end is about one batch, not the 2000 the row is of.
    sync = tmp_path / "sync.yaml"
    sync.write_text("flush: {policy: sync}\nplugins: {load_entry_points: false}\n")
    out = mqstore_json("bench", "-n", 2000, "--body-bytes", 100, "--batch", 100,
                       "--segment-bytes", 1 << 20, "--dispatch", "thread", "-c", sync)
    phases = {p["phase"]: p for p in out["phases"]}
    put, dispatch = phases["put_batch"], phases["dispatch"]
    assert (dispatch["messages"], dispatch["bytes"]) == (2000, put["bytes"])
    assert dispatch["seconds"] >= put["seconds"]  # timed from the first put, as it starts then

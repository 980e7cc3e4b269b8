"""``mqstore topic`` and ``mqstore group`` as real processes: exact output and exit codes.

Stores are made by ``init`` and ``produce``; consumers are ``mqstore consume`` runs (or a
consumer process, for a live instance); a running writer is ``mqstore serve``.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import time

import pytest

from cli_support import SMALL_CONFIG, error_line, mqstore, mqstore_json
from mqstore.testing.consumer_proc import ConsumerProcess
from serve_support import STOP_TIMEOUT_S, start

pytestmark = pytest.mark.usefixtures("no_plugin_env")
TOPIC = "orders"


@pytest.fixture(scope="module")
def template(tmp_path_factory, config):
    root = tmp_path_factory.mktemp("template") / "store"
    mqstore("init", root, "-c", config)
    mqstore("produce", root, "-c", config, "-t", TOPIC, "-q", 0, *[f"a{i}" for i in range(2)])
    mqstore("produce", root, "-c", config, "-t", TOPIC, "-q", 3, *[f"b{i}" for i in range(6)])
    return root


@pytest.fixture
def root(tmp_path, template):
    """A closed store without topics.json: 2 messages of TOPIC in queue 0, 6 in queue 3."""
    root = tmp_path / "store"
    shutil.copytree(template, root)
    return root


def config_row(topic, read, write, perm, text, stored) -> dict:
    return {"topic": topic, "read_queues": read, "write_queues": write, "perm": perm,
            "perm_text": text, "order": False, "topic_sys_flag": 0,
            "topic_filter_type": "SINGLE_TAG", "stored_queues": stored}


def test_topic_create_list_update_and_refusals(root, config):
    no_config = dict.fromkeys(("read_queues", "write_queues", "perm", "perm_text", "order",
                               "topic_sys_flag", "topic_filter_type"))
    assert mqstore_json("topic", "list", root, "-c", config) == [
        {"topic": TOPIC, **no_config, "stored_queues": [0, 3]}]
    assert not (root / "config" / "topics.json").exists()

    made = mqstore_json("topic", "create", root, "Payments", "-q", "3", "-c", config)
    assert made == {k: v for k, v in config_row("Payments", 3, 3, 6, "RW-", None).items()
                    if k != "stored_queues"}
    # The first config adopts the topic the store held (queues 0 and 3: 4 queues).
    assert mqstore_json("topic", "list", root, "-c", config) == [
        config_row("Payments", 3, 3, 6, "RW-", []), config_row(TOPIC, 4, 4, 6, "RW-", [0, 3])]

    changed = mqstore_json("topic", "update", root, "Payments", "-w", "1", "-p", "4",
                           "-c", config)
    assert (changed["read_queues"], changed["write_queues"], changed["perm"],
            changed["perm_text"]) == (3, 1, 4, "R--")
    assert (changed["before"]["write_queues"], changed["before"]["perm"]) == (3, 6)
    table = mqstore("topic", "list", root, "-c", config).stdout
    assert "read queues" in table and "write queues" in table and "4 R--" in table

    refused = mqstore("produce", root, "-c", config, "-t", "Payments", "x", check=1)
    assert error_line(refused) == (
        "Error: put refused at argument 1: NO_PERMISSION message 0: topic 'Payments' takes no "
        "messages: its perm is 4 (R--), without the write bit 2; nothing was stored")
    refused = mqstore("produce", root, "-c", config, "-t", TOPIC, "-q", "4", "x", check=1)
    assert error_line(refused) == (
        "Error: put refused at argument 1: MESSAGE_ILLEGAL message 0: queue_id 4 is not a "
        "write queue of topic 'orders': it has 4 write queue(s), ids 0..3; nothing was stored")

    twice = mqstore("topic", "create", root, "Payments", "-c", config, check=2)
    assert error_line(twice) == (
        "Error: topic 'Payments' exists already (3 read / 1 write queue(s), perm 4); change it "
        "with `mqstore topic update`")
    path = root / "config" / "topics.json"
    missing = mqstore("topic", "update", root, "Nope", "-q", "2", "-c", config, check=1)
    assert error_line(missing) == (f"Error: topic 'Nope' has no config in {path}; create it "
                                   f"with `mqstore topic create`")
    nothing = mqstore("topic", "update", root, "Payments", "-c", config, check=2)
    assert "nothing to change: give --queues, --read-queues, --write-queues or --perm" in \
        nothing.stderr
    bad = mqstore("topic", "create", root, "no spaces", "-c", config, check=2)
    assert error_line(bad).startswith("Error: topic 'no spaces' must match")
    assert "Invalid value for '-p' / '--perm'" in mqstore(
        "topic", "create", root, "P", "-p", "7", "-c", config, check=2).stderr


def test_topic_delete_on_a_closed_store(root, config):
    mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "billing", "--from", "first",
            "-n", "3")
    before = (root / "config" / "consumerOffset.json").read_bytes()
    asked = mqstore("topic", "delete", root, TOPIC, "-c", config, check=1)  # no --yes, no tty
    assert asked.stderr.rstrip().endswith("Aborted!")
    assert (root / "consumequeue" / TOPIC).is_dir()
    assert (root / "config" / "consumerOffset.json").read_bytes() == before

    out = mqstore("topic", "delete", root, TOPIC, "--yes", "-c", config).stdout
    assert out.splitlines() == [
        f"deleted topic {TOPIC}: consume queue(s) 0,3; offsets and pop state of group(s) "
        f"billing",
        f"its messages stay in the commit log (below offset {_log_end(root, config)}) until "
        f"cleanup deletes their segments"]
    assert not (root / "consumequeue" / TOPIC).exists()
    assert mqstore_json("topic", "list", root, "-c", config) == []
    assert mqstore_json("group", "list", root, "-c", config) == []
    assert mqstore_json("check", root, "-c", config)["problems"] == []
    again = mqstore("topic", "delete", root, TOPIC, "--yes", "-c", config, check=1)
    assert error_line(again) == (f"Error: topic '{TOPIC}' does not exist in "
                                 f"{str(root)!r}: no config, no consume queue, no consumer group")
    # The name is free again: a first send makes a new topic from offset 0.
    put = mqstore_json("produce", root, "-c", config, "-t", TOPIC, "-q", "3", "new")
    assert put["messages"][0]["queue_offset"] == 0


def _log_end(root, config) -> int:
    return mqstore_json("stats", root, "-c", config)["commit_log"]["max_offset"]


def test_group_list_describe_reset_and_delete(root, config):
    mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "billing", "--from", "first",
            "-n", "5")
    mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "audit", "--from", "first")
    assert mqstore_json("group", "list", root, "-c", config) == [
        {"group": "audit", "topic": TOPIC, "queues": 2, "lag": 0, "live_instances": 0},
        {"group": "billing", "topic": TOPIC, "queues": 2, "lag": 3, "live_instances": 0}]
    (billing,) = mqstore_json("group", "describe", root, "billing", "-c", config)
    assert (billing["group"], billing["topic"], billing["lag"]) == ("billing", TOPIC, 3)
    assert [(q["queue_id"], q["committed_offset"], q["min_offset"], q["max_offset"], q["lag"])
            for q in billing["queues"]] == [(0, 2, 0, 2, 0), (3, 3, 0, 6, 3)]
    assert billing["queues"][1]["oldest_unconsumed_age_ms"] >= 0
    table = mqstore("group", "describe", root, "billing", "-c", config).stdout
    assert f"group billing on topic {TOPIC}: lag 3, 0 live instance(s)" in table
    assert "committed offset" in table and "max offset" in table

    reset = mqstore_json("group", "reset-offset", root, "billing", "-t", TOPIC, "--offset", "1",
                         "-c", config)
    assert reset == {"group": "billing", "topic": TOPIC, "offset": 1, "timestamp_ms": None,
                     "queues": [
                         {"queue_id": 0, "before": 2, "after": 1, "min_offset": 0,
                          "max_offset": 2},
                         {"queue_id": 3, "before": 3, "after": 1, "min_offset": 0,
                          "max_offset": 6}]}
    got = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "billing", "--json").stdout
    assert sorted((m["queue_id"], m["queue_offset"]) for m in map(json.loads, got.splitlines())
                  ) == [(0, 1), (3, 1), (3, 2), (3, 3), (3, 4), (3, 5)]

    unknown = mqstore("group", "describe", root, "nobody", "-c", config, check=1)
    assert error_line(unknown) == (f"Error: group 'nobody' has no offsets or pop state in "
                                   f"{str(root)!r}")
    both = mqstore("group", "reset-offset", root, "billing", "-t", TOPIC, "-c", config, check=2)
    assert "give exactly one of --offset and --time" in both.stderr
    when = mqstore("group", "reset-offset", root, "billing", "-t", TOPIC, "--time", "soon",
                   "-c", config, check=2)
    assert "'soon' is not epoch milliseconds or an ISO-8601 time" in when.stderr

    gone = mqstore_json("group", "delete", root, "audit", "--yes", "-c", config)
    assert gone == {"group": "audit", "topics": [TOPIC]}
    assert [g["group"] for g in mqstore_json("group", "list", root, "-c", config)] == ["billing"]


def test_reset_by_time_then_the_group_resumes_exactly_there(root, config):
    """Messages produced later than a time T: a group reset to T gets exactly those, with
    nothing stored before T, whatever it had consumed."""
    time.sleep(0.05)  # store times of what follows lie after the fixture's
    later = mqstore_json("produce", root, "-c", config, "-t", TOPIC, *[f"c{i}" for i in range(6)])
    everything = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "peek", "--from",
                         "first", "--no-commit", "--json").stdout
    stored = {(m["queue_id"], m["queue_offset"]): m for m in map(json.loads,
                                                                 everything.splitlines())}
    newer = {(m["queue_id"], m["queue_offset"]) for m in later["messages"]}
    t = min(stored[p]["store_timestamp"] for p in newer)
    assert all(m["store_timestamp"] < t for p, m in stored.items() if p not in newer)

    consumed = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "g", "--from", "first")
    assert "14 message(s) consumed by group 'g'; committed" in consumed.stderr
    reset = mqstore_json("group", "reset-offset", root, "g", "-t", TOPIC, "--time", str(t),
                         "-c", config)
    first_newer = {}
    for q, o in sorted(newer):
        first_newer.setdefault(q, o)
    assert {r["queue_id"]: r["after"] for r in reset["queues"]} == {
        q: first_newer.get(q, stored_max) for q, stored_max in
        ((r["queue_id"], r["max_offset"]) for r in reset["queues"])}
    resumed = mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "g", "--json").stdout
    got = [json.loads(line) for line in resumed.splitlines()]
    assert sorted((m["queue_id"], m["queue_offset"]) for m in got) == sorted(newer)
    assert sorted(m["body"] for m in got) == [f"c{i}" for i in range(6)]


def test_group_changes_are_refused_while_an_instance_consumes(root, config):
    mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "live", "--from", "first", "-n", "1")
    consumer = ConsumerProcess(root, "live", TOPIC, "--timeout-ms", "200")
    try:
        assert consumer.wait_for(lambda c: c.assignment is not None), consumer.errors()
        (row,) = [g for g in mqstore_json("group", "list", root, "-c", config)
                  if g["group"] == "live"]
        assert row["live_instances"] == 1
        refused = mqstore("group", "reset-offset", root, "live", "-t", TOPIC, "--offset", "0",
                          "-c", config, check=1)
        assert error_line(refused) == (
            f"Error: group 'live' has live instances (1 on '{TOPIC}'): they would go on from "
            f"the offsets they hold; stop them before resetting its offsets")
        refused = mqstore("group", "delete", root, "live", "--yes", "-c", config, check=1)
        assert error_line(refused).endswith("stop them before deleting it")
        refused = mqstore("topic", "delete", root, TOPIC, "--yes", "-c", config, check=1)
        assert error_line(refused) == (
            f"Error: topic '{TOPIC}' is being consumed: group 'live' has 1 live instance(s); "
            f"stop them before deleting it")
        assert (root / "consumequeue" / TOPIC).is_dir()
    finally:
        assert consumer.stop() == 0, consumer.errors()
    assert mqstore_json("group", "reset-offset", root, "live", "-t", TOPIC, "--offset", "0",
                        "-c", config)["queues"][0]["after"] == 0


def test_beside_a_running_writer(tmp_path, config):
    """Topics change and groups reset beside `mqstore serve`; a delete needs it stopped."""
    root = tmp_path / "store"
    mqstore("init", root, "-c", config)
    mqstore("produce", root, "-c", config, "-t", TOPIC, "-q", "1", "x", "y")
    mqstore("consume", root, "-c", config, "-t", TOPIC, "-g", "g", "--from", "first")
    yaml = tmp_path / "deploy.yaml"
    yaml.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}}}\n"
                    "server: {metrics_listen: \"127.0.0.1:0\"}\n")
    proc, _url = start(yaml, tmp_path / "serve.log")
    try:
        made = mqstore_json("topic", "create", root, "Side", "-q", "2", "-c", config)
        assert made["write_queues"] == 2
        assert [r["topic"] for r in mqstore_json("topic", "list", root, "-c", config)] == [
            "Side", TOPIC]
        reset = mqstore_json("group", "reset-offset", root, "g", "-t", TOPIC, "--offset", "0",
                             "-c", config)
        # Every read queue of the topic (its config, adopted when Side was created, has 4).
        assert [(r["queue_id"], r["before"], r["after"]) for r in reset["queues"]] == [
            (0, None, 0), (1, 2, 0), (2, None, 0), (3, None, 0)]
        refused = mqstore("topic", "delete", root, "Side", "--yes", "-c", config, check=1)
        line = error_line(refused)
        assert line.startswith(f"Error: a topic is deleted on a closed store: store "
                               f"{str(root)!r} is open for writing by another process")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0
    assert mqstore_json("topic", "delete", root, "Side", "--yes", "-c", config)["queues"] == []

"""``mqstore group config`` and ``mqstore group dlq`` on a store directory, as real processes:
exact output, refusals and exit codes."""

from __future__ import annotations

import json
import os
import signal

import pytest

from cli_support import SMALL_CONFIG, error_line, mqstore, mqstore_json
from mqstore import Message, MessageStore, load_config
from serve_support import STOP_TIMEOUT_S, start

pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.fixture
def root(tmp_path, config):
    """A closed store whose group "G" (one attempt) dead-lettered three messages of "T"."""
    root = tmp_path / "store"
    mqstore("init", root, "-c", config)
    assert mqstore_json("group", "config", root, "G", "--retry-max-times", "0",
                        "-c", config)["max_attempts"] == 1
    cfg = load_config(overrides={"plugins": {"load_entry_points": False},
                                 "dispatch": {"worker": "thread"}, "flush": {"worker": "thread"}})
    with MessageStore.open(root, config=cfg) as store:
        for i in range(3):
            store.put(Message("T", b"body%d" % i, tags="tg", keys=[f"k{i}"], queue_id=0,
                              properties={"UNIQ_KEY": f"ID{i}", "user": "u"}))
        store.wait_dispatched()
        assert len(store.pop("G", "T", 8, 0, consume_from="first")) == 3
        assert store.pop("G", "T", 8, 0) == []  # all three buried
        store.wait_dispatched()
    return root


def test_group_config_shows_defaults_and_changes(root, config):
    assert mqstore_json("group", "config", root, "Other", "-c", config) == {
        "group": "Other", "listed": False, "retry_max_times": 16, "max_attempts": 17,
        "retry_queue_nums": 1, "consume_enable": True, "consume_broadcast_enable": True,
        "consume_message_orderly": False}
    changed = mqstore_json("group", "config", root, "Other", "--retry-max-times", "3",
                           "--orderly", "-c", config)
    assert (changed["listed"], changed["max_attempts"], changed["consume_message_orderly"]) == (
        True, 4, True)
    text = mqstore("group", "config", root, "Other", "-c", config).stdout
    assert "group Other" in text and "max_attempts" in text and "4" in text
    before = (root / "config" / "subscriptionGroup.json").read_bytes()
    bad = mqstore("group", "config", root, "Other", "--retry-queue-nums", "0", "-c", config,
                  check=2)
    assert error_line(bad) == ("Error: group 'Other': retryQueueNums: input should be greater "
                               "than or equal to 1 (got 0)")
    assert (root / "config" / "subscriptionGroup.json").read_bytes() == before


def test_group_dlq_lists_and_resends(root, config):
    rows = mqstore_json("group", "dlq", root, "G", "-c", config)
    assert [(r["offset"], r["id"], r["origin_topic"], r["attempts"], r["keys"])
            for r in rows] == [(0, "ID0", "T", 1, ["k0"]), (1, "ID1", "T", 1, ["k1"]),
                               (2, "ID2", "T", 1, ["k2"])]
    table = mqstore("group", "dlq", root, "G", "-c", config).stdout
    assert "group G: 3 dead letter(s) in %DLQ%G" in table and "ID2" in table
    resent = mqstore_json("group", "dlq", root, "G", "--resend", "--offset", "0", "--id",
                          "ID2", "-c", config)
    assert [(r["offset"], r["id"], r["topic"], r["status"]) for r in resent["resent"]] == [
        (0, "ID0", "T", "PUT_OK"), (2, "ID2", "T", "PUT_OK")]
    with MessageStore.open(root, config=load_config(overrides={
            "plugins": {"load_entry_points": False}}), read_only=True) as store:
        again = [store.read("T", r["queue_id"], r["queue_offset"], 1).message(0)
                 for r in resent["resent"]]
    assert [(m.body, m.uniq_key, m.tags, m.keys) for m in again] == [
        (b"body0", "ID0", "tg", ["k0"]), (b"body2", "ID2", "tg", ["k2"])]
    assert all(m.properties["user"] == "u" and "RETRY_TOPIC" not in m.properties
               and "DLQ_ORIGIN_TOPIC" not in m.properties for m in again)
    assert len(mqstore_json("group", "dlq", root, "G", "-c", config)) == 3  # they stay


@pytest.mark.parametrize("args, code, message", [
    (["--resend", "--offset", "9"], 2, "Error: group 'G' has no dead letter 9 in %DLQ%G; "
                                       "nothing was resent (`mqstore group dlq` lists them)"),
    (["--resend"], 2, "Error: --resend needs --offset, --id or --all"),
    (["--all"], 2, "Error: --offset, --id and --all choose what --resend sends"),
])
def test_group_dlq_refusals(root, config, args, code, message):
    proc = mqstore("group", "dlq", root, "G", *args, "-c", config, check=code)
    assert error_line(proc) == message


def test_beside_a_running_writer_configs_change_and_a_resend_needs_server(root, config,
                                                                           tmp_path):
    yaml = tmp_path / "deploy.yaml"
    yaml.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}}}\n"
                    "server: {metrics_listen: \"127.0.0.1:0\"}\n")
    proc, _url = start(yaml, tmp_path / "serve.log")
    try:
        assert mqstore_json("group", "config", root, "G", "--retry-max-times", "5",
                            "-c", config)["max_attempts"] == 6
        assert len(mqstore_json("group", "dlq", root, "G", "-c", config)) == 3
        refused = mqstore("group", "dlq", root, "G", "--resend", "--all", "-c", config,
                          check=1)
        assert error_line(refused).startswith(
            "Error: the store is running: resend them there with --server (")
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0

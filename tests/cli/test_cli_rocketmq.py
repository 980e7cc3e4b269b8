"""The commands on the store RocketMQ 4.9.8 wrote (../shared/fixtures), read-only, as
subprocesses; answers compared with RocketMQ's own (MANIFEST.json)."""

from __future__ import annotations

import json
import shutil

import pytest

from cli_support import mqstore, mqstore_json

pytestmark = pytest.mark.usefixtures("no_plugin_env")
SEGMENT = 32768


def test_inspect_a_segment_matches_every_record(rocketmq_dir, manifest):
    rows = mqstore_json("inspect", rocketmq_dir / "commitlog" / f"{SEGMENT:020d}",
                        "-n", 1000)["rows"]
    want = [m for m in manifest["messages"] if SEGMENT <= m["commitLogOffset"] < 2 * SEGMENT]
    records = [r for r in rows if r["type"] == "record"]
    assert [(r["offset"], r["size"], r["topic"], r["queue_id"], r["queue_offset"], r["msg_id"],
             r["tags"]) for r in records] == [
        (m["commitLogOffset"], m["size"], m["topic"], m["queueId"], m["queueOffset"],
         m["msgId"], m["tags"]) for m in want]
    assert {r["crc"] for r in records} == {"ok"}
    (blank,) = [r for r in rows if r["type"] == "blank"]
    assert blank["offset"] + blank["size"] == 2 * SEGMENT and rows[-1] is not None


def test_inspect_queue_and_index_files(rocketmq_dir, manifest):
    units = mqstore_json("inspect", rocketmq_dir / "consumequeue" / "OrderEvents" / "0" /
                         f"{600:020d}")["rows"]
    want = sorted((m["queueOffset"], m["commitLogOffset"], m["size"], m["tagsCode"])
                  for m in manifest["messages"]
                  if (m["topic"], m["queueId"]) == ("OrderEvents", 0) and 30 <= m["queueOffset"] < 60)
    assert [(u["queue_offset"], u["phys_offset"], u["size"], u["tags_code"]) for u in units] == want
    assert {u["record"] for u in units} == {"ok"}
    index = sorted((rocketmq_dir / "index").iterdir())[0]
    idx = mqstore_json("inspect", index, "-n", 500)
    assert (idx["fields"]["slots"], idx["fields"]["entries"], idx["fields"]["index count"]) == (
        32, 128, 128)
    offsets = {m["commitLogOffset"] for m in manifest["messages"]}
    assert len(idx["rows"]) == 127 and {r["phys_offset"] for r in idx["rows"]} <= offsets


def test_inspect_small_files(rocketmq_dir, tmp_path):
    cp = mqstore_json("inspect", rocketmq_dir / "checkpoint")
    assert cp["fields"]["file bytes"] == 4096 and cp["fields"]["physicMsgTimestamp"] > 0
    delay = mqstore_json("inspect", rocketmq_dir / "config" / "delayOffset.json")
    assert (delay["kind"], delay["rows"]) == ("offset-table", [])
    offsets = tmp_path / "consumerOffset.json"  # the broker's file shape
    offsets.write_text(json.dumps({"offsetTable": {"OrderEvents@billing": {"1": 60, "0": 12},
                                                   "audit-log@ops": {"3": 15}}}))
    got = mqstore_json("inspect", offsets)
    assert got["kind"] == "consumer-offsets" and got["fields"] == {"groups": 2, "entries": 3}
    assert got["rows"] == [
        {"topic": "OrderEvents", "group": "billing", "queue_id": 0, "offset": 12},
        {"topic": "OrderEvents", "group": "billing", "queue_id": 1, "offset": 60},
        {"topic": "audit-log", "group": "ops", "queue_id": 3, "offset": 15}]


def test_query_stats_and_check(rocketmq_dir, manifest):
    m = manifest["messages"][123]
    (by_id,) = mqstore_json("query", rocketmq_dir, "id", m["msgId"])["messages"]
    assert (by_id["phys_offset"], by_id["size"], by_id["body_crc"], by_id["crc_ok"]) == (
        m["commitLogOffset"], m["size"], m["bodyCRC"], True)
    stats = mqstore_json("stats", rocketmq_dir)
    info = manifest["expected"]["storeInfo"]
    assert (stats["commit_log"]["min_offset"], stats["commit_log"]["max_offset"]) == (
        info["minPhyOffset"], info["maxPhyOffset"])
    got = {(t["topic"], q["queue_id"]): (q["min_offset"], q["max_offset"])
           for t in stats["topics"] for q in t["queues"]}
    assert got == {(q["topic"], q["queueId"]): (q["minOffsetInQueue"], q["maxOffsetInQueue"])
                   for q in info["queues"] if q["maxOffsetInQueue"]}
    assert stats["store"]["hash"] == "java"
    report = mqstore_json("check", rocketmq_dir)
    assert (report["clean"], report["records"], report["crc_bad"], report["queues"],
            report["index_checked"]) == (True, 300, 0, 13, True)


def test_consume_as_a_group_writes_the_brokers_offset_file(rocketmq_dir, manifest, tmp_path):
    """A group consumes a RocketMQ topic from its first message: every message once, in queue
    order, and the offsets land in config/consumerOffset.json in the broker's shape."""
    root = tmp_path / "store"
    shutil.copytree(rocketmq_dir, root)
    lines = mqstore("consume", root, "-t", "audit-log", "-g", "cli-g", "--from", "first",
                    "-n", 1000, "--json").stdout.splitlines()
    got = [json.loads(line) for line in lines]
    want = sorted((m["queueId"], m["queueOffset"], m["msgId"]) for m in manifest["messages"]
                  if m["topic"] == "audit-log")
    assert sorted((g["queue_id"], g["queue_offset"], g["msg_id"]) for g in got) == want
    for q in {g["queue_id"] for g in got}:  # each queue's in offset order
        mine = [g["queue_offset"] for g in got if g["queue_id"] == q]
        assert mine == sorted(mine)
    info = {q["queueId"]: q["maxOffsetInQueue"] for q in manifest["expected"]["storeInfo"]["queues"]
            if q["topic"] == "audit-log"}
    table = json.loads((root / "config" / "consumerOffset.json").read_text())["offsetTable"]
    assert {int(q): o for q, o in table["audit-log@cli-g"].items()} == info
    stats = mqstore_json("stats", root)
    (group,) = [g for g in stats["consumers"] if g["group"] == "cli-g"]
    assert (group["topic"], group["lag"]) == ("audit-log", 0)
    assert mqstore("consume", root, "-t", "audit-log", "-g", "cli-g", "--json").stdout == ""

"""What a pull and the consumer-group requests answer in the cases a client's next step depends
on: which broker to pull from next, retry at once, the offset moved, a group's members changed,
and queue locks held by an orderly consumer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore.format import remoting_json as fj
from mqstore.testing import wait_for

from cpp_client_support import cpp_env
from remoting_support import Served, Wire, deployment_yaml, props, pull_ext, send_ext

pytestmark = pytest.mark.slow
PROC = Path(__file__).resolve().parents[1] / "support" / "cpp_client_proc.py"
NOTIFY_CONSUMER_IDS_CHANGED = 40
SLAVE_ID = "1"


def max_offset(wire: Wire, topic: str, queue_id: int = 0) -> int:
    return int(wire.call(30, {"topic": topic, "queueId": queue_id}).ext["offset"])


def fill(wire: Wire, topic: str, count: int, properties: str = "", body: bytes = b"m") -> None:
    for i in range(count):
        assert wire.call(10, send_ext(topic, 0, properties), body + b"%d" % i).code == 0
    wait_for(lambda: max_offset(wire, topic) == count, what=f"{topic} dispatched")


def heartbeat(wire: Wire, client_id: str, group: str, topic: str) -> None:
    body = json.dumps({"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [{
            "topic": topic, "subString": "*", "subVersion": 1, "expressionType": "TAG"}]}]})
    assert wire.call(34, {}, body.encode()).code == 0


@pytest.mark.parametrize("slave_read", [True, False])
def test_a_read_behind_memory_suggests_the_slave_only_with_slave_reads(tmp_path, slave_read):
    # With no memory allowed for reads every read that leaves messages behind is "behind".
    yaml = deployment_yaml(tmp_path / "d.yaml", tmp_path / "root",
                           {"remoting_slave_read_enable": slave_read},
                           extra="get: {access_in_memory_max_ratio: 0}\n")
    served = Served(yaml, tmp_path / "serve.log")
    try:
        with Wire(served.address) as wire:
            fill(wire, "SuggestT", 5)
            behind = wire.call(11, pull_ext("g", "SuggestT", 0, 0, max_msgs=1))
            assert behind.code == 0 and behind.ext["nextBeginOffset"] == "1"
            assert behind.ext["suggestWhichBrokerId"] == (SLAVE_ID if slave_read else "0")
    finally:
        served.stop()


def test_a_filter_matching_nothing_answers_retry_immediately_past_what_it_scanned(served):
    with Wire(served.address) as wire:
        fill(wire, "NoMatchT", 3, props(TAGS="A"))
        for sub, kind in (("Z", "TAG"), ("TAGS = 'Z'", "SQL92")):
            r = wire.call(11, pull_ext("g", "NoMatchT", 0, 0, subscription=sub,
                                       expressionType=kind))
            assert (r.code, r.remark) == (20, "NO_MATCHED_MESSAGE")  # PULL_RETRY_IMMEDIATELY
            assert r.ext["nextBeginOffset"] == "3" and not r.body
        # Held pulls too: nothing will ever match what is there, so it is not held.
        r = wire.call(11, pull_ext("g", "NoMatchT", 0, 0, subscription="Z", sysflag=6,
                                   suspend_ms=30_000))
        assert r.code == 20 and r.ext["nextBeginOffset"] == "3"


def test_a_pull_below_the_queues_start_answers_offset_moved_to_it(tmp_path):
    hours = ";".join("%02d" % h for h in range(24))
    yaml = deployment_yaml(tmp_path / "d.yaml", tmp_path / "root", extra=(
        f"cleanup: {{file_reserved_hours: 0, interval_ms: 300, delete_when: '{hours}'}}\n"))
    served = Served(yaml, tmp_path / "serve.log")
    try:
        with Wire(served.address) as wire:
            fill(wire, "MovedT", 200, body=b"y" * 1000)  # several 64 KiB segments
            wait_for(lambda: int(wire.call(31, {"topic": "MovedT", "queueId": 0})
                                 .ext["offset"]) > 0, timeout=60, what="old segments removed")
            start = wire.call(31, {"topic": "MovedT", "queueId": 0}).ext["offset"]
            r = wire.call(11, pull_ext("g", "MovedT", 0, 0))
            assert (r.code, r.remark) == (21, "OFFSET_TOO_SMALL")  # PULL_OFFSET_MOVED
            assert r.ext["nextBeginOffset"] == start and r.ext["minOffset"] == start
            assert not r.body
    finally:
        served.stop()


def test_a_member_unregistering_is_told_to_the_rest_of_its_group(served):
    with Wire(served.address) as a, Wire(served.address) as b:
        heartbeat(a, "client-a", "unreg-g", "UnregT")
        heartbeat(b, "client-b", "unreg-g", "UnregT")
        joined = a.read()  # b joining changed the group
        assert (joined.code, joined.is_oneway) == (NOTIFY_CONSUMER_IDS_CHANGED, True)
        listed = b.call(38, {"consumerGroup": "unreg-g"})
        assert fj.loads(listed.body)["consumerIdList"] == ["client-a", "client-b"]
        r = b.call(35, {"clientID": "client-b", "consumerGroup": "unreg-g",
                        "producerGroup": ""})
        assert r.code == 0
        told = a.read()
        assert (told.code, told.is_oneway) == (NOTIFY_CONSUMER_IDS_CHANGED, True)
        assert told.ext == {"consumerGroup": "unreg-g"}
        listed = a.call(38, {"consumerGroup": "unreg-g"})
        assert fj.loads(listed.body)["consumerIdList"] == ["client-a"]


def test_an_orderly_cpp_consumer_holds_its_queues_and_reads_each_in_order(served, cpp_client,
                                                                          tmp_path):
    topic, group, count = "OrderlyT", "orderly-g", 24
    with Wire(served.address) as wire:
        for i in range(count):
            assert wire.call(10, send_ext(topic, i % 4), b"o%d" % i).code == 0
        wait_for(lambda: sum(max_offset(wire, topic, q) for q in range(4)) == count,
                 what="dispatched")
    proc = subprocess.Popen([sys.executable, str(PROC), "orderly", served.address, topic, group,
                             str(count)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=cpp_env(cpp_client, tmp_path))
    try:
        assert proc.stdout.readline().strip() == "consumed"
        mqs = [{"brokerName": "mqstore", "queueId": q, "topic": topic} for q in range(4)]
        intruder = {"consumerGroup": group, "clientId": "intruder", "mqSet": mqs}
        with Wire(served.address) as wire:
            r = wire.call(41, {}, json.dumps(intruder).encode())  # LOCK_BATCH_MQ
            assert r.code == 0 and fj.loads(r.body)["lockOKMQSet"] == []
        out, err = proc.communicate("", timeout=120)
        assert proc.returncode == 0, out + err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    got = json.loads(out.strip().splitlines()[-1])
    assert sorted(m["body"] for m in got["got"]) == sorted(f"o{i}" for i in range(count))
    for q in range(4):
        offsets = [m["queue_offset"] for m in got["got"] if m["queue_id"] == q]
        assert offsets == list(range(count // 4)), (q, offsets)  # in order, each once
    assert got["overlapped"] == []  # one message of a queue at a time

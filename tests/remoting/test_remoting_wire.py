"""``mqstore serve``'s remoting port, frame by frame: every request it serves, with the codes,
header fields and bodies a RocketMQ 4.9.8 broker answers (a real serve process, default
configuration: worker processes)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from mqstore.format import remoting_frame as rf
from mqstore.format import remoting_json as fj
from mqstore.format.record import parse_offset_msg_id
from mqstore.format.remoting_message import BatchItem, encode_batch
from mqstore.testing import wait_for

from cli_support import env
from remoting_support import Served, Wire, deployment_yaml, props, pull_ext, records, send_ext

V2 = {"producerGroup": "a", "topic": "b", "defaultTopic": "c", "defaultTopicQueueNums": "d",
      "queueId": "e", "sysFlag": "f", "bornTimestamp": "g", "flag": "h", "properties": "i",
      "reconsumeTimes": "j", "unitMode": "k", "maxReconsumeTimes": "l", "batch": "m"}


def send(wire, topic, body=b"x", queue_id=0, code=10, **properties):
    return wire.call(code, send_ext(topic, queue_id, props(**properties)), body)


def max_offset(wire, topic, queue_id=0) -> int:
    return int(wire.call(30, {"topic": topic, "queueId": queue_id}).ext["offset"])


def visible(wire, topic, queue_id, count):
    wait_for(lambda: max_offset(wire, topic, queue_id) >= count, timeout=30,
             what=f"{count} messages dispatched to {topic}/{queue_id}")


@pytest.fixture
def wire(served):
    with Wire(served.address) as w:
        yield w


def test_send_answers_offset_ids_of_the_advertised_address(served, wire):
    r = send(wire, "SendT", b"hello", 1, TAGS="TagA", KEYS="k1 k2", UNIQ_KEY="U-1", user="v")
    assert r.code == 0 and r.remark is None
    assert r.ext["queueId"] == "1" and r.ext["queueOffset"] == "0"
    assert r.ext["MSG_REGION"] == "DefaultRegion" and r.ext["TRACE_ON"] == "true"
    host, phys = parse_offset_msg_id(r.ext["msgId"])
    assert str(host) == served.address
    visible(wire, "SendT", 1, 1)
    pulled = wire.call(11, pull_ext("g", "SendT", 1, 0))
    assert pulled.code == 0 and pulled.remark == "FOUND"
    (msg,) = records(pulled.body)
    assert (msg.phys_offset, msg.body, msg.tags, msg.keys, msg.uniq_key) == (
        phys, b"hello", "TagA", ["k1", "k2"], "U-1")
    assert msg.properties["user"] == "v" and msg.properties["CLUSTER"] == "DefaultCluster"
    assert msg.born_host.startswith("127.0.0.1:")


def test_send_v2_and_batch_by_the_batch_field(served, wire):
    ext = send_ext("BatchT", 2, props(TAGS="t2"))
    r = wire.call(310, {V2[k]: v for k, v in ext.items() if k in V2}, b"v2 body")
    assert r.code == 0 and r.ext["queueOffset"] == "0"
    items = [BatchItem(0, b"one", props(KEYS="b1", UNIQ_KEY="B1")),
             BatchItem(0, b"two", props(KEYS="b2", UNIQ_KEY="B2"))]
    ext = {V2[k]: v for k, v in send_ext("BatchT", 2, props(WAIT="true")).items() if k in V2}
    r = wire.call(320, {**ext, "m": "true"}, encode_batch(items))
    assert r.code == 0 and r.ext["queueOffset"] == "1"
    ids = r.ext["msgId"].split(",")
    assert len(ids) == 2 and parse_offset_msg_id(ids[1])[1] > parse_offset_msg_id(ids[0])[1]
    # The C++ client's send_batch: code 10 with batch "1", which Java reads as false.
    r = wire.call(10, send_ext("BatchT", 2, "", batch="1"), encode_batch(items))
    assert r.code == 0 and r.ext["queueOffset"] == "3" and "," not in r.ext["msgId"]
    visible(wire, "BatchT", 2, 4)
    got = records(wire.call(11, pull_ext("g", "BatchT", 2, 0)).body)
    assert [m.body for m in got[:3]] == [b"v2 body", b"one", b"two"]
    assert [m.uniq_key for m in got[1:3]] == ["B1", "B2"]
    assert got[3].body == encode_batch(items)


def test_auto_create_follows_the_default_topic_queue_nums(wire):
    assert wire.call(105, {"topic": "NewT"}).code == 17
    tbw = json.loads(wire.call(105, {"topic": "TBW102"}).body)
    assert tbw["queueDatas"][0]["perm"] == 7  # inherited by new topics
    r = wire.call(10, send_ext("NewT", 1, "", defaultTopicQueueNums=2), b"x")
    assert r.code == 0
    route = json.loads(wire.call(105, {"topic": "NewT"}).body)
    assert route["queueDatas"][0]["readQueueNums"] == 2
    assert route["queueDatas"][0]["writeQueueNums"] == 2


@pytest.mark.parametrize("ext, body, code, remark", [
    ({"topic": None}, b"x", 1, "<topic> is null"),
    ({"queueId": 99}, b"x", 1, "queueId[99] is illegal"),
    ({"queueId": "x1"}, b"x", 1, "queueId = 'x1' is not a Java int"),
    ({"sysFlag": 4}, b"x", 16, "transaction message is forbidden"),
    ({}, None, 13, "body"),
    ({"properties": props(**{"bad\x01": "v"})}, b"x", 13, "reserved separator"),
])
def test_send_refusals(wire, ext, body, code, remark):
    fields = send_ext("RefuseT")
    fields.update(ext)
    r = wire.call(10, {k: v for k, v in fields.items() if v is not None}, body)
    assert r.code == code
    if remark is not None:
        assert remark in r.remark


def test_a_send_with_a_delay_level_is_kept_in_the_schedule_topic(wire):
    r = send(wire, "DelayWireT", b"later", 1, DELAY="2", KEYS="dk")
    # RocketMQ's answer: the queue sent to, the offset in the schedule queue (level 2: queue 1).
    assert r.code == 0 and (r.ext["queueId"], r.ext["queueOffset"]) == ("1", "0")
    pulled = wait_for(lambda: (p := wire.call(11, pull_ext("g", "SCHEDULE_TOPIC_XXXX", 1, 0)))
                      .code == 0 and p, what="the schedule record")
    (m,) = records(pulled.body)
    assert (m.topic, m.queue_id, m.body) == ("SCHEDULE_TOPIC_XXXX", 1, b"later")
    assert {k: m.properties[k] for k in ("DELAY", "REAL_TOPIC", "REAL_QID", "KEYS")} == {
        "DELAY": "2", "REAL_TOPIC": "DelayWireT", "REAL_QID": "1", "KEYS": "dk"}
    batch = wire.call(320, send_ext("DelayWireT", 1, "", batch="true"),
                      encode_batch([BatchItem(0, b"a", props(DELAY="1"))]))
    assert batch.code == 13 and "DELAY" in batch.remark  # MESSAGE_ILLEGAL, as RocketMQ


def test_a_retry_past_its_maximum_goes_to_the_dead_letter_topic(wire):
    r = wire.call(10, send_ext("%RETRY%dg", 0, "", reconsumeTimes=3, maxReconsumeTimes=3), b"d")
    assert r.code == 0 and r.ext["queueId"] == "0"
    route = json.loads(wire.call(105, {"topic": "%DLQ%dg"}).body)["queueDatas"][0]
    # As RocketMQ 4.9.8's broker keeps a group's DLQ (the broker fixture's topics.json).
    assert (route["readQueueNums"], route["writeQueueNums"], route["perm"]) == (1, 1, 6)
    visible(wire, "%DLQ%dg", 0, 1)
    (m,) = records(wire.call(11, pull_ext("dg", "%DLQ%dg", 0, 0)).body)
    assert m.body == b"d"


def test_a_groups_retry_topic_is_created_where_sends_may_not_create_topics(tmp_path):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "root",
                           extra="topics: {auto_create: false}\n")
    server = Served(yaml, tmp_path / "serve.log")
    try:
        with Wire(server.address) as w:
            refused = send(w, "PlainT", b"p")
            assert refused.code == 17 and "PlainT" in refused.remark
            r = w.call(10, send_ext("%RETRY%rg", 0, "", reconsumeTimes=2), b"again")
            assert r.code == 0 and r.ext["queueId"] == "0"
            route = json.loads(w.call(105, {"topic": "%RETRY%rg"}).body)["queueDatas"][0]
            assert (route["readQueueNums"], route["writeQueueNums"], route["perm"]) == (1, 1, 6)
            visible(w, "%RETRY%rg", 0, 1)
            (m,) = records(w.call(11, pull_ext("rg", "%RETRY%rg", 0, 0)).body)
            assert (m.body, m.record.reconsume_times) == (b"again", 2)
    finally:
        server.stop()


def test_pull_codes_and_offsets(wire):
    for i in range(3):
        send(wire, "PullT", b"m%d" % i, 0, TAGS="A" if i != 1 else "B")
    visible(wire, "PullT", 0, 3)
    r = wire.call(11, pull_ext("g", "PullT", 0, 0, max_msgs=2))
    assert r.code == 0 and r.ext == {"suggestWhichBrokerId": "0", "nextBeginOffset": "2",
                                     "minOffset": "0", "maxOffset": "3"}
    assert [m.queue_offset for m in records(r.body)] == [0, 1]
    r = wire.call(11, pull_ext("g", "PullT", 0, 3))
    assert (r.code, r.remark, r.ext["nextBeginOffset"]) == (19, "OFFSET_OVERFLOW_ONE", "3")
    r = wire.call(11, pull_ext("g", "PullT", 0, 9))
    assert (r.code, r.remark, r.ext["nextBeginOffset"]) == (21, "OFFSET_OVERFLOW_BADLY", "3")
    r = wire.call(11, pull_ext("g", "PullT", 3, 0))  # an empty queue of the topic
    assert r.code == 19 and r.remark in ("NO_MATCHED_LOGIC_QUEUE", "NO_MESSAGE_IN_QUEUE")
    assert wire.call(11, pull_ext("g", "PullT", 3, 5)).code == 21
    r = wire.call(11, pull_ext("g", "NoSuchT", 0, 0))
    assert r.code == 17 and "NoSuchT" in r.remark
    r = wire.call(11, pull_ext("g", "PullT", 0, 0, subscription="B"))
    assert [m.body for m in records(r.body)] == [b"m1"]
    r = wire.call(11, pull_ext("g", "PullT", 0, 0, subscription="TAGS = 'A'",
                                expressionType="SQL92"))
    assert [m.body for m in records(r.body)] == [b"m0", b"m2"]
    r = wire.call(11, pull_ext("g", "PullT", 0, 0, subscription="a = = b",
                                expressionType="SQL92"))
    assert r.code == 23 and "does not parse" in r.remark


def test_pull_without_subscription_uses_the_heartbeat(wire):
    send(wire, "HbT", b"x", 0)
    visible(wire, "HbT", 0, 1)
    r = wire.call(11, pull_ext("hbg", "HbT", 0, 0, sysflag=0))
    assert r.code == 24 and "group info not exist" in r.remark
    beat = {"clientID": "c1", "consumerDataSet": [{
        "groupName": "hbg", "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_FIRST_OFFSET", "subscriptionDataSet": [
            {"topic": "HbT", "subString": "*", "subVersion": 5, "expressionType": "TAG"}]}]}
    assert wire.call(34, {}, json.dumps(beat).encode()).code == 0
    assert wire.call(11, pull_ext("hbg", "HbT", 0, 0, sysflag=0)).code == 0
    r = wire.call(11, pull_ext("hbg", "HbT", 0, 0, sysflag=0, subVersion=6))
    assert r.code == 25
    r = wire.call(11, pull_ext("hbg", "OtherT", 0, 0, sysflag=0))
    assert r.code in (17, 24)
    # The heartbeat created the group's retry topic.
    route = json.loads(wire.call(105, {"topic": "%RETRY%hbg"}).body)["queueDatas"][0]
    assert (route["readQueueNums"], route["perm"]) == (1, 6)


def test_held_pull_wakes_when_a_message_arrives_and_answers_out_of_order(served, wire):
    send(wire, "HoldT", b"first", 0)
    visible(wire, "HoldT", 0, 1)
    held = wire.request(11, pull_ext("g", "HoldT", 0, 1, sysflag=6, suspend_ms=20_000))
    later = wire.request(30, {"topic": "HoldT", "queueId": 0})
    first = wire.read()
    assert first.opaque == later and first.ext["offset"] == "1"  # the held pull answers later
    start = time.monotonic()
    with Wire(served.address) as other:
        assert send(other, "HoldT", b"second", 0).code == 0
    r = wire.response(held)
    assert time.monotonic() - start < 10
    assert r.code == 0 and [m.body for m in records(r.body)] == [b"second"]


def test_held_pull_times_out_with_pull_not_found(wire):
    send(wire, "HoldT2", b"x", 0)
    visible(wire, "HoldT2", 0, 1)
    start = time.monotonic()
    r = wire.call(11, pull_ext("g", "HoldT2", 0, 1, sysflag=6, suspend_ms=500))
    assert r.code == 19 and time.monotonic() - start >= 0.45


def test_offsets_commit_in_pull_update_and_query(served, wire):
    for q in (0, 1, 3):
        send(wire, "OffT", b"x", q)
        visible(wire, "OffT", q, 1)
    q = {"consumerGroup": "og", "topic": "OffT", "queueId": 0}
    assert wire.call(14, q).ext["offset"] == "0"  # offset 0 still stored: a new group reads it
    assert wire.call(14, {**q, "queueId": 2}).code == 22  # an empty queue: not found
    r = wire.call(11, pull_ext("og", "OffT", 0, 0, sysflag=5, commitOffset=1))
    assert r.code == 0
    assert wire.call(14, q).ext["offset"] == "1"
    assert wire.call(15, {**q, "queueId": 1, "commitOffset": 7}).code == 0
    wire.request(15, {**q, "queueId": 3, "commitOffset": 9}, oneway=True)
    assert wire.call(14, {**q, "queueId": 1}).ext["offset"] == "7"
    assert wire.call(14, {**q, "queueId": 3}).ext["offset"] == "9"
    root = served.log_path.parent / "root"
    out = subprocess.run([sys.executable, "-m", "mqstore.cli", "group", "describe", str(root),
                          "og", "-t", "OffT", "--json"], capture_output=True, text=True,
                         env=env(), timeout=60)
    assert out.returncode == 0, out.stderr
    queues = {q["queue_id"]: q["committed_offset"] for q in json.loads(out.stdout)[0]["queues"]}
    assert (queues[0], queues[1], queues[3]) == (1, 7, 9)


def test_offsets_by_time_and_queue_extremes(wire):
    assert wire.call(30, {"topic": "TimeT", "queueId": 0}).ext["offset"] == "0"
    assert wire.call(32, {"topic": "TimeT", "queueId": 0}).ext["timestamp"] == "-1"
    for i in range(3):
        send(wire, "TimeT", b"t%d" % i, 0)
        time.sleep(0.01)
    visible(wire, "TimeT", 0, 3)
    stored = records(wire.call(11, pull_ext("g", "TimeT", 0, 0)).body)
    times = [m.store_timestamp for m in stored]
    q = {"topic": "TimeT", "queueId": 0}
    assert wire.call(31, q).ext["offset"] == "0"
    assert wire.call(30, q).ext["offset"] == "3"
    assert wire.call(32, q).ext["timestamp"] == str(times[0])
    for i, when in enumerate(times):
        r = wire.call(29, {**q, "timestamp": when})
        assert r.code == 0 and r.ext["offset"] == str(stored[[t for t in times].index(when)]
                                                      .queue_offset)
    assert wire.call(29, {**q, "timestamp": times[-1] + 60_000}).ext["offset"] == "3"
    r = wire.call(30, q, serialize=rf.ROCKETMQ)
    assert r.serialize_type == rf.ROCKETMQ and r.ext == {"offset": "3"}


def test_view_by_id_and_query_by_key(wire):
    r = send(wire, "KeyT", b"keyed", 0, KEYS="order-7", UNIQ_KEY="UQ-7")
    _host, phys = parse_offset_msg_id(r.ext["msgId"])
    visible(wire, "KeyT", 0, 1)
    (msg,) = records(wire.call(33, {"offset": phys}).body)
    assert msg.body == b"keyed" and msg.phys_offset == phys
    r = wire.call(33, {"offset": phys + 1})
    assert r.code == 1 and "can not find message" in r.remark
    window = {"topic": "KeyT", "maxNum": 32, "beginTimestamp": 0,
              "endTimestamp": int(time.time() * 1000) + 60_000}

    def query(**more):
        return wire.call(12, {**window, **more})
    wait_for(lambda: query(key="order-7").code == 0, timeout=30, what="the key indexed")
    r = query(key="order-7")
    assert [m.body for m in records(r.body)] == [b"keyed"]
    assert r.ext["indexLastUpdatePhyoffset"] == str(phys)
    r = query(key="UQ-7", _UNIQUE_KEY_QUERY="true")
    assert [m.uniq_key for m in records(r.body)] == ["UQ-7"]
    assert query(key="nothing").code == 22


def heartbeat(wire, client_id, group, topic="GrpT", cpp=False):
    if cpp:  # the C++ client's form: enums as numbers, subVersion a string, a trailing newline
        data = {"consumeFromWhere": 0, "consumeType": 1, "groupName": group,
                "messageModel": 1, "subscriptionDataSet": [
                    {"subString": "*", "subVersion": "1", "topic": topic}]}
        body = (json.dumps({"clientID": client_id, "consumerDataSet": [data]}) + "\n").encode()
    else:
        body = json.dumps({"clientID": client_id, "consumerDataSet": [{
            "groupName": group, "consumeType": "CONSUME_PASSIVELY",
            "messageModel": "CLUSTERING", "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET",
            "subscriptionDataSet": [{"topic": topic, "subString": "*", "subVersion": 1,
                                     "expressionType": "TAG"}]}],
            "producerDataSet": [{"groupName": "pg"}]}).encode()
    return wire.call(34, {}, body)


def test_group_membership_is_told_to_its_members(served, wire):
    group = {"consumerGroup": "mg"}
    assert wire.call(38, group).code == 1
    assert heartbeat(wire, "client-a", "mg").code == 0
    assert fj.loads(wire.call(38, group).body) == {"consumerIdList": ["client-a"]}
    with Wire(served.address) as other:
        assert heartbeat(other, "client-b", "mg", cpp=True).code == 0
        note = wire.read()  # the oneway notification arrives on a's connection
        assert (note.code, note.is_oneway, note.is_response, note.ext) == (
            40, True, False, {"consumerGroup": "mg"})
        assert fj.loads(wire.call(38, group).body)["consumerIdList"] == ["client-a", "client-b"]
        conns = fj.loads(wire.call(203, group).body)
        assert {c["clientId"] for c in conns["connectionSet"]} == {"client-a", "client-b"}
        assert conns["subscriptionTable"]["GrpT"]["subString"] == "*"
    assert wire.read().code == 40  # b's connection closed
    assert fj.loads(wire.call(38, group).body)["consumerIdList"] == ["client-a"]
    assert wire.call(35, {"clientID": "client-a", "consumerGroup": "mg",
                          "producerGroup": ""}).code == 0
    assert wire.call(38, group).code == 1


def test_queue_locks_belong_to_one_client_until_unlocked(wire):
    mqs = [{"brokerName": "mqstore", "queueId": q, "topic": "LockT"} for q in (0, 1)]

    def lock(client, call=41):
        body = json.dumps({"consumerGroup": "lg", "clientId": client, "mqSet": mqs}).encode()
        r = wire.call(call, {}, body)
        assert r.code == 0
        return fj.loads(r.body)["lockOKMQSet"] if call == 41 else None
    assert lock("a") == mqs
    assert lock("b") == []
    assert lock("a") == mqs  # renewed
    lock("a", 42)
    assert lock("b") == mqs


def test_topic_admin_and_name_server_answers(wire):
    r = wire.call(17, {"topic": "AdmT", "defaultTopic": "TBW102", "readQueueNums": 3,
                       "writeQueueNums": 2, "perm": 6, "topicFilterType": "SINGLE_TAG",
                       "topicSysFlag": 0, "order": "false"})
    assert (r.code, r.remark) == (0, "not set any response code")
    table = fj.loads(wire.call(21, {}).body)
    assert table["topicConfigTable"]["AdmT"] == {
        "order": False, "perm": 6, "readQueueNums": 3, "topicFilterType": "SINGLE_TAG",
        "topicName": "AdmT", "topicSysFlag": 0, "writeQueueNums": 2}
    assert set(table["dataVersion"]) == {"counter", "timestamp"}
    assert "AdmT" in fj.loads(wire.call(206, {}).body)["topicList"]
    cluster = fj.loads(wire.call(106, {}).body)
    (addr,) = cluster["brokerAddrTable"]["mqstore"]["brokerAddrs"].values()
    assert cluster["clusterAddrTable"] == {"DefaultCluster": ["mqstore"]}
    route = fj.loads(wire.call(105, {"topic": "AdmT"}, version=63).body)
    assert route["brokerDatas"][0]["brokerAddrs"] == {0: addr}
    assert route["queueDatas"][0]["readQueueNums"] == 3
    send(wire, "AdmT", b"x", 1)
    visible(wire, "AdmT", 1, 1)
    stats = fj.loads(wire.call(202, {"topic": "AdmT"}).body)["offsetTable"]
    key = fj.ObjectKey.of(brokerName="mqstore", queueId=1, topic="AdmT")
    assert stats[key]["maxOffset"] == 1 and stats[key]["minOffset"] == 0
    assert len(stats) == 3
    assert wire.call(15, {"consumerGroup": "ag", "topic": "AdmT", "queueId": 1,
                          "commitOffset": 1}).code == 0
    consume = fj.loads(wire.call(208, {"consumerGroup": "ag", "topic": "AdmT"}).body)
    assert consume["offsetTable"][key] == {"brokerOffset": 1, "consumerOffset": 1,
                                           "lastTimestamp": consume["offsetTable"][key][
                                               "lastTimestamp"]}
    assert fj.loads(wire.call(300, {"topic": "AdmT"}).body) == {"groupList": ["ag"]}
    none = wire.call(208, {"consumerGroup": "nobody-g"})  # no offsets: an empty table
    assert none.code == 0 and fj.loads(none.body) == {"consumeTps": 0.0, "offsetTable": {}}
    info = fj.loads(wire.call(28, {}).body)["table"]
    assert info["brokerVersionDesc"] == "V4_9_8" and int(info["msgPutTotalTodayNow"]) >= 1
    assert wire.call(203, {"consumerGroup": "nobody"}).code == 206


def test_send_back_goes_to_the_retry_topic_then_the_dead_letter_topic(served, wire):
    r = send(wire, "BackT", b"fails", 0, KEYS="bk", TAGS="tb", UNIQ_KEY="U1")
    origin = r.ext["msgId"]
    _host, offset = parse_offset_msg_id(origin)
    back = {"offset": offset, "group": "bg", "delayLevel": 0, "originMsgId": origin,
            "originTopic": "BackT", "maxReconsumeTimes": 1}
    assert wire.call(36, back).code == 0
    # Reconsume times 0 -> level 3 in the schedule, for %RETRY%bg, with the origin's props.
    sched = wait_for(lambda: (p := wire.call(11, pull_ext("g", "SCHEDULE_TOPIC_XXXX", 2, 0)))
                     .code == 0 and p, what="the retry in the schedule")
    (m,) = records(sched.body)
    assert m.body == b"fails" and m.record.reconsume_times == 1
    assert {k: m.properties[k] for k in ("DELAY", "REAL_TOPIC", "RETRY_TOPIC",
                                         "ORIGIN_MESSAGE_ID", "KEYS", "TAGS", "UNIQ_KEY")} == {
        "DELAY": "3", "REAL_TOPIC": "%RETRY%bg", "RETRY_TOPIC": "BackT",
        "ORIGIN_MESSAGE_ID": origin, "KEYS": "bk", "TAGS": "tb", "UNIQ_KEY": "U1"}
    route = json.loads(wire.call(105, {"topic": "%RETRY%bg"}).body)["queueDatas"][0]
    assert (route["readQueueNums"], route["perm"]) == (1, 6)
    # The retry's record (reconsume times 1) sent back again: past the maximum, the DLQ.
    again = {**back, "offset": m.record.phys_offset, "delayLevel": 0}
    assert wire.call(36, again).code == 0
    visible(wire, "%DLQ%bg", 0, 1)
    (d,) = records(wire.call(11, pull_ext("bg", "%DLQ%bg", 0, 0)).body)
    assert d.record.reconsume_times == 2 and d.body == b"fails"
    assert {k: d.properties[k] for k in ("DELAY", "RETRY_TOPIC", "ORIGIN_MESSAGE_ID",
                                         "UNIQ_KEY")} == {
        "DELAY": "0", "RETRY_TOPIC": "BackT", "ORIGIN_MESSAGE_ID": origin, "UNIQ_KEY": "U1"}
    # A level below 0 goes straight to the DLQ; an offset with no record is refused.
    assert wire.call(36, {**back, "delayLevel": -1}).code == 0
    visible(wire, "%DLQ%bg", 0, 2)
    gone = wire.call(36, {**back, "offset": 1 << 40})
    assert (gone.code, gone.remark) == (1, f"look message by offset failed, {1 << 40}")


def test_runtime_info_reads_the_disk_and_rates_as_rocketmq_4_9_8(served, wire):
    import math
    import os
    info = fj.loads(wire.call(28, {}).body)["table"]
    for key in ("putTps", "getFoundTps", "getMissTps", "getTransferedTps", "getTotalTps"):
        assert len(info[key].split(" ")) == 3, (key, info[key])  # 10 s, 60 s, 600 s
    # Total minus free blocks over that plus what non-root users may take, up to a percent.
    disk = os.statvfs(served.log_path.parent / "root" / "commitlog")
    used = disk.f_blocks - disk.f_bfree
    expected = math.ceil(used * 100 / (used + disk.f_bavail)) / 100
    ratio = info["commitLogDiskRatio"]
    assert len(ratio.split(".")[1]) <= 2 and abs(float(ratio) - expected) <= 0.01, ratio


@pytest.mark.parametrize("code", [999])
def test_unserved_codes_name_themselves(wire, code):
    r = wire.call(code, {})
    assert (r.code, r.remark) == (3, f"request type {code} not supported")


def test_oneway_requests_get_no_reply(wire):
    wire.request(999, {}, oneway=True)
    wire.request(15, {"consumerGroup": "ow", "topic": "OwT", "queueId": 0, "commitOffset": 3},
                 oneway=True)
    r = wire.call(14, {"consumerGroup": "ow", "topic": "OwT", "queueId": 0})
    assert r.ext["offset"] == "3" and not wire.unmatched


def test_binary_requests_get_binary_replies(wire):
    r = send(wire, "BinT", b"b", 0)
    assert r.serialize_type == rf.JSON
    r = wire.call(10, send_ext("BinT", 0, ""), b"b2", serialize=rf.ROCKETMQ)
    assert r.serialize_type == rf.ROCKETMQ and r.code == 0 and r.ext["queueOffset"] == "1"
    r = wire.call(999, {}, serialize=rf.ROCKETMQ)
    assert r.serialize_type == rf.ROCKETMQ and r.code == 3


def test_a_peer_sending_garbage_is_told_and_closed(served):
    with socket.create_connection(("127.0.0.1", served.port), timeout=30) as s:
        s.sendall(b"\x00\x00\x00\x08\x07\x00\x00\x00abcd")
        wire = Wire.__new__(Wire)
        wire.sock, wire._buf, wire.unmatched = s, b"", []
        r = wire.read()
        assert r.code == 1 and "serialize type 7" in r.remark
        with pytest.raises(EOFError):
            wire.read()

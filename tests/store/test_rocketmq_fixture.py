"""A store written by RocketMQ 4.9.8's own code opens read-only and answers as RocketMQ did.

The fixture (../shared/fixtures/rocketmq-4.9.8) holds the store directory and RocketMQ's own
answers. One deliberate difference: RocketMQ's tag filter compares hashes only, so a
subscription to ``Ea`` also returns ``FB`` messages (equal Java hash codes). mqstore confirms
the real tag string, so those colliding messages are dropped from its answers.
"""

from __future__ import annotations

import base64
import pytest

from mqstore import GetStatus, MessageStore
from mqstore.hashing import java_string_hash

@pytest.fixture(scope="module")
def store(rocketmq_dir):
    with MessageStore.open(rocketmq_dir, read_only=True) as s:
        yield s


def test_read_only_open_changes_nothing_on_disk(rocketmq_dir, manifest, store):
    import hashlib
    for entry in manifest["files"]:
        path = rocketmq_dir.parent / entry["path"]
        assert path.stat().st_size == entry["size"], entry["path"]
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry["sha256"], entry["path"]
    assert not (rocketmq_dir / "mqstore.json").exists()
    assert store.hash_kind == "java"


def test_sizes_come_from_the_files(store):
    assert store.internals.commit_log.segment_bytes == 32768
    assert store.consume_queue("OrderEvents", 0).file_bytes == 600


def test_recovery_finds_the_exact_end(store, manifest):
    assert store.recovery_report.commit_log_end == manifest["summary"]["maxPhyOffsetAtShutdown"]
    assert store.recovery_report.truncated_bytes == 0
    assert not store.recovery_report.consume_queue_units_dropped


def test_every_message_field(store, manifest):
    for m in manifest["messages"]:
        got = store.message_at(m["commitLogOffset"])
        assert got is not None, m["index"]
        assert got.topic == m["topic"]
        assert got.queue_id == m["queueId"]
        assert got.queue_offset == m["queueOffset"]
        assert got.phys_offset == m["commitLogOffset"]
        assert got.size == m["size"]
        assert got.msg_id == m["msgId"]
        assert got.flag == m["flag"]
        assert got.sysflag == m["sysFlag"]
        assert got.body_crc == m["bodyCRC"]
        assert got.reconsume_times == m["reconsumeTimes"]
        assert got.prepared_tx_offset == m["preparedTransactionOffset"]
        assert got.born_timestamp == m["bornTimestamp"]
        assert got.store_timestamp == m["storeTimestamp"]
        for host, want in ((got.record.born_host, m["bornHost"]), (got.record.store_host, m["storeHost"])):
            assert host.address.hex().upper() == want["ipHex"]
            assert host.port == want["port"]
            assert host.is_v6 == (want["family"] == "ipv6")
        assert got.properties_text == m["propertiesString"]
        assert got.properties == m["propertiesDecoded"]
        assert got.tags == m["tags"]
        assert got.properties.get("KEYS") == m["keys"]
        assert got.uniq_key == m["uniqKey"]
        assert got.body == base64.b64decode(m["body"])
        if m["bodyCompressed"]:
            assert got.decompressed_body() == base64.b64decode(m["bodyUncompressed"])
        assert store.message_by_id(m["msgId"]).phys_offset == m["commitLogOffset"]


def test_tag_codes_in_consume_queues(store, manifest):
    for m in manifest["messages"]:
        cq = store.consume_queue(m["topic"], m["queueId"])
        seg = cq.segments.find(m["queueOffset"] * 20)
        unit = cq.units_of(seg)[(m["queueOffset"] * 20 - seg.start) // 20]
        assert int(unit["phys_offset"]) == m["commitLogOffset"]
        assert int(unit["size"]) == m["size"]
        assert int(unit["tags_code"]) == m["tagsCode"]
        if m["tags"]:
            assert java_string_hash(m["tags"]) == m["tagsCode"]


def test_store_info(store, manifest):
    info = manifest["expected"]["storeInfo"]
    assert store.min_phys_offset == info["minPhyOffset"]
    assert store.max_phys_offset == info["maxPhyOffset"]
    for q in info["queues"]:
        assert store.min_offset(q["topic"], q["queueId"]) == q["minOffsetInQueue"], q
        assert store.max_offset(q["topic"], q["queueId"]) == q["maxOffsetInQueue"], q
        assert store.earliest_message_time(q["topic"], q["queueId"]) == q["earliestMessageTime"], q
    assert store.topics() == ["OrderEvents", "audit-log", "metrics.cpu"]
    assert store.queue_ids("metrics.cpu") == list(range(7))  # queue 7 never got a message


def _tag_set(subscription):
    return {t.strip() for t in subscription.split("||") if t.strip()}


def test_every_get_message_answer(store, manifest):
    by_offset = {m["commitLogOffset"]: m for m in manifest["messages"]}
    adjusted = 0
    for case in manifest["expected"]["getMessage"]:
        sub = case["subscription"]
        res = store.get(manifest["generator"]["consumerGroup"], case["topic"], case["queueId"],
                        case["offset"], case["maxMsgNums"], expression=sub)
        want = case["messages"]
        status = case["status"]
        if sub not in (None, "*"):
            tags = _tag_set(sub)
            kept = [w for w in want if by_offset[w["commitLogOffset"]]["tags"] in tags]
            if len(kept) != len(want):
                adjusted += 1
                want = kept
                if not kept:
                    status = "NO_MATCHED_MESSAGE"
        label = (case["topic"], case["queueId"], case["offset"], sub)
        assert res.status == GetStatus[status], label
        assert res.next_begin_offset == case["nextBeginOffset"], label
        assert res.min_offset == case["minOffset"], label
        assert res.max_offset == case["maxOffset"], label
        assert res.suggest_pulling_from_slave == case["suggestPullingFromSlave"], label
        got = [(m.topic, m.queue_id, m.queue_offset, m.phys_offset, m.size, m.tags, m.msg_id)
               for m in res.messages]
        assert got == [(w["topic"], w["queueId"], w["queueOffset"], w["commitLogOffset"],
                        w["size"], w["tags"], w["msgId"]) for w in want], label
        if len(want) == len(case["messages"]):
            assert res.buffer_total_size == case["bufferTotalSize"], label
    # Exactly the subscriptions whose answers held hash-colliding tags (Ea / FB) differ.
    assert adjusted == 4


def test_read_only_store_refuses_writes(store):
    from mqstore import Message, PutStatus
    assert store.put(Message(topic="OrderEvents", body=b"x")).status == PutStatus.SERVICE_NOT_AVAILABLE

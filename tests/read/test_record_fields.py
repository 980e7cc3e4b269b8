"""record_fields: the string fields of served rows in bulk, equal to StoredMessage's, row by row."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import Message
from mqstore.format.properties import decode_properties
from mqstore.message import MessageBatch
from mqstore.read.fields import _properties, record_fields


def _maps(fields, n):
    names, values = fields.properties.names.to_list(), fields.properties.values.to_list()
    o = fields.properties.offsets.tolist()
    return [dict(zip(names[o[i]:o[i + 1]], values[o[i]:o[i + 1]])) for i in range(n)]


def _lists(lists, n):
    items, o = lists.items.to_list(), lists.offsets.tolist()
    return [items[o[i]:o[i + 1]] for i in range(n)]


def assert_matches_messages(store, batch):
    n = len(batch)
    got = record_fields(store.internals.commit_log, batch)
    msgs = [batch.message(i) for i in range(n)]
    assert got.born_hosts.to_list() == [m.born_host for m in msgs]
    assert got.store_hosts.to_list() == [m.store_host for m in msgs]
    assert got.msg_ids.to_list() == [m.msg_id for m in msgs]
    assert got.tags.to_list() == [m.tags for m in msgs]
    assert _lists(got.keys, n) == [m.keys for m in msgs]
    maps = _maps(got, n)
    for m, d in zip(msgs, maps):
        assert list(d.items()) == list(m.properties.items())  # the same order, too
    return got


@pytest.mark.loops("thread")
def test_every_field_of_varied_messages(make_store):
    store = make_store({"store": {"store_host": "[2001:db8::7]:10911"}})
    msgs = []
    for i in range(300):
        msgs.append(Message(
            topic="T", body=b"b%d" % i, queue_id=i % 3,
            tags=None if i % 4 == 0 else f"tag{i % 5}",
            keys=[] if i % 3 == 0 else [f"k{i}", "ü-key", f"x{i % 2}"],
            properties=None if i % 5 == 0 else {"温度": f"{i}℃", "p": "v" * (1 + i % 3)},
            born_host="10.1.2.3:%d" % (1000 + i % 4) if i % 7 else "[::1]:65535"))
    assert store.put_batch(msgs).status.stored
    store.put_batch(MessageBatch(topic="T", bodies=[b"z"] * 200, queue_ids=1, tags="bulk",
                                 keys=[["a", "b"]] * 200))
    store.wait_dispatched()
    total = 0
    for q in range(3):
        batch = store.read("T", q, 0, 1000)
        total += len(batch)
        assert_matches_messages(store, batch)
    assert total == 500


@pytest.mark.loops("thread")
def test_ipv4_hosts_that_differ_within_a_batch(make_store, tmp_path):
    # IPv4 only (the 64-bit host codes): born hosts that differ by address and by port, and
    # store hosts that differ within one batch (the store reopened under another host).
    root = tmp_path / "hosts"
    for k, host in enumerate(("10.0.0.1:10911", "10.0.0.2:10912")):
        store = make_store({"store": {"store_host": host}}, root=root)
        store.put_batch([Message(topic="H", body=b"%d" % i, queue_id=0,
                                 born_host=f"192.168.{i % 3}.1:{7000 + i % 2}")
                         for i in range(50 * k, 50 * k + 50)])
        store.wait_dispatched()
        store.close()
    store = make_store(root=root, read_only=True)
    batch = store.read("H", 0, 0, 1000)
    assert len(batch) == 100
    got = assert_matches_messages(store, batch)
    assert len(set(got.store_hosts.to_list())) == 2 and len(set(got.born_hosts.to_list())) == 6


@pytest.mark.loops("thread")
def test_rows_across_segments_and_an_empty_batch(make_store):
    store = make_store({"commit_log": {"segment_bytes": 64 * 1024}})
    for _ in range(6):
        store.put_batch(MessageBatch(topic="S", bodies=[b"x" * 500] * 40, queue_ids=0,
                                     tags="t", properties={"a": "1"}))
    store.wait_dispatched()
    batch = store.read("S", 0, 0, 1000)
    assert len(batch) == 240 and len(set(batch.phys_offsets // (64 * 1024))) > 2
    assert_matches_messages(store, batch)
    empty = record_fields(store.internals.commit_log, store.read("S", 0, 240, 10))
    assert empty.tags.to_list() == [] and empty.properties.offsets.tolist() == [0]


def test_rocketmq_fixture(rocketmq_dir, manifest):
    from mqstore import MessageStore
    by_offset = {m["commitLogOffset"]: m for m in manifest["messages"]}
    with MessageStore.open(rocketmq_dir, read_only=True) as store:
        seen = 0
        for topic in store.topics():
            for q in store.queue_ids(topic):
                offset = 0
                while offset < store.max_offset(topic, q):  # a read stops at a file's end
                    batch = store.read(topic, q, offset, 1000)
                    got = assert_matches_messages(store, batch)
                    seen += len(batch)
                    offset = batch.next_begin_offset
                    for phys, msg_id in zip(batch.phys_offsets.tolist(),
                                            got.msg_ids.to_list()):
                        assert msg_id == by_offset[phys]["msgId"]
        assert seen == manifest["summary"]["messageCount"]


# Bytes a properties block may hold, weighted towards the separators and the rules' edges.
_PIECES = st.sampled_from([b"\x01", b"\x02", b" ", b"a", b"TAGS", b"KEYS", b"\xc3\xa9",
                           b"\xe2\x84\x83", b"\xff", b"\xc3", b"b c", b"\x02\x02"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(_PIECES, max_size=12).map(b"".join), max_size=8))
def test_properties_parse_as_decode_properties(blocks):
    check_blocks(blocks)


def check_blocks(blocks):
    data = np.frombuffer(b"".join(blocks), dtype=np.uint8)
    offsets = np.zeros(len(blocks) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in blocks], out=offsets[1:])
    maps, tags, keys = _properties(data, offsets)
    names, values, o = maps.names.to_list(), maps.values.to_list(), maps.offsets.tolist()
    key_items, ko = keys.items.to_list(), keys.offsets.tolist()
    for i, block in enumerate(blocks):
        want = decode_properties(block.decode("utf-8", errors="replace"))
        assert list(zip(names[o[i]:o[i + 1]], values[o[i]:o[i + 1]])) == list(want.items())
        assert tags.to_list()[i] == want.get("TAGS")
        raw_keys = want.get("KEYS")
        assert key_items[ko[i]:ko[i + 1]] == ([k for k in raw_keys.split(" ") if k]
                                              if raw_keys else [])


@settings(max_examples=100, deadline=None)
@given(st.lists(_PIECES, max_size=12).map(b"".join), st.integers(2, 5))
def test_a_batch_of_one_repeated_block(block, n):
    """The shortcut for a batch whose rows share one properties block answers the same."""
    check_blocks([block] * n)


def test_equal_total_but_unequal_blocks():
    check_blocks([b"TAGS\x01a\x02ab", b"T", b"AGS\x01b"])

"""Columnar put_batch (MessageBatch): same records as Message lists, same rules."""

from __future__ import annotations

import pytest

from mqstore import GetStatus, Message, MessageBatch, PutStatus


def _log_bytes(store):
    seg = store.internals.commit_log.segments.segments[0]
    return bytes(seg.mm[:seg.wrote])


@pytest.mark.parametrize("columns, messages", [
    (dict(topic="T", bodies=[b"a", b"", b"ccc"], queue_ids=1, tags="x"),
     [Message(topic="T", body=b, queue_id=1, tags="x") for b in (b"a", b"", b"ccc")]),
    (dict(topic=["T", "U", "T"], bodies=[b"1", b"2", b"3"], queue_ids=[0, 2, 0],
          tags=["a", None, "b"], keys=[["k1", "k2"], None, "k3"],
          properties=[{"p": "1"}, None, {"q": "2"}], flag=7, born_host="[::1]:5",
          born_timestamp=42),
     [Message(topic="T", body=b"1", queue_id=0, tags="a", keys=["k1", "k2"],
              properties={"p": "1"}, flag=7, born_host="[::1]:5", born_timestamp=42),
      Message(topic="U", body=b"2", queue_id=2, flag=7, born_host="[::1]:5", born_timestamp=42),
      Message(topic="T", body=b"3", queue_id=0, tags="b", keys="k3", properties={"q": "2"},
              flag=7, born_host="[::1]:5", born_timestamp=42)]),
    (dict(topic="%RETRY%" + "r" * 130, bodies=[b"v2", b"v2"], queue_ids=0, properties={"a": "b"}),
     [Message(topic="%RETRY%" + "r" * 130, body=b"v2", queue_id=0, properties={"a": "b"})] * 2),
])
def test_columns_write_the_same_bytes_as_messages(make_store, tmp_path, columns, messages):
    a = make_store(root=tmp_path / "a")
    b = make_store(root=tmp_path / "b")
    ra = a.put_batch(MessageBatch(**columns))
    rb = b.put_batch(messages)
    assert ra.status is rb.status is PutStatus.PUT_OK
    assert ra.queue_offsets.tolist() == rb.queue_offsets.tolist()
    assert ra.phys_offsets.tolist() == rb.phys_offsets.tolist()
    assert _log_bytes(a) == _log_bytes(b)


def test_queue_offsets_continue_per_queue(make_store):
    store = make_store()
    store.put(Message(topic="T", body=b"x", queue_id=1))
    r = store.put_batch(MessageBatch(topic="T", bodies=[b"1"] * 5, queue_ids=[1, 0, 1, 3, 1]))
    assert r.queue_offsets.tolist() == [1, 0, 2, 0, 3]
    r = store.put_batch(MessageBatch(topic=["T", "U"], bodies=[b"1", b"2"], queue_ids=1))
    assert r.queue_offsets.tolist() == [4, 0]
    store.wait_dispatched()
    got = store.get("g", "T", 1, 0, 32)
    assert [m.body for m in got.messages] == [b"x", b"1", b"1", b"1", b"1"]


def test_selector_picks_queues_when_none_given(make_store):
    store = make_store({"queue_select": {"selector": "key_hash", "queues_per_topic": 4}})
    keys = [["order-1"], ["order-2"], ["order-1"]]
    r = store.put_batch(MessageBatch(topic="T", bodies=[b"a", b"b", b"c"], keys=keys))
    assert r.status is PutStatus.PUT_OK
    assert r.queue_ids[0] == r.queue_ids[2]
    single = store.put(Message(topic="T", body=b"d", keys=["order-2"]))
    assert single.queue_id == r.queue_ids[1]


@pytest.mark.parametrize("columns, status, index", [
    (dict(topic="T", bodies=[b"ok", None]), PutStatus.MESSAGE_ILLEGAL, 1),
    (dict(topic="T", bodies=[b"ok", b"x" * 2000]), PutStatus.MESSAGE_ILLEGAL, 1),
    (dict(topic="T", bodies=[b"1", b"2"], properties=[None, {"DELAY": "3"}]), PutStatus.MESSAGE_ILLEGAL, 1),
    (dict(topic="T", bodies=[b"1"], properties={"p": "é" * 20000}), PutStatus.PROPERTIES_SIZE_EXCEEDED, 0),
    (dict(topic="A" * 128, bodies=[b"1"]), PutStatus.MESSAGE_ILLEGAL, 0),
])
def test_rejected_batches_write_nothing(make_store, columns, status, index):
    store = make_store({"commit_log": {"max_message_bytes": 1000}})
    r = store.put_batch(MessageBatch(queue_ids=0, **columns))
    assert (r.status, r.error_index) == (status, index)
    assert store.max_phys_offset == 0
    assert store.put(Message(topic="T", body=b"z", queue_id=0)).queue_offset == 0


@pytest.mark.parametrize("columns, needle", [
    (dict(topic="T", bodies=["text"]), "message 0: body must be bytes, got str"),
    (dict(topic="a/b", bodies=[b"1"]), "'a/b'"),
    (dict(topic="T", bodies=[b"1", b"2"], tags=["a"]), "tags has 1 entries for 2 bodies"),
    (dict(topic="T", bodies=[b"1"], queue_ids=[-1]), "queue_id -1"),
    (dict(topic="T", bodies=[b"1"], keys=[["bad key"]]), "'bad key'"),
    (dict(topic="T", bodies=[]), "empty"),
])
def test_bad_arguments_raise(make_store, columns, needle):
    store = make_store()
    with pytest.raises(ValueError, match=needle):
        store.put_batch(MessageBatch(**columns))
    assert store.max_phys_offset == 0


def test_large_batch_spans_segments_and_reads_back(make_store):
    store = make_store({"commit_log": {"segment_bytes": 4096}, "consume_queue": {"file_units": 50}})
    bodies = [bytes([i % 256]) * 200 for i in range(100)]
    r = store.put_batch(MessageBatch(topic="T", bodies=bodies, queue_ids=0, tags="t"))
    assert r.status is PutStatus.PUT_OK
    assert len(store.internals.commit_log.segments.segments) > 5
    store.wait_dispatched()
    got, offset = [], 0
    while True:
        res = store.get("g", "T", 0, offset, 32, expression="t")
        if res.status is not GetStatus.FOUND:
            break
        got += [m.body for m in res.messages]
        offset = res.next_begin_offset
    assert got == bodies

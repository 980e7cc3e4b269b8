"""Damage under a running store: readers get a status or a named error, never garbage."""

from __future__ import annotations

import mmap
import os

import pytest

from mqstore import GetStatus, Message
from mqstore.errors import CorruptRecordError


def _poke(store_dir, offset: int, data: bytes) -> None:
    path = os.path.join(store_dir, "commitlog", "00000000000000000000")
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[offset:offset + len(data)] = data


def test_overwritten_record_is_not_served(make_store, store_dir):
    store = make_store()
    rs = [store.put(Message(topic="T", body=b"x" * 50, queue_id=0)) for _ in range(3)]
    store.wait_dispatched()
    _poke(store_dir, rs[1].phys_offset, b"\0" * 8)  # size and magic gone
    res = store.get("g", "T", 0, 0, 32)
    assert [m.queue_offset for m in res.messages] == [0, 2]
    assert res.filtered_count == 0
    assert res.corrupt == [(1, rs[1].phys_offset, f"record at commit-log offset "
                                                  f"{rs[1].phys_offset}: unknown magic 0x00000000")]
    assert store.message_at(rs[1].phys_offset) is None  # no record starts there any more


def test_inner_lengths_damaged_are_reported_not_served(make_store, store_dir):
    store = make_store()
    r = store.put(Message(topic="T", body=b"x" * 50, queue_id=0))
    store.wait_dispatched()
    _poke(store_dir, r.phys_offset + 84, (10_000).to_bytes(4, "big"))  # BODYLENGTH
    res = store.get("g", "T", 0, 0, 32)  # size, magic and position still agree
    assert (res.status, res.messages, res.next_begin_offset) == (
        GetStatus.NO_MATCHED_MESSAGE, [], 1)
    why = f"record at commit-log offset {r.phys_offset}: body length 10000 overruns the record"
    assert res.corrupt == [(0, r.phys_offset, why)]
    with pytest.raises(CorruptRecordError, match=why):
        store.message_at(r.phys_offset)


@pytest.mark.parametrize("flip_at", [40, 100, 117])  # born time, body, last body byte
def test_a_flipped_bit_is_never_served(make_store, store_dir, flip_at):
    store = make_store()
    rs = [store.put(Message(topic="T", body=bytes(range(30)), queue_id=0)) for _ in range(3)]
    store.wait_dispatched()
    target = rs[1].phys_offset + flip_at
    with open(os.path.join(store_dir, "commitlog", "00000000000000000000"), "rb") as f:
        f.seek(target)
        byte = f.read(1)[0]
    _poke(store_dir, target, bytes([byte ^ 0x10]))
    res = store.get("g", "T", 0, 0, 32)
    served = [(m.queue_offset, m.body) for m in res.messages]
    if flip_at >= 88:  # in the body (88..117): the CRC tells
        assert served == [(0, bytes(range(30))), (2, bytes(range(30)))]
        assert [c[:2] for c in res.corrupt] == [(1, rs[1].phys_offset)]
        assert "body CRC mismatch" in res.corrupt[0][2]
        with pytest.raises(CorruptRecordError, match="body CRC mismatch"):
            store.message_at(rs[1].phys_offset)
    else:  # the born time is not covered by a checksum: the record is served as stored
        assert [q for q, _b in served] == [0, 1, 2]


@pytest.mark.loops("thread")
def test_stale_position_in_a_consume_queue_is_not_served(make_store, store_dir):
    store = make_store()
    a = store.put(Message(topic="T", body=b"a", queue_id=0))
    b = store.put(Message(topic="T", body=b"b", queue_id=0))
    store.wait_dispatched()
    cq = store.consume_queue("T", 0)
    cq.units_of(cq.segments.segments[0])[1]["phys_offset"] = a.phys_offset + 1
    res = store.get("g", "T", 0, 0, 32)
    # The bytes the unit names are not served; its record is found in the log after a's.
    assert [(m.queue_offset, m.phys_offset, m.body) for m in res.messages] == [
        (0, a.phys_offset, b"a"), (1, b.phys_offset, b"b")]
    assert [c[:2] for c in res.corrupt] == [(1, a.phys_offset + 1)]
    assert f"found in the commit log at offset {b.phys_offset}" in res.corrupt[0][2]
    one = store.get("g", "T", 0, 1, 32)
    assert (one.status, [m.body for m in one.messages]) == (GetStatus.FOUND, [b"b"])


@pytest.mark.loops("thread")
def test_a_unit_copied_from_another_queue_is_not_served(make_store, store_dir):
    store = make_store()
    a = store.put(Message(topic="T", body=b"queue 1", queue_id=1))
    b = store.put(Message(topic="T", body=b"queue 2", queue_id=2))
    store.wait_dispatched()
    one = store.consume_queue("T", 1)
    two = store.consume_queue("T", 2)
    one.units_of(one.segments.segments[0])[0] = two.units_of(two.segments.segments[0])[0]
    res = store.get("g", "T", 1, 0, 32)
    # Queue 2's record is not served on queue 1: queue 1's own is found in the log.
    assert [(m.queue_id, m.phys_offset, m.body) for m in res.messages] == [
        (1, a.phys_offset, b"queue 1")]
    assert res.corrupt == [(0, b.phys_offset,
                            f"consume-queue unit 0 of T/1 points at commit-log offset "
                            f"{b.phys_offset}, which holds T/2 offset 0; served the record of "
                            f"queue offset 0 found in the commit log at offset {a.phys_offset}")]
    assert store.get("g", "T", 2, 0, 32).messages[0].body == b"queue 2"
    assert a.queue_offset == 0


@pytest.mark.loops("thread")
@pytest.mark.parametrize("field, delta", [("size", 1 << 16), ("phys_offset", 1 << 32)])
def test_a_unit_past_its_segment_or_the_log_is_served_from_the_log(make_store, store_dir,
                                                                    field, delta):
    # A unit naming bytes across its segment's end or past the log's end is damaged: the
    # record of its offset is found in the log (not taken for a removed segment, which would
    # pass over the rest of the pull silently).
    store = make_store()
    rs = [store.put(Message(topic="T", body=b"m%d" % i, queue_id=0)) for i in range(4)]
    store.wait_dispatched()
    cq = store.consume_queue("T", 0)
    cq.units_of(cq.segments.segments[0])[1][field] += delta
    res = store.get("g", "T", 0, 0, 32)
    assert [(m.queue_offset, m.phys_offset, m.body) for m in res.messages] == [
        (i, r.phys_offset, b"m%d" % i) for i, r in enumerate(rs)]
    assert [c[0] for c in res.corrupt] == [1]
    assert "damaged unit" in res.corrupt[0][2]
    assert f"found in the commit log at offset {rs[1].phys_offset}" in res.corrupt[0][2]
    assert res.next_begin_offset == 4


def test_a_pull_that_serves_past_a_damaged_record_answers_found(make_store, store_dir):
    """The batch fills with the message after a damaged one: FOUND, as for any served message
    (the walk once left NO_MATCHED_MESSAGE standing from the damaged unit)."""
    store = make_store()
    rs = [store.put(Message(topic="T", body=b"m%d" % i, queue_id=0)) for i in range(4)]
    store.wait_dispatched()
    _poke(store_dir, rs[0].phys_offset + 90, b"\xee")  # a body byte: the CRC tells
    for max_msgs in (1, 2):
        res = store.get("g", "T", 0, 0, max_msgs)
        assert res.status is GetStatus.FOUND
        assert [m.body for m in res.messages] == [b"m%d" % i for i in range(1, 1 + max_msgs)]
        assert res.next_begin_offset == 1 + max_msgs
        assert [c[:2] for c in res.corrupt] == [(0, rs[0].phys_offset)]

"""Damage under a running store: readers get a status or a named error, never garbage."""

from __future__ import annotations

import mmap
import os

import pytest

from mqstore import GetStatus, Message


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
    assert res.filtered_count == 1
    assert store.message_at(rs[1].phys_offset) is None


def test_inner_lengths_damaged_raise_a_named_error(make_store, store_dir):
    store = make_store()
    r = store.put(Message(topic="T", body=b"x" * 50, queue_id=0))
    store.wait_dispatched()
    _poke(store_dir, r.phys_offset + 84, (10_000).to_bytes(4, "big"))  # BODYLENGTH
    res = store.get("g", "T", 0, 0, 32)  # size, magic and position still agree
    assert len(res.messages) == 1
    msg = res.messages[0]
    with pytest.raises(ValueError, match="record at 0: body length 10000 overruns"):
        msg.body
    assert store.message_at(r.phys_offset) is None


def test_stale_position_in_a_consume_queue_is_not_served(make_store, store_dir):
    store = make_store()
    a = store.put(Message(topic="T", body=b"a", queue_id=0))
    store.put(Message(topic="T", body=b"b", queue_id=0))
    store.wait_dispatched()
    cq = store.consume_queue("T", 0)
    cq.units_of(cq.segments.segments[0])[1]["phys_offset"] = a.phys_offset + 1
    res = store.get("g", "T", 0, 0, 32)
    assert [m.body for m in res.messages] == [b"a"]
    assert store.get("g", "T", 0, 1, 32).status is GetStatus.NO_MATCHED_MESSAGE

"""The whole-record CRC (``commit_log.record_crc``, RocketMQ 5's ``__CRC32#`` property).

The body CRC leaves the header and the properties unchecked; with the record CRC a flipped bit
anywhere in a record is reported, never served. The property's bytes are RocketMQ's own
(spec: "Optional CRC property"), so RocketMQ reads these records and mqstore checks records
RocketMQ wrote with ``enabledAppendPropCRC``.
"""

from __future__ import annotations

import mmap
import os
import zlib

import pytest

from mqstore import GetStatus, Message, MessageBatch
from mqstore.errors import CorruptRecordError
from mqstore.format import record_crc
from mqstore.format.record import SCAN_BAD, SCAN_OK, scan_record
from mqstore.storage.queue_progress import DispatchMark, write_queued
from mqstore.testing import wait_for

CRC_ON = {"commit_log": {"segment_bytes": 1 << 20, "record_crc": True}}


def _segment(store_dir) -> str:
    return os.path.join(store_dir, "commitlog", "00000000000000000000")


def _raw(store_dir, phys: int, size: int) -> bytes:
    with open(_segment(store_dir), "rb") as f:
        f.seek(phys)
        return f.read(size)


def _flip(store_dir, at: int, bit: int) -> None:
    with open(_segment(store_dir), "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[at] ^= 1 << bit


def _expected_tail(record: bytes) -> bytes:
    """The 20 bytes RocketMQ's encoder ends this record with (spec, worked by hand)."""
    crc = zlib.crc32(record[:-20]) & 0x7FFFFFFF
    return b"__CRC32#\x01" + str(crc)[::-1].ljust(10, "0").encode() + b"\x02"


def test_digits_are_written_least_significant_first():
    assert record_crc.digits(123) == b"3210000000"
    assert record_crc.digits(0) == b"0000000000"
    assert record_crc.digits(0x7FFFFFFF) == b"7463847412"


def test_a_record_ends_with_rocketmqs_crc_property(make_store, store_dir):
    plain = make_store(root=os.path.join(store_dir, "plain"))
    store = make_store(CRC_ON)
    msg = Message("T", b"hello", tags="TagA", keys=["k1"], queue_id=0,
                  born_timestamp=1_700_000_000_000)
    a = plain.put(msg)
    b = store.put(msg)
    assert b.size == a.size + 20
    without = _raw(os.path.join(store_dir, "plain"), a.phys_offset, a.size)
    record = _raw(store_dir, b.phys_offset, b.size)
    assert record[-20:] == _expected_tail(record)
    # Apart from TOTALSIZE, PROPERTIESLENGTH and the store time, the bytes before are those of
    # the record without the property.
    props_len_at = a.size - len(b"TAGS\x01TagA\x02KEYS\x01k1\x02") - 2
    assert record[:4] == (a.size + 20).to_bytes(4, "big")
    assert record[4:56] == without[4:56] and record[64:props_len_at] == without[64:props_len_at]
    assert record[props_len_at:props_len_at + 2] == (
        int.from_bytes(without[props_len_at:props_len_at + 2], "big") + 20).to_bytes(2, "big")
    assert record[props_len_at + 2:-20] == without[props_len_at + 2:]
    store.wait_dispatched()
    got = store.get("g", "T", 0, 0, 32).messages[0]
    assert (got.body, got.tags, got.keys) == (b"hello", "TagA", ["k1"])
    assert got.properties[record_crc.PROPERTY_CRC32] == record[-11:-1].decode()


@pytest.mark.parametrize("how", ["put", "batch alike", "batch keyed", "batch of messages",
                                 "batch of mixed hosts"])
def test_every_put_path_stamps_a_correct_crc(make_store, store_dir, how):
    store = make_store(CRC_ON)
    if how == "put":
        rs = [store.put(Message("T", b"x" * i, tags="a", queue_id=0)) for i in range(1, 6)]
        spans = [(r.phys_offset, r.size) for r in rs]
    else:
        if how == "batch alike":
            batch = MessageBatch("T", [b"y" * 10] * 5, tags="a", queue_ids=0)
        elif how == "batch keyed":
            batch = MessageBatch("T", [b"y" * i for i in range(5)],
                                 keys=[[f"k{i}"] if i % 2 else [] for i in range(5)], queue_ids=0)
        elif how == "batch of messages":
            batch = [Message("T", b"z" * i, queue_id=0, properties={"p": str(i)} if i else None)
                     for i in range(5)]
        else:
            batch = [Message("T", b"w", queue_id=0, born_host="[::1]:5" if i % 2 else None)
                     for i in range(5)]
        r = store.put_batch(batch)
        spans = list(zip(r.phys_offsets.tolist(), r.sizes.tolist()))
    assert len(spans) == 5
    for phys, size in spans:
        record = _raw(store_dir, phys, size)
        assert record[-20:] == _expected_tail(record), phys
        kind, _size, _head = scan_record(record, 0, len(record), True, expected_phys=phys)
        assert kind == SCAN_OK
    store.wait_dispatched()
    assert len(store.get("g", "T", 0, 0, 32).messages) == 5


def _reported(store, offset: int, phys: int) -> list[str]:
    """What each read path answers for the record of queue ``offset``: never the message."""
    seen = []
    bulk = store.get("g", "T", 0, 0, 32)
    assert offset not in [m.queue_offset for m in bulk.messages]
    seen += [why for q, _p, why in bulk.corrupt if q == offset]
    one = store.get("g", "T", 0, offset, 1)
    assert offset not in [m.queue_offset for m in one.messages]
    seen += [why for q, _p, why in one.corrupt if q == offset]
    try:  # no record starts there any more (None), or a damaged one does
        assert store.message_at(phys) is None
    except CorruptRecordError as exc:
        seen.append(str(exc))
    return seen


def test_a_flipped_bit_anywhere_in_a_record_is_never_served(make_store, store_dir):
    store = make_store(CRC_ON)
    msgs = [Message("T", bytes(range(40)), tags="TagA", keys=["k1", "k2"], queue_id=0,
                    properties={"color": "blue"}) for _ in range(3)]
    rs = [store.put(m) for m in msgs]
    store.wait_dispatched()
    target = rs[1]
    for i in range(target.size):
        at = target.phys_offset + i
        _flip(store_dir, at, i % 8)
        try:
            assert _reported(store, 1, target.phys_offset), i
        finally:
            _flip(store_dir, at, i % 8)
    served = store.get("g", "T", 0, 0, 32)
    assert [m.queue_offset for m in served.messages] == [0, 1, 2] and not served.corrupt


@pytest.mark.parametrize("where", ["separator before", "name", "separator after"])
def test_two_flipped_bits_in_the_property_frame_are_caught(make_store, store_dir, where):
    store = make_store(CRC_ON)
    rs = [store.put(Message("T", b"body", tags="TagA", queue_id=0)) for _ in range(2)]
    store.wait_dispatched()
    end = rs[0].phys_offset + rs[0].size
    at = {"separator before": end - 21, "name": end - 17, "separator after": end - 1}[where]
    _flip(store_dir, at, 0)
    _flip(store_dir, at, 1)
    why = _reported(store, 0, rs[0].phys_offset)
    assert all("record CRC property damaged" in w for w in why), why


def test_records_with_and_without_the_property_mix(make_store, store_dir):
    """Turning the setting on or off needs no migration: each record says how it is checked."""
    plain = make_store()
    plain.put(Message("T", b"before", queue_id=0))
    plain.close()
    store = make_store(CRC_ON)
    store.put(Message("T", b"with", queue_id=0))
    store.close()
    again = make_store()
    again.put(Message("T", b"after", queue_id=0))
    again.wait_dispatched()
    got = again.get("g", "T", 0, 0, 32)
    assert [m.body for m in got.messages] == [b"before", b"with", b"after"]
    assert [record_crc.PROPERTY_CRC32 in m.properties for m in got.messages] == [
        False, True, False]


@pytest.mark.parametrize("overrides", [None, CRC_ON], ids=["off", "on"])
def test_a_messages_own_crc_property_is_replaced(make_store, overrides):
    store = make_store(overrides)
    store.put(Message("T", b"copied", queue_id=0,
                      properties={"__CRC32#": "1234567890", "a": "b"}))
    store.wait_dispatched()
    m = store.get("g", "T", 0, 0, 1).messages[0]
    assert m.properties.get("a") == "b"
    if overrides is None:
        assert "__CRC32#" not in m.properties
    else:
        assert m.properties["__CRC32#"] != "1234567890"


def test_a_property_named_like_the_crc_is_refused_and_changes_nothing(make_store, store_dir):
    store = make_store(CRC_ON)
    with pytest.raises(ValueError, match=r"property name '__CRC33#' is within 2 bits"):
        store.put(Message("T", b"x", queue_id=0, properties={"__CRC33#": "0123456789"}))
    assert store.max_phys_offset == 0
    # Farther names are anybody's, even at the end with a ten-character value.
    r = store.put(Message("T", b"x", queue_id=0, properties={"x__CRC32#": "0123456789"}))
    store.wait_dispatched()
    assert store.message_at(r.phys_offset).properties["x__CRC32#"] == "0123456789"


def _crashed_after(store, store_dir, last) -> None:
    """Close ``store``, then leave it as a crash would have soon after the put of ``last``:
    ``abort`` there, and ``mqstore.queued`` naming ``last`` (the derived files' last forced
    record), so recovery walks from it."""
    m = store.message_at(last.phys_offset)
    store.close()
    write_queued(str(store_dir), DispatchMark(m.phys_offset, m.size, m.store_timestamp))
    with open(os.path.join(store_dir, "abort"), "w") as f:
        f.write("1")


def test_recovery_quarantines_a_header_flip_behind_the_checkpoint(make_store, store_dir):
    """Bit rot the body CRC cannot see: recovery after a crash reports the record and keeps
    every record after it."""
    store = make_store(CRC_ON)
    rs = [store.put(Message("T", b"m%d" % i, queue_id=0)) for i in range(20)]
    _crashed_after(store, store_dir, rs[2])
    _flip(store_dir, rs[5].phys_offset + 40, 3)  # BORNTIMESTAMP: outside the body CRC
    kind, why, _ = scan_record(_raw(store_dir, 0, rs[-1].phys_offset + rs[-1].size),
                               rs[5].phys_offset, 1 << 20, True,
                               expected_phys=rs[5].phys_offset)
    assert (kind, why) == (SCAN_BAD, "record CRC mismatch")
    again = make_store(CRC_ON)
    report = again.recovery_report
    assert not report.clean
    again.wait_dispatched()
    got = again.get("g", "T", 0, 0, 32)
    assert [m.body for m in got.messages] == [b"m%d" % i for i in range(20) if i != 5]
    assert got.status is GetStatus.FOUND
    assert [q for q, _p, _w in got.corrupt] == [5]


def _meta(store_dir) -> dict:
    import json
    with open(os.path.join(store_dir, "mqstore.json")) as f:
        return json.load(f)


@pytest.mark.parametrize("damage", [bytes(20), b"\x02GARBLED#\x01abcdefghi\x02"])
def test_a_destroyed_crc_property_is_reported(make_store, store_dir, damage):
    """Bytes a record alone cannot tell from a record without the property: the store knows
    every record it wrote since ``record_crc`` was turned on carries it."""
    store = make_store(CRC_ON)
    rs = [store.put(Message("T", b"m%d" % i, keys=["k"], queue_id=0)) for i in range(3)]
    store.wait_dispatched()
    assert _meta(store_dir)["record_crc_since"] == 0
    end = rs[1].phys_offset + rs[1].size
    with open(_segment(store_dir), "r+b") as f:
        f.seek(end - 20)
        f.write(damage)
    why = _reported(store, 1, rs[1].phys_offset)
    assert why and all("record CRC property missing" in w for w in why), why
    store.close()
    reader = make_store(CRC_ON, read_only=True)
    assert _reported(reader, 1, rs[1].phys_offset)
    assert [m.body for m in reader.get("g", "T", 0, 0, 32).messages] == [b"m0", b"m2"]


def test_turning_the_crc_off_and_on_never_fails_a_sound_record(make_store, store_dir):
    plain = make_store()
    a = plain.put(Message("T", b"before", queue_id=0))
    plain.close()
    on = make_store(CRC_ON)
    assert _meta(store_dir)["record_crc_since"] == a.phys_offset + a.size
    on.put(Message("T", b"with", queue_id=0))
    on.close()
    follower = make_store(CRC_ON, read_only=True)  # read while the next writer turns it off
    off = make_store()
    assert "record_crc_since" not in _meta(store_dir)
    off.put(Message("T", b"after", queue_id=0))
    off.wait_dispatched()
    bodies = [b"before", b"with", b"after"]
    assert [m.body for m in off.get("g", "T", 0, 0, 32).messages] == bodies
    def all_three():  # the follower sees the new record once the writer's dispatch publishes it
        got = follower.get("g", "T", 0, 0, 32)
        return got if len(got.messages) == 3 else None
    got = wait_for(all_three)
    assert [m.body for m in got.messages] == bodies and not got.corrupt


def test_recovery_quarantines_a_record_whose_crc_property_was_overwritten(make_store,
                                                                         store_dir):
    store = make_store(CRC_ON)
    rs = [store.put(Message("T", b"m%d" % i, queue_id=0)) for i in range(20)]
    _crashed_after(store, store_dir, rs[2])
    with open(_segment(store_dir), "r+b") as f:
        f.seek(rs[5].phys_offset + rs[5].size - 20)
        f.write(bytes(20))
    again = make_store(CRC_ON)
    report = again.recovery_report
    assert [(q.offset, q.length) for q in report.quarantined] == [
        (rs[5].phys_offset, rs[5].size)]
    again.wait_dispatched()
    got = again.get("g", "T", 0, 0, 32)
    assert [m.body for m in got.messages] == [b"m%d" % i for i in range(20) if i != 5]

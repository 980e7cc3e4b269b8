"""Put path: record bytes, statuses, offsets and rolling, checked against RocketMQ's layout.

Numbers in test names refer to the acceptance behaviours of the reference spec (section 14).
Every expectation reads the files on disk where the spec gives bytes.
"""

from __future__ import annotations

import re
import shutil
import struct
from pathlib import Path

import pytest

import mqstore.store
from mqstore import GetStatus, Message, PutStatus
from mqstore.errors import StoreClosedError
from mqstore.format.properties import decode_properties

BORN = "127.0.0.1:50000"
BORN_TS = 1_700_000_000_000
STORE_TS = 1_700_000_000_123
MAGIC_V1 = 0xDAA320A7
MAGIC_V2 = 0xDAA320AB
BLANK_MAGIC = 0xCBD43194
SEG0 = "00000000000000000000"

# Section 2 test vector: topic T, queue 0, body "hello", TAGS=TagA, born 1700000000000 at
# 127.0.0.1:50000, stored 1700000000123 at 127.0.0.1:10911, physical offset 0.
VECTOR_107 = bytes.fromhex(
    "0000006b daa320a7 3610a686 00000000 00000000 0000000000000000 0000000000000000 00000000"
    "0000018bcfe56800 7f000001 0000c350 0000018bcfe5687b 7f000001 00002a9f 00000000"
    "0000000000000000 00000005 68656c6c6f 01 54 000a 54414753015461674102".replace(" ", "")
)
CQ_UNIT_1 = bytes.fromhex("0000000000000000" "0000006b" "000000000027a807")


def msg(body=b"hello", topic="T", queue_id=0, **kw):
    kw.setdefault("born_timestamp", BORN_TS)
    kw.setdefault("born_host", BORN)
    return Message(topic, body, queue_id=queue_id, **kw)


def cl_file(store, name=SEG0) -> bytes:
    return (Path(store.root) / "commitlog" / name).read_bytes()


def cq_dir(store, topic, qid) -> Path:
    return Path(store.root) / "consumequeue" / topic / str(qid)


def cq_file(store, topic, qid, name=SEG0) -> bytes:
    return (cq_dir(store, topic, qid) / name).read_bytes()


def int_at(buf, pos) -> int:
    return struct.unpack_from(">i", buf, pos)[0]


def uint_at(buf, pos) -> int:
    return struct.unpack_from(">I", buf, pos)[0]


def long_at(buf, pos) -> int:
    return struct.unpack_from(">q", buf, pos)[0]


def cq_units(store, topic, qid, name=SEG0):
    raw = cq_file(store, topic, qid, name)
    return [struct.unpack_from(">qiq", raw, i) for i in range(0, len(raw), 20)]


@pytest.fixture
def store(make_store, manual_clock):
    manual_clock.now = STORE_TS
    return make_store()


# -- record format and put -------------------------------------------------------------------

def test_01_first_put_writes_the_reference_record(store):
    r = store.put(msg(tags="TagA"))
    assert r.status is PutStatus.PUT_OK
    assert (r.queue_id, r.queue_offset, r.phys_offset, r.size) == (0, 0, 0, 107)
    assert r.store_timestamp == STORE_TS
    raw = cl_file(store)
    assert len(raw) == 1 << 20
    assert raw[:107] == VECTOR_107
    assert raw[107:4096] == bytes(4096 - 107)
    assert store.max_phys_offset == 107


def test_02_second_put_and_other_queue_share_the_log(store):
    r1 = store.put(msg(tags="TagA"))
    r2 = store.put(msg(tags="TagA"))
    r3 = store.put(msg(tags="TagA", queue_id=1))
    assert [r.status for r in (r1, r2, r3)] == [PutStatus.PUT_OK] * 3
    assert (r2.queue_id, r2.queue_offset, r2.phys_offset) == (0, 1, 107)
    assert (r3.queue_id, r3.queue_offset, r3.phys_offset) == (1, 0, 214)
    raw = cl_file(store)
    # QUEUEID @12, QUEUEOFFSET @20, PHYSICALOFFSET @28 of each record
    assert (int_at(raw, 107 + 12), long_at(raw, 107 + 20), long_at(raw, 107 + 28)) == (0, 1, 107)
    assert (int_at(raw, 214 + 12), long_at(raw, 214 + 20), long_at(raw, 214 + 28)) == (1, 0, 214)
    # apart from queue id, offsets and the body CRC everything equals the vector
    second = bytearray(raw[107:214])
    second[28:36] = bytes(8)
    second[20:28] = bytes(8)
    assert bytes(second) == VECTOR_107
    store.wait_dispatched()
    assert store.max_offset("T", 0) == 2
    assert store.max_offset("T", 1) == 1


def test_03_msg_ids_encode_store_host_and_offset(store):
    r1 = store.put(msg(tags="TagA"))
    r2 = store.put(msg(tags="TagA"))
    assert r1.msg_id == "7F00000100002A9F0000000000000000"
    assert r2.msg_id == "7F00000100002A9F000000000000006B"
    assert r2.msg_id.endswith("000000000000006B")
    assert store.message_by_id(r2.msg_id).phys_offset == 107


def test_04_ipv6_born_host_sets_sysflag_and_shifts_fields(store):
    r4 = store.put(msg(tags="TagA"))
    r6 = store.put(msg(tags="TagA", born_host="[::1]:50000"))
    assert r6.status is PutStatus.PUT_OK
    assert (r4.size, r6.size) == (107, 119)
    raw = cl_file(store)
    rec = raw[107:107 + 119]
    assert int_at(rec, 0) == 119
    assert int_at(rec, 36) == 0x10
    assert rec[48:64] == bytes(15) + b"\x01"
    assert int_at(rec, 64) == 50000
    assert long_at(rec, 68) == STORE_TS
    assert rec[76:84] == bytes.fromhex("7f000001 00002a9f".replace(" ", ""))
    # with an IPv4 born host the store timestamp sits at 56
    assert long_at(raw, 56) == STORE_TS


def test_04_ipv6_born_host_empty_properties_is_109_bytes(store):
    r = store.put(msg(born_host="[::1]:50000"))
    assert (r.status, r.size) == (PutStatus.PUT_OK, 109)
    expected = bytes.fromhex(
        "0000006d daa320a7 3610a686 00000000 00000000 0000000000000000 0000000000000000 00000010"
        "0000018bcfe56800 00000000000000000000000000000001 0000c350"
        "0000018bcfe5687b 7f000001 00002a9f 00000000 0000000000000000"
        "00000005 68656c6c6f 01 54 0000".replace(" ", "")
    )
    assert cl_file(store)[:109] == expected


def test_05_empty_body_is_stored_and_none_body_is_illegal(store):
    r = store.put(msg(body=b""))
    assert (r.status, r.size) == (PutStatus.PUT_OK, 92)
    raw = cl_file(store)
    assert int_at(raw, 0) == 92
    assert int_at(raw, 8) == 0  # BODYCRC
    assert int_at(raw, 84) == 0  # BODYLENGTH
    assert raw[88:92] == b"\x01T\x00\x00"
    bad = store.put(msg(body=None))
    assert bad.status is PutStatus.MESSAGE_ILLEGAL
    assert store.max_phys_offset == 92
    nxt = store.put(msg())
    assert (nxt.queue_offset, nxt.phys_offset) == (1, 92)


def test_06_body_limit_is_4_mib(make_store, manual_clock):
    manual_clock.now = STORE_TS
    store = make_store({"commit_log": {"segment_bytes": 16 << 20}})
    body = bytes(range(256)) * (4194304 // 256)
    r = store.put(msg(body=body))
    assert r.status is PutStatus.PUT_OK
    assert (r.phys_offset, r.size, r.queue_offset) == (0, 91 + 4194304 + 1, 0)
    raw = cl_file(store)
    assert int_at(raw, 84) == 4194304
    assert raw[88:88 + 4194304] == body
    too_big = store.put(msg(body=body + b"x"))
    assert too_big.status is PutStatus.MESSAGE_ILLEGAL
    assert store.max_phys_offset == r.size
    assert cl_file(store)[r.size:r.size + 4096] == bytes(4096)
    nxt = store.put(msg())
    assert (nxt.queue_offset, nxt.phys_offset) == (1, r.size)


def test_07_properties_over_32767_utf8_bytes_are_refused(store):
    # 2-byte characters: 16386 characters but 32768 bytes once encoded
    value = "\u00e9" * 16382 + "x"
    assert len(("P\x01" + value + "\x02").encode("utf-8")) == 32768
    ok = store.put(msg())
    r = store.put(msg(properties={"P": value}))
    assert r.status is PutStatus.PROPERTIES_SIZE_EXCEEDED
    assert store.max_phys_offset == ok.size
    assert cl_file(store)[ok.size:ok.size + 40000] == bytes(40000)
    nxt = store.put(msg())
    assert (nxt.status, nxt.queue_offset, nxt.phys_offset) == (PutStatus.PUT_OK, 1, ok.size)
    store.wait_dispatched()
    assert store.max_offset("T", 0) == 2


def test_07_properties_of_exactly_32767_bytes_fit(store):
    value = "\u00e9" * 16382
    r = store.put(msg(body=b"", properties={"P": value}))
    assert r.status is PutStatus.PUT_OK
    assert r.size == 91 + 1 + 32767
    raw = cl_file(store)
    assert struct.unpack_from(">h", raw, 90)[0] == 32767
    assert raw[92:92 + 32767].decode("utf-8") == "P\x01" + value + "\x02"


def test_08_topic_length_limits_and_v2_records(store):
    assert store.put(msg(topic="A" * 128)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put(msg(topic="a" * 256)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put(msg(topic="%RETRY%" + "a" * 249)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.max_phys_offset == 0

    v1 = store.put(msg(topic="B" * 127))
    assert (v1.status, v1.size) == (PutStatus.PUT_OK, 91 + 5 + 127)
    raw = cl_file(store)
    assert uint_at(raw, 4) == MAGIC_V1
    assert raw[93] == 127 and raw[94:94 + 127] == b"B" * 127

    retry = "%RETRY%" + "r" * 121
    assert len(retry) == 128
    v2 = store.put(msg(topic=retry))
    assert v2.status is PutStatus.PUT_OK
    assert (v2.phys_offset, v2.size) == (v1.size, 91 + 5 + 128 + 1)
    raw = cl_file(store)
    rec = raw[v2.phys_offset:v2.phys_offset + v2.size]
    assert int_at(rec, 0) == 225
    assert uint_at(rec, 4) == MAGIC_V2
    assert rec[88:93] == b"hello"
    assert struct.unpack_from(">h", rec, 93)[0] == 128
    assert rec[95:95 + 128] == retry.encode()
    assert rec[223:225] == b"\x00\x00"

    longest = "%RETRY%" + "z" * 248
    v255 = store.put(msg(topic=longest))
    assert (v255.status, v255.size) == (PutStatus.PUT_OK, 91 + 5 + 255 + 1)
    store.wait_dispatched()
    got = store.get("g", retry, 0, 0, 32)
    assert got.status is GetStatus.FOUND
    assert [m.topic for m in got.messages] == [retry]


def test_09_slave_role_refuses_puts(make_store):
    store = make_store({"store": {"role": "slave"}})
    r = store.put(msg())
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE
    b = store.put_batch([msg(), msg()])
    assert b.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.max_phys_offset == 0
    assert not (Path(store.root) / "commitlog" / SEG0).exists()


def test_09_disk_full_flag_refuses_puts(store):
    first = store.put(msg())
    store.running_flags |= mqstore.store.DISK_FULL
    r = store.put(msg())
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.put_batch([msg()]).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert store.max_phys_offset == first.size
    store.running_flags &= ~mqstore.store.DISK_FULL
    again = store.put(msg())
    assert (again.status, again.queue_offset, again.phys_offset) == (PutStatus.PUT_OK, 1, first.size)


def test_10_closed_store_refuses_put_and_get_with_one_error(store):
    first = store.put(msg(tags="TagA"))
    store.wait_dispatched()
    store.close()
    for call in (lambda: store.put(msg()), lambda: store.put_batch([msg()]),
                 lambda: store.get("g", "T", 0, 0, 32)):
        with pytest.raises(StoreClosedError, match="is closed"):
            call()
    raw = cl_file(store)
    assert raw[:107] == VECTOR_107
    assert raw[first.size:first.size + 1024] == bytes(1024)


def test_11_message_that_does_not_fit_rolls_after_a_blank_record(make_store, manual_clock):
    manual_clock.now = STORE_TS
    store = make_store({"commit_log": {"segment_bytes": 1024}})
    results = [store.put(msg(body=bytes([i]) * 8)) for i in range(11)]
    assert all(r.status is PutStatus.PUT_OK for r in results)
    assert [r.size for r in results] == [100] * 11
    assert [r.phys_offset for r in results] == [i * 100 for i in range(10)] + [1024]
    assert [r.queue_offset for r in results] == list(range(11))
    seg0 = cl_file(store)
    assert len(seg0) == 1024
    assert seg0[1000:1008] == struct.pack(">iI", 24, BLANK_MAGIC)
    assert seg0[1008:] == bytes(16)
    seg1 = cl_file(store, "00000000000000001024")
    assert len(seg1) == 1024
    assert int_at(seg1, 0) == 100
    assert long_at(seg1, 28) == 1024
    assert long_at(seg1, 20) == 10
    assert seg1[88:96] == bytes([10]) * 8
    assert store.max_phys_offset == 1124


def test_12_exact_fit_with_8_spare_bytes_is_written(make_store, manual_clock):
    manual_clock.now = STORE_TS
    store = make_store({"commit_log": {"segment_bytes": 1024}})
    big = store.put(msg(body=b"\xab" * 924))
    assert (big.status, big.phys_offset, big.size) == (PutStatus.PUT_OK, 0, 1016)
    assert not (Path(store.root) / "commitlog" / "00000000000000001024").exists()
    nxt = store.put(msg())
    assert (nxt.status, nxt.phys_offset, nxt.queue_offset) == (PutStatus.PUT_OK, 1024, 1)
    seg0 = cl_file(store)
    assert int_at(seg0, 0) == 1016
    assert seg0[1016:1024] == struct.pack(">iI", 8, BLANK_MAGIC)
    assert long_at(cl_file(store, "00000000000000001024"), 28) == 1024


def test_13_batch_takes_consecutive_offsets_and_one_store_time(store, manual_clock):
    singles = [store.put(msg(body=b"s%d" % i)) for i in range(5)]
    assert [r.queue_offset for r in singles] == [0, 1, 2, 3, 4]
    base = store.max_phys_offset
    manual_clock.advance(7)
    batch = store.put_batch([msg(body=b"b%d" % i) for i in range(3)])
    assert batch.status is PutStatus.PUT_OK
    assert len(batch) == 3
    assert batch.queue_offsets.tolist() == [5, 6, 7]
    assert batch.sizes.tolist() == [94, 94, 94]
    assert batch.phys_offsets.tolist() == [base, base + 94, base + 188]
    assert batch.wrote_bytes == 282
    assert batch.store_timestamp == STORE_TS + 7
    assert batch.msg_id == ",".join(
        "7F00000100002A9F%016X" % p for p in (base, base + 94, base + 188))
    assert len(batch.msg_id.split(",")) == 3
    raw = cl_file(store)
    for i, p in enumerate(batch.phys_offsets.tolist()):
        assert long_at(raw, p + 20) == 5 + i
        assert long_at(raw, p + 28) == p
        assert long_at(raw, p + 56) == STORE_TS + 7
        assert raw[p + 88:p + 90] == b"b%d" % i
    after = store.put(msg())
    assert (after.queue_offset, after.phys_offset) == (8, base + 282)
    store.wait_dispatched()
    units = cq_units(store, "T", 0)[:9]
    assert [u[0] for u in units[5:8]] == batch.phys_offsets.tolist()


@pytest.mark.parametrize("bad", [
    {"properties": {"DELAY": "2"}},
    {"sysflag": 0x4},
    {"sysflag": 0x8},
    {"sysflag": 0xC},
])
def test_14_batch_with_delay_or_transaction_is_illegal(store, bad):
    first = store.put(msg())
    result = store.put_batch([msg(), msg(**bad), msg()])
    assert result.status is PutStatus.MESSAGE_ILLEGAL
    assert result.error_index == 1
    assert len(result) == 0
    assert store.max_phys_offset == first.size
    nxt = store.put(msg())
    assert (nxt.queue_offset, nxt.phys_offset) == (1, first.size)


def test_15_batch_that_does_not_fit_rolls_whole(make_store, manual_clock):
    manual_clock.now = STORE_TS
    store = make_store({"commit_log": {"segment_bytes": 1024}})
    for i in range(8):
        assert store.put(msg(body=bytes(8))).phys_offset == i * 100
    batch = store.put_batch([msg(body=bytes([i]) * 8) for i in range(3)])
    assert batch.status is PutStatus.PUT_OK
    assert batch.phys_offsets.tolist() == [1024, 1124, 1224]
    assert batch.queue_offsets.tolist() == [8, 9, 10]
    seg0 = cl_file(store)
    assert seg0[800:808] == struct.pack(">iI", 224, BLANK_MAGIC)
    assert seg0[808:] == bytes(216)
    seg1 = cl_file(store, "00000000000000001024")
    for i in range(3):
        assert int_at(seg1, i * 100) == 100
        assert long_at(seg1, i * 100 + 28) == 1024 + i * 100
        assert seg1[i * 100 + 88:i * 100 + 96] == bytes([i]) * 8


def test_16_prepared_and_rollback_records_are_not_queued(store):
    a = store.put(msg(body=b"a"))
    b = store.put(msg(body=b"b"))
    prep = store.put(msg(body=b"p", sysflag=0x4, keys="k1"))
    rollback = store.put(msg(body=b"r", sysflag=0xC, keys="k2"))
    commit = store.put(msg(body=b"c", sysflag=0x8))
    after = store.put(msg(body=b"n"))
    assert [r.status for r in (prep, rollback, commit, after)] == [PutStatus.PUT_OK] * 4
    assert prep.queue_offset == 0 and rollback.queue_offset == 0
    assert (commit.queue_offset, after.queue_offset) == (2, 3)
    raw = cl_file(store)
    assert long_at(raw, prep.phys_offset + 20) == 0
    assert int_at(raw, prep.phys_offset + 36) == 0x4
    assert long_at(raw, rollback.phys_offset + 20) == 0
    assert int_at(raw, rollback.phys_offset + 36) == 0xC
    assert long_at(raw, commit.phys_offset + 20) == 2
    store.wait_dispatched()
    assert store.max_offset("T", 0) == 4
    units = cq_units(store, "T", 0)
    assert [u[0] for u in units[:4]] == [a.phys_offset, b.phys_offset, commit.phys_offset,
                                         after.phys_offset]
    assert units[4] == (0, 0, 0)
    stored = store.message_at(prep.phys_offset)
    assert stored.keys == ["k1"]
    got = store.get("g", "T", 0, 0, 32)
    assert [m.body for m in got.messages] == [b"a", b"b", b"c", b"n"]


# -- properties and tags ---------------------------------------------------------------------

def test_17_properties_decoding_drops_malformed_segments():
    assert decode_properties("A\x01B\x02C\x01\x02\x01D\x02E\x01F") == {"A": "B", "E": "F"}
    assert decode_properties("K\x01a\x01b\x02") == {"K": "a\x01b"}


def test_17_stored_properties_decode_back(store):
    r = store.put(msg(tags="TagA", keys=["k1", "k2"], properties={"X": "1"}))
    m = store.message_at(r.phys_offset)
    assert m.properties == {"TAGS": "TagA", "KEYS": "k1 k2", "X": "1"}
    assert m.tags == "TagA" and m.keys == ["k1", "k2"]


def test_18_consume_queue_units_hold_offset_size_and_tag_hash(store):
    r1 = store.put(msg(tags="TagA"))
    r2 = store.put(msg())
    r3 = store.put(msg(tags="polygenelubricants"))
    store.wait_dispatched()
    raw = cq_file(store, "T", 0)
    assert raw[:20] == CQ_UNIT_1
    assert raw[20:40] == struct.pack(">qi", r2.phys_offset, r2.size) + bytes(8)
    assert raw[40:60] == struct.pack(">qi", r3.phys_offset, r3.size) + bytes.fromhex("ffffffff80000000")
    assert raw[60:80] == bytes(20)
    assert r1.phys_offset == 0


def test_19_delay_topic_tags_code_is_delivery_time(store, manual_clock):
    s = manual_clock.now
    r3 = store.put(msg(topic="SCHEDULE_TOPIC_XXXX", queue_id=2, tags="TagA",
                       properties={"DELAY": "3"}))
    manual_clock.advance(5)
    r99 = store.put(msg(topic="SCHEDULE_TOPIC_XXXX", queue_id=2, properties={"DELAY": "99"}))
    assert (r3.store_timestamp, r99.store_timestamp) == (s, s + 5)
    store.wait_dispatched()
    units = cq_units(store, "SCHEDULE_TOPIC_XXXX", 2)
    assert units[0] == (r3.phys_offset, r3.size, s + 10_000)
    assert units[1] == (r99.phys_offset, r99.size, s + 5 + 7_200_000)


# -- consume queue ---------------------------------------------------------------------------

def test_20_consume_queue_rolls_at_file_units(make_store, manual_clock):
    manual_clock.now = STORE_TS
    store = make_store({"consume_queue": {"file_units": 10}})
    results = [store.put(msg(tags="TagA")) for _ in range(15)]
    assert [r.queue_offset for r in results] == list(range(15))
    store.wait_dispatched()
    files = sorted(p.name for p in cq_dir(store, "T", 0).iterdir())
    assert files == [SEG0, "00000000000000000200"]
    first = cq_file(store, "T", 0)
    second = cq_file(store, "T", 0, "00000000000000000200")
    assert len(first) == 200 and len(second) == 200
    for i in range(10):
        assert first[i * 20:i * 20 + 20] == struct.pack(">qiq", i * 107, 107, 2598919)
    for i in range(5):
        assert second[i * 20:i * 20 + 20] == struct.pack(">qiq", (10 + i) * 107, 107, 2598919)
    assert second[100:] == bytes(100)
    assert store.max_offset("T", 0) == 15
    assert store.min_offset("T", 0) == 0


def test_21_unknown_queue_offsets_are_zero(store):
    assert store.max_offset("nope", 0) == 0
    assert store.min_offset("nope", 0) == 0
    assert not (Path(store.root) / "consumequeue" / "nope").exists()


def test_22_restart_after_crash_keeps_queue_offsets_contiguous(make_store, manual_clock,
                                                               tmp_path):
    manual_clock.now = STORE_TS
    store = make_store()
    first = [store.put(msg(body=b"m%d" % i)) for i in range(3)]
    store.wait_dispatched()
    # a crash snapshot: copy the directory while the store is still open (abort file present)
    crashed = tmp_path / "crashed"
    shutil.copytree(store.root, crashed)
    assert (crashed / "abort").exists()
    # the consume queue lags the commit log: its last unit never reached the file
    cq0 = crashed / "consumequeue" / "T" / "0" / SEG0
    data = bytearray(cq0.read_bytes())
    data[40:60] = bytes(20)
    cq0.write_bytes(bytes(data))

    manual_clock.advance(1000)
    again = make_store(root=crashed)
    assert again.recovery_report.abnormal is True
    assert again.max_phys_offset == first[-1].phys_offset + first[-1].size
    assert again.max_offset("T", 0) == 3
    nxt = again.put(msg(body=b"m3"))
    assert nxt.status is PutStatus.PUT_OK
    assert (nxt.queue_offset, nxt.phys_offset) == (3, again.max_phys_offset - nxt.size)
    assert nxt.phys_offset == first[-1].phys_offset + first[-1].size
    again.wait_dispatched()
    assert again.max_offset("T", 0) == 4
    units = cq_units(again, "T", 0)[:5]
    assert [u[0] for u in units[:4]] == [r.phys_offset for r in first] + [nxt.phys_offset]
    assert units[4] == (0, 0, 0)
    got = again.get("g", "T", 0, 0, 32)
    assert [m.queue_offset for m in got.messages] == [0, 1, 2, 3]
    assert [m.body for m in got.messages] == [b"m0", b"m1", b"m2", b"m3"]


# -- argument checks and refusals that write nothing -----------------------------------------

@pytest.mark.parametrize("kwargs, named", [
    ({"topic": "a/b"}, "'a/b'"),
    ({"topic": "../x"}, "'../x'"),
    ({"topic": ""}, "''"),
    ({"queue_id": -1}, "-1"),
    ({"body": "hello"}, "str"),
    ({"properties": {"P": "x\x01y"}}, "'x\\x01y'"),
    ({"keys": ["ok", "a b"]}, "'a b'"),
])
def test_bad_arguments_raise_value_error_and_write_nothing(store, kwargs, named):
    first = store.put(msg())
    before = cl_file(store)
    with pytest.raises(ValueError) as info:
        store.put(msg(**kwargs))
    assert named in str(info.value)
    if "body" in kwargs:
        assert "body" in str(info.value)
    assert store.max_phys_offset == first.size
    assert cl_file(store) == before
    assert sorted(p.name for p in (Path(store.root) / "commitlog").iterdir()) == [SEG0]
    nxt = store.put(msg())
    assert (nxt.queue_offset, nxt.phys_offset) == (1, first.size)
    store.wait_dispatched()
    assert sorted(p.name for p in (Path(store.root) / "consumequeue").iterdir()) == ["T"]
    assert sorted(p.name for p in (Path(store.root) / "consumequeue" / "T").iterdir()) == ["0"]
    assert not (Path(store.root) / "x").exists()
    assert not (Path(store.root).parent / "x").exists()


@pytest.mark.parametrize("bad, status", [
    ({"body": None}, PutStatus.MESSAGE_ILLEGAL),
    ({"topic": "T" * 128}, PutStatus.MESSAGE_ILLEGAL),
    ({"properties": {"P": "v" * 32765}}, PutStatus.PROPERTIES_SIZE_EXCEEDED),
])
def test_rejected_message_writes_nothing_and_keeps_queue_offset(store, bad, status):
    first = store.put(msg())
    r = store.put(msg(**bad))
    assert r.status is status
    assert r.queue_offset == -1 and r.phys_offset == -1
    assert store.max_phys_offset == first.size
    assert cl_file(store)[first.size:first.size + 40000] == bytes(40000)
    nxt = store.put(msg())
    assert (nxt.status, nxt.queue_offset, nxt.phys_offset) == (PutStatus.PUT_OK, 1, first.size)
    store.wait_dispatched()
    assert store.max_offset("T", 0) == 2
    assert sorted(p.name for p in (Path(store.root) / "consumequeue").iterdir()) == ["T"]


def test_batch_across_topics_and_queues_gives_each_queue_consecutive_offsets(store):
    store.put(msg(body=b"pre"))
    plan = [("T", 0), ("T", 1), ("U", 0), ("T", 0), ("U", 0), ("T", 1), ("T", 0)]
    batch = store.put_batch([msg(topic=t, queue_id=q, body=b"%s%d-%d" % (t.encode(), q, i))
                             for i, (t, q) in enumerate(plan)])
    assert batch.status is PutStatus.PUT_OK
    assert batch.queue_ids.tolist() == [0, 1, 0, 0, 0, 1, 0]
    assert batch.queue_offsets.tolist() == [1, 0, 0, 2, 1, 1, 3]
    sizes = batch.sizes.tolist()
    phys = batch.phys_offsets.tolist()
    assert phys[0] == 95
    assert all(phys[i + 1] == phys[i] + sizes[i] for i in range(len(plan) - 1))
    raw = cl_file(store)
    for i, (t, q) in enumerate(plan):
        p = phys[i]
        assert int_at(raw, p + 12) == q
        assert long_at(raw, p + 20) == batch.queue_offsets[i]
    store.wait_dispatched()
    assert (store.max_offset("T", 0), store.max_offset("T", 1), store.max_offset("U", 0)) == (4, 2, 2)
    assert [u[0] for u in cq_units(store, "U", 0)[:2]] == [phys[2], phys[4]]
    assert [u[0] for u in cq_units(store, "T", 1)[:2]] == [phys[1], phys[5]]
    nxt = store.put(msg(topic="U", queue_id=0))
    assert nxt.queue_offset == 2


@pytest.mark.parametrize("bad, status", [
    ({"body": None}, PutStatus.MESSAGE_ILLEGAL),
    ({"properties": {"P": "v" * 32765}}, PutStatus.PROPERTIES_SIZE_EXCEEDED),
    ({"topic": "%RETRY%" + "a" * 249}, PutStatus.MESSAGE_ILLEGAL),
])
def test_batch_with_one_bad_message_is_rejected_whole(store, bad, status):
    first = store.put(msg())
    msgs = [msg(body=b"ok0"), msg(body=b"ok1", queue_id=1), msg(**bad), msg(body=b"ok3")]
    result = store.put_batch(msgs)
    assert result.status is status
    assert result.error_index == 2
    assert len(result) == 0 and result.msg_id == ""
    assert store.max_phys_offset == first.size
    assert cl_file(store)[first.size:first.size + 40000] == bytes(40000)
    ok = store.put_batch([msg(), msg(queue_id=1)])
    assert ok.queue_offsets.tolist() == [1, 0]
    assert ok.phys_offsets.tolist() == [first.size, 2 * first.size]


def test_batch_with_bad_argument_raises_and_writes_nothing(store):
    first = store.put(msg())
    with pytest.raises(ValueError, match=re.escape("'a/b'")):
        store.put_batch([msg(), msg(topic="a/b")])
    assert store.max_phys_offset == first.size
    assert store.put(msg()).queue_offset == 1


def test_read_only_store_refuses_puts(make_store, store_dir, manual_clock):
    manual_clock.now = STORE_TS
    writer = make_store()
    writer.put(msg(tags="TagA"))
    writer.close()
    before = cl_file(writer)
    ro = make_store(root=store_dir, read_only=True)
    r = ro.put(msg())
    assert r.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert ro.put_batch([msg()]).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert ro.max_phys_offset == 107
    assert (store_dir / "commitlog" / SEG0).read_bytes() == before
    assert before[:107] == VECTOR_107
    got = ro.get("g", "T", 0, 0, 32)
    assert got.status is GetStatus.FOUND
    assert [m.body for m in got.messages] == [b"hello"]

"""Decoders of on-disk bytes under fuzzing: random bytes, and valid encodings with bytes
changed or cut. Each decoder returns a value or raises ValueError (CorruptRecordError for bad
bytes), never struct.error, IndexError or zlib.error; scan_record never raises at all; valid
input still decodes exactly; ``heads`` accepts exactly the records ``unpack_record`` accepts."""

from __future__ import annotations

import os
import struct
import tempfile
import zlib
from types import SimpleNamespace
from typing import NamedTuple

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.errors import CorruptRecordError
from mqstore.format import index_layout as L
from mqstore.format.hosts import Host
from mqstore.format.record import (
    SCAN_BAD, SCAN_BLANK, SCAN_OK, SYSFLAG_BORNHOST_V6, SYSFLAG_COMPRESSED,
    SYSFLAG_STOREHOST_V6, decode_record, decompress_body, encode_blank, encode_record,
    scan_record, unpack_record,
)
from mqstore.dispatch.loop import heads_alike
from mqstore.format.record_columns import MIN_RECORD_BYTES, heads, walk
from mqstore.format.verify import check_queue_identity, verify_queue_record, verify_record
from mqstore.message import StoredMessage
from mqstore.read import plain_pull
from mqstore.read.served_rows import Rows
from mqstore.read.fields import record_fields as strings_of_rows
from mqstore.storage.index_file import IndexFile

FUZZ = settings(max_examples=250, deadline=None)
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
HOSTS = st.sampled_from([Host(bytes([127, 0, 0, 1]), 10911), Host(bytes([10, 1, 2, 3]), -1),
                         Host(bytes(15) + b"\x01", 50000), Host(bytes(range(16)), 7)])
LONG_MAX = (1 << 63) - 1


def only_value_errors(fn, *args, **kwargs):
    """``fn(*args)``, or None when it raised a ValueError with a message; anything else fails."""
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:
        assert str(exc), f"{type(exc).__name__} without a message"
        return None


record_fields = st.fixed_dictionaries({
    "queue_id": INT32, "flag": INT32, "queue_offset": INT64, "phys_offset": INT64,
    "sysflag": st.integers(0, 0xFFF), "born_timestamp": INT64, "born_host": HOSTS,
    "store_timestamp": INT64, "store_host": HOSTS, "reconsume_times": INT32,
    "prepared_tx_offset": INT64, "body": st.binary(max_size=200),
    "topic": st.text(min_size=1, max_size=30).map(str.encode).filter(lambda t: len(t) <= 127),
    "properties": st.binary(max_size=120), "v2": st.booleans(),
})


@st.composite
def damaged(draw, raw: bytes) -> bytes:
    """``raw`` with a few bytes replaced, then perhaps cut short."""
    buf = bytearray(raw)
    for _ in range(draw(st.integers(0, 4))):
        buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
    if draw(st.booleans()):
        del buf[draw(st.integers(0, len(buf))):]
    return bytes(buf)


# -- records -------------------------------------------------------------------------------

@FUZZ
@given(fields=record_fields)
def test_valid_records_decode_exactly(fields):
    rec = encode_record(**fields)
    d = decode_record(rec)
    host_bits = (SYSFLAG_BORNHOST_V6 if fields["born_host"].is_v6 else 0) | (
        SYSFLAG_STOREHOST_V6 if fields["store_host"].is_v6 else 0)
    assert d.size == len(rec)
    assert d.sysflag == (fields["sysflag"] & ~0x30) | host_bits
    assert (d.body, d.topic.encode(), d.properties_text) == (
        fields["body"], fields["topic"], fields["properties"].decode("utf-8", errors="replace"))
    for name in ("queue_id", "flag", "queue_offset", "phys_offset", "born_timestamp",
                 "born_host", "store_timestamp", "store_host", "reconsume_times",
                 "prepared_tx_offset"):
        assert getattr(d, name) == fields[name], name
    kind, size, head = scan_record(rec, 0, len(rec), True, expected_phys=fields["phys_offset"])
    assert (kind, size) == (SCAN_OK, len(rec))
    assert (head.topic.encode(), head.properties) == (fields["topic"], fields["properties"])


@FUZZ
@given(data=st.data(), fields=record_fields)
def test_damaged_records_raise_only_value_errors(data, fields):
    rec = data.draw(damaged(encode_record(**fields)))
    only_value_errors(unpack_record, rec)
    only_value_errors(decode_record, rec)
    pos = data.draw(st.integers(-10, len(rec) + 10))
    limit = data.draw(st.one_of(st.none(), st.integers(-10, len(rec) + 10)))
    only_value_errors(unpack_record, rec, pos, limit)


@FUZZ
@given(raw=st.binary(max_size=400), pos=st.integers(-5, 405))
def test_random_bytes_raise_only_value_errors(raw, pos):
    only_value_errors(unpack_record, raw)
    only_value_errors(decode_record, raw, pos)
    only_value_errors(unpack_record, raw, pos, len(raw))


def test_decode_errors_name_the_problem_and_the_offset():
    rec = encode_record(**{**example_fields(), "topic": b"T"})
    bad_topic = rec.replace(b"\x01T", b"\x01\xff")
    with pytest.raises(CorruptRecordError, match=r"record at 5: topic b'\\xff' at 99 is not "
                                                 r"UTF-8 \(invalid start byte at byte 0\)"):
        decode_record(bytes(5) + bad_topic, 5)
    with pytest.raises(CorruptRecordError, match=r"record at 0: only 50 bytes readable"):
        unpack_record(rec[:50])
    with pytest.raises(ValueError, match="record position -1 is outside"):
        unpack_record(rec, -1)


def example_fields() -> dict:
    return dict(queue_id=0, flag=0, queue_offset=0, phys_offset=0, sysflag=0,
                born_timestamp=1, born_host=Host(bytes(4), 1), store_timestamp=2,
                store_host=Host(bytes(4), 2), reconsume_times=0, prepared_tx_offset=0,
                body=b"hello", topic=b"T", properties=b"")


# -- scan_record never raises ----------------------------------------------------------------

@FUZZ
@given(data=st.data(), fields=record_fields, check_crc=st.booleans())
def test_scan_record_never_raises_on_damaged_records(data, fields, check_crc):
    rec = encode_record(**fields)
    buf = data.draw(damaged(rec + encode_blank(8)))
    pos = data.draw(st.integers(-3, len(buf) + 3))
    limit = data.draw(st.integers(-3, len(buf) + 50))
    expected = data.draw(st.one_of(st.none(), st.just(fields["phys_offset"])))
    kind, size, head = scan_record(buf, pos, limit, check_crc, expected_phys=expected)
    assert kind in (SCAN_OK, SCAN_BLANK, SCAN_BAD)
    if kind == SCAN_BAD:
        assert isinstance(size, str) and size and head is None


@FUZZ
@given(raw=st.binary(max_size=400), pos=st.integers(-5, 405), check_crc=st.booleans())
def test_scan_record_never_raises_on_random_bytes(raw, pos, check_crc):
    kind, _size, _head = scan_record(raw, pos, len(raw), check_crc)
    assert kind in (SCAN_OK, SCAN_BLANK, SCAN_BAD)


# -- column-wise heads -----------------------------------------------------------------------

def first_rejected(buf: bytes, positions: list[int]) -> int:
    for i, pos in enumerate(positions):
        try:
            unpack_record(buf, pos)
        except ValueError:
            return i
    return len(positions)


@FUZZ
@given(data=st.data(), records=st.lists(record_fields, min_size=1, max_size=5),
       lead=st.integers(0, 16))
def test_heads_agrees_with_unpack_record_on_damaged_runs(data, records, lead):
    valid = bytes(lead) + b"".join(encode_record(**f) for f in records)
    buf = data.draw(damaged(valid))
    positions, _end = walk(buf, lead, len(buf), len(buf))
    u8 = np.frombuffer(buf, dtype=np.uint8)
    cols, n = heads(u8, np.array(positions, dtype=np.int64))
    assert n == first_rejected(buf, positions)
    assert all(len(v) == n for v in cols.values())
    if buf == valid:
        assert n == len(records)
        for i, f in enumerate(records):
            assert int(cols["queue_offset"][i]) == f["queue_offset"]
            at, ln = int(cols["topic_at"][i]), int(cols["topic_len"][i])
            assert buf[at:at + ln] == f["topic"]
            at, ln = int(cols["props_at"][i]), int(cols["props_len"][i])
            assert buf[at:at + ln] == f["properties"]


@FUZZ
@given(raw=st.binary(min_size=MIN_RECORD_BYTES, max_size=600), data=st.data())
def test_heads_on_random_bytes_and_positions(raw, data):
    u8 = np.frombuffer(raw, dtype=np.uint8)
    positions = data.draw(st.lists(st.integers(0, len(raw) - MIN_RECORD_BYTES), max_size=6))
    cols, n = heads(u8, np.array(positions, dtype=np.int64))
    assert 0 <= n <= len(positions) and len(cols["size"]) == n
    outside = data.draw(st.sampled_from([-1, len(raw) - MIN_RECORD_BYTES + 1, 1 << 40]))
    with pytest.raises(ValueError, match=f"record position {outside} "):
        heads(u8, np.array(positions + [outside], dtype=np.int64))
    begin = data.draw(st.integers(0, len(raw) + 8))
    only_value_errors(walk, raw, begin, data.draw(st.integers(0, len(raw) + 100)), len(raw))


# -- compressed bodies -----------------------------------------------------------------------

@FUZZ
@given(body=st.binary(max_size=300), data=st.data(), zlib_kind=st.sampled_from([0, 0x300]))
def test_decompress_body_round_trips_and_rejects_damage_as_value_errors(body, data, zlib_kind):
    flag = SYSFLAG_COMPRESSED | zlib_kind
    packed = zlib.compress(body)
    assert decompress_body(packed, flag) == body
    assert decompress_body(body, zlib_kind) == body  # not compressed: as stored
    out = only_value_errors(decompress_body, data.draw(damaged(packed)), flag, offset=77)
    assert out is None or isinstance(out, bytes)
    only_value_errors(decompress_body, data.draw(st.binary(max_size=100)), flag)


def test_decompress_errors_name_the_record():
    with pytest.raises(CorruptRecordError, match=r"record at 4096: compressed body of 3 bytes "
                                                 r"\(sysflag 0x1\) is not a zlib stream"):
        decompress_body(b"abc", SYSFLAG_COMPRESSED, offset=4096)


# -- index files -----------------------------------------------------------------------------

def load_index(directory: str, raw: bytes, slots: int) -> IndexFile:
    path = os.path.join(directory, "i")
    with open(path, "wb") as fh:
        fh.write(raw)
    return IndexFile.load(path, slots=slots, read_only=True)


def select_bounded(f: IndexFile, key_hash: int, max_num: int, begin: int, end: int):
    got = only_value_errors(f.select, key_hash, max_num, begin, end)
    assert got is None or (isinstance(got, list) and len(got) <= min(max_num, f.entries))
    return got


QUERY = st.tuples(st.integers(0, 40), st.integers(0, 1 << 31), st.integers(-10, LONG_MAX),
                  st.integers(-10, LONG_MAX))


@FUZZ
@given(slots=st.integers(1, 6), entries=st.integers(1, 24), data=st.data(),
       queries=st.lists(QUERY, min_size=1, max_size=4))
def test_index_select_on_random_files(slots, entries, data, queries):
    raw = data.draw(st.binary(min_size=L.file_size(slots, entries),
                              max_size=L.file_size(slots, entries)))
    with tempfile.TemporaryDirectory() as d:
        f = load_index(d, raw, slots)
        try:
            for query in queries:
                select_bounded(f, *query)
            assert isinstance(f.verify(), (str, type(None)))
        finally:
            f.close()


@FUZZ
@given(slots=st.integers(1, 4), hashes=st.lists(st.integers(0, 12), min_size=1, max_size=20),
       data=st.data(), queries=st.lists(QUERY, min_size=1, max_size=4))
def test_index_select_on_damaged_valid_files(slots, hashes, data, queries):
    entries = len(hashes) + 1
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "i")
        w = IndexFile.create(path, slots, entries)
        for n, h in enumerate(hashes):
            assert w.put_key(h, 100 * n, 1_000_000 + 1000 * n)
        want = {h: w.select(h, 1 << 31, 0, LONG_MAX) for h in set(hashes)}
        w.close()
        with open(path, "rb") as fh:
            valid = fh.read()
        f = load_index(d, valid, slots)
        try:  # an intact file answers as it did when written
            assert {h: f.select(h, 1 << 31, 0, LONG_MAX) for h in want} == want
            assert all(len(v) == hashes.count(h) for h, v in want.items())
        finally:
            f.close()
        buf = bytearray(valid)
        for _ in range(data.draw(st.integers(1, 6))):  # the size must stay: flips only
            buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
        f = load_index(d, bytes(buf), slots)
        try:
            for query in queries:
                select_bounded(f, *query)
        finally:
            f.close()


@FUZZ
@given(raw=st.binary(max_size=120), offset=st.integers(-5, 100), size=st.integers(-5, 10_000))
def test_index_header_and_sizes_raise_only_value_errors(raw, offset, size):
    only_value_errors(L.unpack_header, raw, offset)
    got = only_value_errors(L.counts_for_size, size)
    assert got is None or L.file_size(*got) == size


# -- host-family bits against record sizes ---------------------------------------------------
# Sysflag bits 0x10 and 0x20 (IPv6 born / store host) each widen a record's header by 12 bytes.
# Damage to them makes a small record's header promise more bytes than the record holds (a
# 97-byte record has no room for the 103-byte header of an IPv6 host), or a large one's fields
# read 12 bytes off. Every decoder of commit-log records takes that for damage, whatever the
# record's size: a ValueError naming it (``only_value_errors``), never struct.error or
# IndexError, and the fast paths agree with the exact ones on what is a record.

HOST_FAMILIES = [(False, False), (True, False), (False, True), (True, True)]
HOST_BITS = (SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6)
V4_HOST, V6_HOST = Host(bytes([10, 1, 2, 3]), 10911), Host(bytes(15) + b"\x01", 50000)
PHYS, QUEUE_ID, QUEUE_OFFSET = 4096, 3, 7

small_records = st.fixed_dictionaries({
    "families": st.sampled_from(HOST_FAMILIES),
    "body": st.binary(max_size=40),  # records of 91 bytes (no body, empty topic) to ~190
    "topic": st.sampled_from([b"", b"T", b"Topic-1"]),
    "properties": st.sampled_from([b"", b"TAGS\x01a\x02KEYS\x01k1 k2\x02"]),
    "v2": st.booleans(),
})
# Stored sysflags: every combination of the host bits with other bits set or not, and any int.
SYSFLAGS = st.one_of(st.integers(0, 0xFFF), INT32)


def small_record(families=(False, False), body=b"", topic=b"T", properties=b"", v2=False,
                 sysflag=0) -> bytes:
    born_v6, store_v6 = families
    return encode_record(
        queue_id=QUEUE_ID, flag=0, queue_offset=QUEUE_OFFSET, phys_offset=PHYS, sysflag=sysflag,
        born_timestamp=1, born_host=V6_HOST if born_v6 else V4_HOST, store_timestamp=2,
        store_host=V6_HOST if store_v6 else V4_HOST, reconsume_times=0, prepared_tx_offset=0,
        body=body, topic=topic, properties=properties, v2=v2)


def with_sysflag(rec: bytes, sysflag: int) -> bytes:
    return rec[:36] + struct.pack(">i", sysflag) + rec[40:]


def exact_queue_check(raw: bytes, topic: bytes):
    """``verify_record`` then ``check_queue_identity``: the checks the fast path must match."""
    lay = verify_record(raw, PHYS, len(raw))
    check_queue_identity(raw, lay, topic, QUEUE_ID, QUEUE_OFFSET, PHYS)
    return lay


def decoded_everywhere(raw: bytes, topic: bytes):
    """Every decoder of commit-log records over ``raw`` (one record, maybe damaged, laid at
    PHYS for queue QUEUE_ID offset QUEUE_OFFSET of ``topic``). Each answers or raises a
    ValueError naming the problem, and they agree; returns ``unpack_record``'s layout or None."""
    lay = only_value_errors(unpack_record, raw)
    only_value_errors(decode_record, raw)
    kind, size, head = scan_record(raw, 0, len(raw) + 8, True, expected_phys=PHYS)
    assert kind != SCAN_OK or (lay is not None and (size, head.sysflag) == (
        len(raw), lay.fields[7]))
    assert kind != SCAN_BAD or (isinstance(size, str) and size)
    # The pull's per-message path agrees with the exact checks, reasons and all.
    fast = exact = None
    try:
        fast = verify_queue_record(raw, PHYS, len(raw), topic, QUEUE_ID, QUEUE_OFFSET)
    except CorruptRecordError as exc:
        fast = str(exc)
    try:
        exact = exact_queue_check(raw, topic)
    except CorruptRecordError as exc:
        exact = str(exc)
    assert fast == exact
    # A plain get's inlined checks (for records its units say are big enough) take a record
    # only when these take it, as they take it.
    if len(raw) >= plain_pull.MIN_RECORD:
        plain = plain_pull._intact(raw, PHYS, len(raw), QUEUE_OFFSET,
                                   plain_pull._topic_field(topic.decode()), QUEUE_ID, (0, 0))
        assert plain is None or (not isinstance(fast, str) and plain == fast)
    u8 = np.frombuffer(raw, dtype=np.uint8)
    if len(raw) >= MIN_RECORD_BYTES:
        # Dispatch's column-wise decoders accept exactly what unpack_record accepts.
        cols, n = heads(u8, np.zeros(1, dtype=np.int64))
        assert n == (lay is not None)
        alike = heads_alike(raw, u8, np.zeros(1, dtype=np.int64))
        assert alike is None or (alike[1] == n and all(
            (alike[0][k] == v).all() for k, v in cols.items()))
        if n:
            assert int(cols["sysflag"][0]) == lay.fields[7]
        # A pull's column-wise check serves only what the per-message path serves.
        rows = Rows(PHYS, u8, np.array([PHYS]), np.array([len(raw)]), np.array([QUEUE_OFFSET]),
                    np.zeros(1, dtype=np.int64), len(topic))
        assert not rows.check(np.zeros(1, dtype=np.int64), topic, QUEUE_ID, True) or (
            not isinstance(fast, str))
    return lay


@FUZZ
@given(rec=small_records, sysflag=SYSFLAGS, data=st.data())
def test_any_sysflag_on_a_record_of_any_size(rec, sysflag, data):
    valid = small_record(**rec)
    raw = with_sysflag(valid, sysflag)
    if data.draw(st.booleans()):
        raw = data.draw(damaged(raw))
    lay = decoded_everywhere(raw, rec["topic"])
    stored_bits = sysflag & (SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)
    if raw == with_sysflag(valid, sysflag) and stored_bits == sum(
            bit for bit, v6 in zip(HOST_BITS, rec["families"]) if v6):
        assert lay is not None and lay.fields[7] == sysflag  # the layout it says: intact


@FUZZ
@given(rec=small_records)
def test_a_plain_get_checks_intact_v1_records_itself(rec):
    """Its inlined checks take every intact V1 record as verify_queue_record does, and leave
    V2 records, and records the record CRC must cover but does not, to it."""
    raw = small_record(**rec)
    key = plain_pull._topic_field(rec["topic"].decode())
    got = plain_pull._intact(raw, PHYS, len(raw), QUEUE_OFFSET, key, QUEUE_ID, (0, 0))
    if rec["v2"]:
        assert got is None
    else:
        assert got == verify_queue_record(raw, PHYS, len(raw), rec["topic"], QUEUE_ID,
                                          QUEUE_OFFSET)
    assert plain_pull._intact(raw, PHYS, len(raw), QUEUE_OFFSET, key, QUEUE_ID,
                              (0, 1 << 62)) is None


def width(host_bits: int) -> int:
    """Header bytes of a record whose sysflag holds ``host_bits``."""
    return 88 + 12 * bin(host_bits & 0x30).count("1")


def test_every_host_family_claim_on_every_small_record_size():
    # Exhaustive over the four layouts a record may have, the four its sysflag may claim,
    # and every record size from 91 bytes to past the widest header (115 + body).
    for families in HOST_FAMILIES:
        actual = sum(bit for bit, v6 in zip(HOST_BITS, families) if v6)
        for body_len in range(0, 33):
            for topic in (b"", b"T"):
                valid = small_record(families, b"x" * body_len, topic)
                for claimed in (0, 0x10, 0x20, 0x30):
                    for other in (0, 0xFC0F):
                        lay = decoded_everywhere(with_sysflag(valid, claimed | other), topic)
                        # Swapped families of one width (born IPv6 for store IPv6) keep the
                        # layout; only the record CRC property would tell.
                        assert (lay is not None) == (width(claimed) == width(actual)), (
                            families, body_len, topic, claimed)


class _Segment(NamedTuple):
    start: int
    end: int
    mm: bytes


class _Log(NamedTuple):
    """The part of a CommitLog ``record_fields`` reads: ``segments.segments``."""

    segments: object


@st.composite
def rotted(draw, raw: bytes) -> bytes:
    """``raw`` with its sysflag's host bits perhaps flipped and a few bytes replaced; bit rot
    leaves a segment's size alone."""
    buf = bytearray(raw)
    buf[39] ^= draw(st.sampled_from([0, 0x10, 0x20, 0x30]))
    for _ in range(draw(st.integers(0, 3))):
        buf[draw(st.integers(0, len(buf) - 1))] = draw(st.integers(0, 255))
    return bytes(buf)


@FUZZ
@given(rec=small_records, data=st.data(), lead=st.integers(0, 8), trail=st.integers(0, 8))
def test_record_fields_of_records_damaged_since_their_read(rec, data, lead, trail):
    # The columns are those of the read that served the intact record; the bytes then rot.
    valid = small_record(**rec)
    lay = unpack_record(valid)
    seg_start = PHYS - lead
    batch = SimpleNamespace(phys_offsets=[PHYS], sizes=[len(valid)], sys_flags=[lay.fields[7]],
                            body_offsets=[0, lay.fields[16]])
    buf = bytes(lead) + data.draw(rotted(valid)) + bytes(trail)
    log = _Log(SimpleNamespace(segments=[_Segment(seg_start, seg_start + len(buf), buf)]))
    got = only_value_errors(strings_of_rows, log, batch)
    if buf[lead:lead + len(valid)] == valid:
        msg = StoredMessage(valid, lay)
        assert (got.born_hosts.to_list(), got.store_hosts.to_list(), got.msg_ids.to_list(),
                got.tags.to_list()) == ([msg.born_host], [msg.store_host], [msg.msg_id],
                                        [msg.tags])

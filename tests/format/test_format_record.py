"""Commit-log record layout (spec section 2): encode, decode, scan, blank records, msg ids."""

from __future__ import annotations

import struct
import zlib

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.append.encoding import PutContext, encode_single, prepare
from mqstore.append.columns import encode_batch
from mqstore.format.hosts import Host, parse_host
from mqstore.format.properties import encode_properties
from mqstore.format.record import (
    BLANK_MAGIC, MAGIC_V1, MAGIC_V2, SCAN_BAD, SCAN_BLANK, SCAN_OK, SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6, decode_record, decompress_body, encode_blank, encode_record,
    header_dtype, header_struct, offset_msg_id, parse_offset_msg_id, record_size, scan_record,
)
from mqstore.hashing import crc32
from mqstore.message import Message

# ---------------------------------------------------------------------------------------------
# Spec section 2 test vector
# ---------------------------------------------------------------------------------------------

VECTOR_HEX = (
    "0000006b daa320a7 3610a686 00000000 00000000 0000000000000000 0000000000000000 00000000"
    "0000018bcfe56800 7f000001 0000c350 0000018bcfe5687b 7f000001 00002a9f 00000000"
    "0000000000000000 00000005 68656c6c6f 01 54 000a 54414753015461674102"
)
VECTOR = bytes.fromhex(VECTOR_HEX.replace(" ", ""))

BORN_V4 = Host(bytes([127, 0, 0, 1]), 50000)
STORE_V4 = Host(bytes([127, 0, 0, 1]), 10911)
LOOPBACK_V6 = bytes(15) + b"\x01"
BORN_V6 = Host(LOOPBACK_V6, 50000)


def vector_fields(**over):
    fields = dict(
        queue_id=0, flag=0, queue_offset=0, phys_offset=0, sysflag=0,
        born_timestamp=1_700_000_000_000, born_host=BORN_V4,
        store_timestamp=1_700_000_000_123, store_host=STORE_V4,
        reconsume_times=0, prepared_tx_offset=0, body=b"hello", topic=b"T",
        properties=b"TAGS\x01TagA\x02",
    )
    fields.update(over)
    return fields


def test_vector_is_107_bytes():
    assert len(VECTOR) == 107


def test_encode_matches_spec_vector_byte_for_byte():
    assert encode_record(**vector_fields()) == VECTOR


def test_encode_vector_field_positions():
    rec = encode_record(**vector_fields())
    assert struct.unpack_from(">i", rec, 0)[0] == 107
    assert struct.unpack_from(">i", rec, 4)[0] == MAGIC_V1
    assert rec[4:8] == bytes.fromhex("daa320a7")
    assert struct.unpack_from(">i", rec, 8)[0] == 0x3610A686
    assert struct.unpack_from(">q", rec, 40)[0] == 1_700_000_000_000
    assert rec[48:56] == bytes.fromhex("7f0000010000c350")
    assert struct.unpack_from(">q", rec, 56)[0] == 1_700_000_000_123
    assert rec[64:72] == bytes.fromhex("7f00000100002a9f")
    assert struct.unpack_from(">i", rec, 84)[0] == 5
    assert rec[88:93] == b"hello"
    assert rec[93] == 1 and rec[94:95] == b"T"
    assert rec[95:97] == b"\x00\x0a"
    assert rec[97:] == b"TAGS\x01TagA\x02"


def test_decode_spec_vector():
    d = decode_record(VECTOR)
    assert d.size == 107
    assert d.magic == MAGIC_V1
    assert d.body_crc == 907060870
    assert d.queue_id == 0
    assert d.flag == 0
    assert d.queue_offset == 0
    assert d.phys_offset == 0
    assert d.sysflag == 0
    assert d.born_timestamp == 1_700_000_000_000
    assert d.born_host == BORN_V4
    assert str(d.born_host) == "127.0.0.1:50000"
    assert d.store_timestamp == 1_700_000_000_123
    assert d.store_host == STORE_V4
    assert str(d.store_host) == "127.0.0.1:10911"
    assert d.reconsume_times == 0
    assert d.prepared_tx_offset == 0
    assert d.body == b"hello"
    assert d.topic == "T"
    assert d.properties_text == "TAGS\x01TagA\x02"


def test_scan_spec_vector():
    kind, size, head = scan_record(VECTOR, 0, len(VECTOR), True, expected_phys=0)
    assert kind == SCAN_OK
    assert size == 107
    assert head.phys_offset == 0
    assert head.size == 107
    assert head.queue_id == 0
    assert head.queue_offset == 0
    assert head.sysflag == 0
    assert head.store_timestamp == 1_700_000_000_123
    assert head.topic == "T"
    assert head.properties == b"TAGS\x01TagA\x02"


def ipv6_vector() -> bytes:
    return (
        bytes.fromhex("0000006d daa320a7 3610a686 00000000 00000000".replace(" ", ""))
        + bytes(8) + bytes(8) + bytes.fromhex("00000010")
        + bytes.fromhex("0000018bcfe56800")
        + LOOPBACK_V6 + bytes.fromhex("0000c350")
        + bytes.fromhex("0000018bcfe5687b")
        + bytes.fromhex("7f00000100002a9f")
        + bytes(4) + bytes(8)
        + bytes.fromhex("00000005") + b"hello" + b"\x01T" + b"\x00\x00"
    )


def test_ipv6_born_host_variant_is_109_bytes():
    rec = encode_record(**vector_fields(born_host=BORN_V6, properties=b""))
    assert len(rec) == 109
    assert rec == ipv6_vector()
    assert struct.unpack_from(">i", rec, 0)[0] == 109
    assert struct.unpack_from(">i", rec, 36)[0] == 0x10
    assert rec[48:64] == LOOPBACK_V6
    assert struct.unpack_from(">i", rec, 64)[0] == 50000
    assert struct.unpack_from(">q", rec, 68)[0] == 1_700_000_000_123


def test_ipv6_born_host_variant_decodes_and_scans():
    rec = ipv6_vector()
    d = decode_record(rec)
    assert d.size == 109
    assert d.sysflag == SYSFLAG_BORNHOST_V6
    assert d.born_host == BORN_V6
    assert str(d.born_host) == "[::1]:50000"
    assert d.store_timestamp == 1_700_000_000_123
    assert d.store_host == STORE_V4
    assert d.body == b"hello"
    assert d.topic == "T"
    assert d.properties_text == ""
    kind, size, head = scan_record(rec, 0, len(rec), True, expected_phys=0)
    assert (kind, size) == (SCAN_OK, 109)
    assert head.store_timestamp == 1_700_000_000_123
    assert head.sysflag == 0x10
    assert head.properties == b""


def test_encode_sets_v6_bits_from_host_families_and_clears_stale_ones():
    rec = encode_record(**vector_fields(sysflag=SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6 | 0x2))
    assert struct.unpack_from(">i", rec, 36)[0] == 0x2
    assert len(rec) == 107
    rec = encode_record(**vector_fields(store_host=Host(LOOPBACK_V6, 10911), properties=b""))
    assert struct.unpack_from(">i", rec, 36)[0] == SYSFLAG_STOREHOST_V6
    assert len(rec) == 109
    assert struct.unpack_from(">q", rec, 56)[0] == 1_700_000_000_123
    assert rec[64:80] == LOOPBACK_V6
    assert decode_record(rec).store_host == Host(LOOPBACK_V6, 10911)


def test_explicit_body_crc_is_written_as_given():
    rec = encode_record(**vector_fields(body_crc=12345))
    assert struct.unpack_from(">i", rec, 8)[0] == 12345
    assert rec[12:] == VECTOR[12:]


# ---------------------------------------------------------------------------------------------
# V2 records
# ---------------------------------------------------------------------------------------------


def test_v2_record_for_topic_over_127_bytes():
    topic = b"%RETRY%" + b"g" * 193  # 200 bytes
    rec = encode_record(**vector_fields(topic=topic, v2=True))
    assert len(rec) == 91 + 5 + 200 + 10 + 1
    assert rec[4:8] == bytes.fromhex("daa320ab")
    assert struct.unpack_from(">i", rec, 4)[0] == MAGIC_V2
    assert rec[93:95] == b"\x00\xc8"
    assert rec[95:295] == topic
    assert rec[295:297] == b"\x00\x0a"
    d = decode_record(rec)
    assert d.magic == MAGIC_V2
    assert d.topic == topic.decode()
    assert d.properties_text == "TAGS\x01TagA\x02"
    kind, size, head = scan_record(rec, 0, len(rec), True, expected_phys=0)
    assert (kind, size) == (SCAN_OK, len(rec))
    assert head.topic == topic.decode()
    assert head.properties == b"TAGS\x01TagA\x02"


def test_v2_record_with_short_topic_uses_two_byte_length():
    rec = encode_record(**vector_fields(v2=True))
    assert len(rec) == 108
    assert rec[93:96] == b"\x00\x01T"
    assert decode_record(rec).topic == "T"


def test_v2_record_with_255_byte_topic():
    topic = b"%RETRY%" + b"Z" * 248
    rec = encode_record(**vector_fields(topic=topic, v2=True, properties=b""))
    assert rec[93:95] == b"\x00\xff"
    assert decode_record(rec).topic == topic.decode()


def test_record_size_formula():
    assert record_size(5, 1, 10) == 107
    assert record_size(5, 1, 0, born_v6=True) == 109
    assert record_size(5, 1, 0, born_v6=True, store_v6=True) == 121
    assert record_size(5, 200, 10, v2=True) == 307
    assert record_size(0, 0, 0) == 91


# ---------------------------------------------------------------------------------------------
# header_struct / header_dtype
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("born_v6", "store_v6", "size"),
    [(False, False, 88), (True, False, 100), (False, True, 100), (True, True, 112)],
)
def test_header_sizes(born_v6, store_v6, size):
    assert header_struct(born_v6, store_v6).size == size
    assert header_dtype(born_v6, store_v6).itemsize == size


@pytest.mark.parametrize("born_v6", [False, True])
@pytest.mark.parametrize("store_v6", [False, True])
def test_header_dtype_packs_like_header_struct(born_v6, store_v6):
    born = Host(bytes(range(1, 17)) if born_v6 else bytes([10, 0, 0, 7]), 50001)
    store = Host(bytes(range(100, 116)) if store_v6 else bytes([192, 168, 1, 2]), 10911)
    values = (300, MAGIC_V1, 0x1234567, 3, -9, 77, 1 << 40, 0x30, -5, born.address, born.port,
              123456789, store.address, store.port, 2, -(1 << 62), 42)
    arr = np.zeros(1, dtype=header_dtype(born_v6, store_v6))
    names = arr.dtype.names
    for name, value in zip(names, values):
        arr[name] = np.void(value) if isinstance(value, bytes) else value
    assert arr.tobytes() == header_struct(born_v6, store_v6).pack(*values)


def test_header_dtype_field_offsets():
    dt = header_dtype(False, False)
    assert dt.fields["phys_offset"][1] == 28
    assert dt.fields["sysflag"][1] == 36
    assert dt.fields["born_addr"][1] == 48
    assert dt.fields["store_timestamp"][1] == 56
    assert dt.fields["body_len"][1] == 84
    assert header_dtype(True, False).fields["store_timestamp"][1] == 68


# ---------------------------------------------------------------------------------------------
# Blank records
# ---------------------------------------------------------------------------------------------


def test_encode_blank():
    assert encode_blank(100) == bytes.fromhex("00000064cbd43194")
    assert struct.unpack(">ii", encode_blank(8)) == (8, BLANK_MAGIC)
    assert BLANK_MAGIC == -875286124


def test_scan_reports_blank_record():
    buf = VECTOR + encode_blank(93) + bytes(85)
    assert len(buf) == 200
    kind, size, head = scan_record(buf, 107, len(buf), True)
    assert (kind, size, head) == (SCAN_BLANK, 93, None)


def test_scan_reports_minimal_blank_at_segment_end():
    buf = VECTOR + encode_blank(8)
    assert scan_record(buf, 107, len(buf), True) == (SCAN_BLANK, 8, None)


# ---------------------------------------------------------------------------------------------
# scan_record rejections
# ---------------------------------------------------------------------------------------------


def test_scan_two_records_back_to_back():
    second = encode_record(**vector_fields(phys_offset=107, queue_offset=1, body=b"world"))
    buf = VECTOR + second
    kind, size, head = scan_record(buf, 0, len(buf), True, expected_phys=0)
    assert (kind, size) == (SCAN_OK, 107)
    kind, size, head = scan_record(buf, 107, len(buf), True, expected_phys=107)
    assert (kind, size) == (SCAN_OK, 107)
    assert head.phys_offset == 107
    assert head.queue_offset == 1


@pytest.mark.parametrize("cut", [1, 4, 5, 8, 50, 88, 100, 106])
def test_scan_rejects_truncated_record(cut):
    buf = VECTOR[:cut]
    kind, reason, head = scan_record(buf, 0, len(buf), True)
    assert kind == SCAN_BAD
    assert isinstance(reason, str) and reason
    assert head is None


def test_scan_rejects_record_cut_by_limit_within_larger_buffer():
    buf = VECTOR + bytes(100)
    kind, reason, head = scan_record(buf, 0, 106, True)
    assert kind == SCAN_BAD
    assert "106" in reason
    assert head is None


def test_scan_rejects_unknown_magic():
    buf = bytearray(VECTOR)
    buf[4:8] = bytes.fromhex("daa320a8")
    kind, reason, head = scan_record(bytes(buf), 0, len(buf), False)
    assert kind == SCAN_BAD
    assert "0xdaa320a8" in reason
    assert head is None


def test_scan_rejects_zeroed_space():
    buf = bytes(4096)
    kind, reason, head = scan_record(buf, 0, len(buf), False)
    assert kind == SCAN_BAD
    assert head is None


@pytest.mark.parametrize("delta", [-1, 1])
def test_scan_rejects_totalsize_off_by_one(delta):
    buf = bytearray(VECTOR + b"\x00")
    struct.pack_into(">i", buf, 0, 107 + delta)
    kind, reason, head = scan_record(bytes(buf), 0, len(buf), False)
    assert kind == SCAN_BAD
    assert head is None


@pytest.mark.parametrize("delta", [-1, 1])
def test_decode_rejects_totalsize_off_by_one(delta):
    buf = bytearray(VECTOR + b"\x00")
    struct.pack_into(">i", buf, 0, 107 + delta)
    with pytest.raises(ValueError):
        decode_record(bytes(buf))


def test_scan_body_crc_checked_only_when_asked():
    rec = encode_record(**vector_fields(body_crc=crc32(b"hello") ^ 1))
    assert scan_record(rec, 0, len(rec), False)[:2] == (SCAN_OK, 107)
    kind, reason, head = scan_record(rec, 0, len(rec), True)
    assert kind == SCAN_BAD
    assert "CRC" in reason
    assert head is None


def test_scan_body_crc_detects_flipped_body_byte():
    buf = bytearray(VECTOR)
    buf[90] ^= 0x20  # 'l' -> 'L'
    assert scan_record(bytes(buf), 0, len(buf), False)[0] == SCAN_OK
    assert scan_record(bytes(buf), 0, len(buf), True)[0] == SCAN_BAD


def test_scan_rejects_wrong_physical_offset():
    rec = encode_record(**vector_fields(phys_offset=4096))
    assert scan_record(rec, 0, len(rec), True, expected_phys=4096)[:2] == (SCAN_OK, 107)
    assert scan_record(rec, 0, len(rec), True)[:2] == (SCAN_OK, 107)
    kind, reason, head = scan_record(rec, 0, len(rec), True, expected_phys=4095)
    assert kind == SCAN_BAD
    assert "4096" in reason and "4095" in reason
    assert head is None


def test_scan_at_nonzero_position_in_buffer():
    rec = encode_record(**vector_fields(phys_offset=1000))
    buf = bytes(30) + rec + bytes(10)
    kind, size, head = scan_record(buf, 30, 30 + len(rec), True, expected_phys=1000)
    assert (kind, size) == (SCAN_OK, 107)
    assert head.phys_offset == 1000
    assert head.properties == b"TAGS\x01TagA\x02"


def test_scan_rejects_v1_topic_length_over_127():
    buf = bytearray(VECTOR)
    buf[93] = 0x80
    assert scan_record(bytes(buf), 0, len(buf), False)[0] == SCAN_BAD
    with pytest.raises(ValueError):
        decode_record(bytes(buf))


def test_scan_rejects_body_length_overrun():
    buf = bytearray(VECTOR)
    struct.pack_into(">i", buf, 84, 200)
    assert scan_record(bytes(buf), 0, len(buf), False)[0] == SCAN_BAD
    struct.pack_into(">i", buf, 84, -1)
    assert scan_record(bytes(buf), 0, len(buf), False)[0] == SCAN_BAD


def test_scan_rejects_non_utf8_topic():
    rec = encode_record(**vector_fields(topic=b"\xff"))
    kind, reason, head = scan_record(rec, 0, len(rec), True)
    assert kind == SCAN_BAD
    assert head is None


def test_decode_rejects_unknown_magic_and_short_buffer():
    buf = bytearray(VECTOR)
    buf[4:8] = b"\x00\x00\x00\x00"
    with pytest.raises(ValueError, match="magic"):
        decode_record(bytes(buf))
    with pytest.raises(ValueError):
        decode_record(VECTOR[:90])


def test_decode_rejects_truncated_ipv6_record_with_value_error():
    rec = encode_record(**vector_fields(born_host=BORN_V6, store_host=Host(LOOPBACK_V6, 10911)))
    assert len(rec) == 131
    with pytest.raises(ValueError):
        decode_record(rec[:100])


def test_scan_reports_bad_for_ipv6_record_whose_size_field_is_torn():
    """A torn tail: TOTALSIZE claims 95 bytes and the readable data ends there."""
    rec = bytearray(encode_record(**vector_fields(born_host=BORN_V6,
                                                  store_host=Host(LOOPBACK_V6, 10911))))
    struct.pack_into(">i", rec, 0, 95)
    buf = bytes(rec[:95])
    kind, reason, head = scan_record(buf, 0, len(buf), True)
    assert kind == SCAN_BAD
    assert head is None


def test_scan_reports_bad_when_size_field_ends_the_data_right_after_the_body():
    """TOTALSIZE 93 ends the readable data where the V1 topic-length byte would be."""
    buf = bytearray(VECTOR[:93])
    struct.pack_into(">i", buf, 0, 93)
    kind, reason, head = scan_record(bytes(buf), 0, len(buf), False)
    assert kind == SCAN_BAD
    assert head is None


# ---------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------

TOPIC_ALPHABET = "%|abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
INT32 = st.integers(-(1 << 31), (1 << 31) - 1)
INT64 = st.integers(-(1 << 63), (1 << 63) - 1)
PORT = st.integers(0, (1 << 31) - 1)
PROP_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1, max_size=12,
)

hosts = st.one_of(
    st.builds(Host, st.binary(min_size=4, max_size=4), PORT),
    st.builds(Host, st.binary(min_size=16, max_size=16), PORT),
)


@st.composite
def record_inputs(draw):
    v2 = draw(st.booleans())
    max_topic = 255 if v2 else 127
    topic = draw(st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=max_topic))
    props = draw(st.dictionaries(PROP_TEXT, PROP_TEXT, max_size=4))
    return dict(
        queue_id=draw(INT32), flag=draw(INT32), queue_offset=draw(INT64),
        phys_offset=draw(INT64),
        sysflag=draw(st.integers(0, (1 << 31) - 1)) & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6),
        born_timestamp=draw(INT64), born_host=draw(hosts),
        store_timestamp=draw(INT64), store_host=draw(hosts),
        reconsume_times=draw(INT32), prepared_tx_offset=draw(INT64),
        body=draw(st.binary(max_size=300)), topic=topic.encode("ascii"),
        properties=encode_properties(props).encode("utf-8"), v2=v2,
    )


@settings(max_examples=200)
@given(record_inputs())
def test_record_round_trip(x):
    rec = encode_record(**x)
    born_v6 = x["born_host"].is_v6
    store_v6 = x["store_host"].is_v6
    expected_sysflag = (x["sysflag"] | (SYSFLAG_BORNHOST_V6 if born_v6 else 0)
                        | (SYSFLAG_STOREHOST_V6 if store_v6 else 0))
    size = record_size(len(x["body"]), len(x["topic"]), len(x["properties"]), v2=x["v2"],
                       born_v6=born_v6, store_v6=store_v6)
    assert len(rec) == size
    d = decode_record(rec)
    assert d.size == size
    assert d.magic == (MAGIC_V2 if x["v2"] else MAGIC_V1)
    assert d.body_crc == zlib.crc32(x["body"]) & 0x7FFFFFFF
    assert d.queue_id == x["queue_id"]
    assert d.flag == x["flag"]
    assert d.queue_offset == x["queue_offset"]
    assert d.phys_offset == x["phys_offset"]
    assert d.sysflag == expected_sysflag
    assert d.born_timestamp == x["born_timestamp"]
    assert d.born_host == x["born_host"]
    assert d.store_timestamp == x["store_timestamp"]
    assert d.store_host == x["store_host"]
    assert d.reconsume_times == x["reconsume_times"]
    assert d.prepared_tx_offset == x["prepared_tx_offset"]
    assert d.body == x["body"]
    assert d.topic == x["topic"].decode()
    assert d.properties_text == x["properties"].decode("utf-8")

    buf = b"\xee" * 7 + rec + b"\xee" * 5
    kind, got_size, head = scan_record(buf, 7, 7 + len(rec), True,
                                       expected_phys=x["phys_offset"])
    assert (kind, got_size) == (SCAN_OK, size)
    assert head.phys_offset == x["phys_offset"]
    assert head.size == size
    assert head.queue_id == x["queue_id"]
    assert head.queue_offset == x["queue_offset"]
    assert head.sysflag == expected_sysflag
    assert head.store_timestamp == x["store_timestamp"]
    assert head.topic == x["topic"].decode()
    assert head.properties == x["properties"]
    assert decode_record(buf, 7) == d


@settings(max_examples=100)
@given(record_inputs(), st.integers(1, 400))
def test_scan_never_accepts_a_cut_record(x, cut):
    rec = encode_record(**x)
    cut = min(cut, len(rec) - 1)
    buf = rec[:cut] + bytes(len(rec))
    kind, reason, head = scan_record(buf, 0, cut, False)
    assert kind == SCAN_BAD
    assert head is None


@settings(max_examples=200)
@given(record_inputs(), st.integers(-4, 4), st.integers(0, 2), st.booleans())
def test_scan_never_raises_on_torn_tail(x, delta, extra, near_body_end):
    """Whatever TOTALSIZE a torn tail holds, the scan answers instead of raising.

    TOTALSIZE is set near a field boundary (end of the fixed header or end of the body) and
    the readable data ends at most two bytes after it.
    """
    rec = bytearray(encode_record(**x))
    header = header_struct(x["born_host"].is_v6, x["store_host"].is_v6).size
    total = max(header + (len(x["body"]) if near_body_end else 0) + delta, 0)
    cut = min(total + extra, len(rec))
    struct.pack_into(">i", rec, 0, total)
    buf = bytes(rec[:cut])
    kind, _, head = scan_record(buf, 0, len(buf), True)
    assert kind in (SCAN_OK, SCAN_BAD)
    if kind == SCAN_OK:
        assert total == cut == len(rec)
    else:
        assert head is None


# ---------------------------------------------------------------------------------------------
# Offset message ids
# ---------------------------------------------------------------------------------------------


def test_offset_msg_id_spec_example():
    assert offset_msg_id(STORE_V4, 0) == "7F00000100002A9F0000000000000000"


def test_offset_msg_id_examples():
    assert offset_msg_id(STORE_V4, 107) == "7F00000100002A9F000000000000006B"
    assert offset_msg_id(Host(LOOPBACK_V6, 10911), 1 << 32) == (
        "00000000000000000000000000000001" "00002A9F" "0000000100000000"
    )
    assert parse_offset_msg_id("7F00000100002A9F000000000000006B") == (STORE_V4, 107)
    assert parse_offset_msg_id("7f00000100002a9f000000000000006b") == (STORE_V4, 107)


@settings(max_examples=200)
@given(hosts, INT64)
def test_offset_msg_id_round_trip(host, offset):
    msg_id = offset_msg_id(host, offset)
    assert len(msg_id) == (56 if host.is_v6 else 32)
    assert msg_id == msg_id.upper()
    assert all(c in "0123456789ABCDEF" for c in msg_id)
    assert parse_offset_msg_id(msg_id) == (host, offset)


@pytest.mark.parametrize("bad", ["XYZ", "7F00000100002A9F000000000000006", "7F00", "",
                                 "7F00000100002A9F000000000000006B00"])
def test_parse_offset_msg_id_errors_name_the_id(bad):
    with pytest.raises(ValueError) as exc:
        parse_offset_msg_id(bad)
    assert repr(bad) in str(exc.value)


# ---------------------------------------------------------------------------------------------
# decompress_body
# ---------------------------------------------------------------------------------------------


def test_decompress_body():
    raw = b"hello hello hello hello"
    packed = zlib.compress(raw)
    assert decompress_body(raw, 0) == raw
    assert decompress_body(raw, 0x300) == raw  # compression type without the COMPRESSED bit
    assert decompress_body(packed, 0x1) == raw
    assert decompress_body(packed, 0x301) == raw
    with pytest.raises(ValueError, match="0x100"):
        decompress_body(packed, 0x101)
    with pytest.raises(ValueError, match="0x200"):
        decompress_body(packed, 0x201)


# ---------------------------------------------------------------------------------------------
# appender: encode_batch == encode_single == encode_record
# ---------------------------------------------------------------------------------------------

V4_HOSTS = ["127.0.0.1:50000", "10.0.0.1:1", "192.168.1.200:65535", "0.0.0.0:0",
            "1.0.0.0:65535"]
V6_HOSTS = ["[::1]:50000", "[fe80::1:2]:7", "[2001:db8::ff00:42:8329]:10911", "[::]:0"]
USER_SYSFLAGS = [0, 0x1, 0x2, 0x3, 0x40, 0x300, 0x301, 0x8, 0x4, 0xC]

messages = st.builds(
    Message,
    topic=st.text(alphabet=TOPIC_ALPHABET, min_size=1, max_size=40),
    body=st.binary(max_size=64),
    tags=st.one_of(st.none(), PROP_TEXT),
    keys=st.one_of(st.none(), st.lists(st.text(alphabet="abcXYZ019", min_size=1, max_size=6),
                                       min_size=1, max_size=3)),
    properties=st.one_of(st.none(), st.dictionaries(
        st.sampled_from(["p1", "p2", "color", "WAIT"]), PROP_TEXT, max_size=3)),
    flag=INT32,
    sysflag=st.sampled_from(USER_SYSFLAGS),
    born_timestamp=st.one_of(st.none(), INT64),
    born_host=st.one_of(st.none(), st.sampled_from(V4_HOSTS + V6_HOSTS)),
    reconsume_times=INT32,
    prepared_tx_offset=INT64,
)


@st.composite
def batches(draw):
    store_host = draw(st.sampled_from(["127.0.0.1:10911", "[::1]:10911"]))
    msgs = draw(st.lists(messages, min_size=1, max_size=8))
    n = len(msgs)
    qids = draw(st.lists(st.integers(0, (1 << 31) - 1), min_size=n, max_size=n))
    qoffs = draw(st.lists(st.integers(0, (1 << 62)), min_size=n, max_size=n))
    phys = draw(st.lists(st.integers(0, (1 << 62)), min_size=n, max_size=n))
    ts = draw(st.integers(0, (1 << 62)))
    return store_host, msgs, qids, qoffs, phys, ts


def _tail_properties(tail: bytes, magic: int) -> bytes:
    """PROPERTIES out of a TOPICLENGTH+TOPIC+PROPERTIESLENGTH+PROPERTIES tail."""
    if magic == MAGIC_V1:
        at = 1 + tail[0]
    else:
        at = 2 + struct.unpack_from(">h", tail)[0]
    (props_len,) = struct.unpack_from(">h", tail, at)
    assert len(tail) == at + 2 + props_len
    return tail[at + 2:]


def _encode_via_record(p, store_host, queue_id, queue_offset, phys_offset, ts):
    return encode_record(
        queue_id=queue_id, flag=p.flag, queue_offset=queue_offset, phys_offset=phys_offset,
        sysflag=p.sysflag, born_timestamp=ts if p.born_timestamp is None else p.born_timestamp,
        born_host=p.born_host, store_timestamp=ts, store_host=store_host,
        reconsume_times=p.reconsume_times, prepared_tx_offset=p.prepared_tx_offset,
        body=p.body, topic=p.topic.encode(), properties=_tail_properties(p.tail, p.magic),
        v2=p.magic == MAGIC_V2,
    )


@settings(max_examples=200)
@given(batches())
def test_encode_batch_matches_encode_single_and_encode_record(batch):
    store_text, msgs, qids, qoffs, phys, ts = batch
    store_host = parse_host(store_text)
    ctx = PutContext(store_host, 4 << 20, True, store_host.is_v6)
    items = [prepare(m, ctx) for m in msgs]
    got = encode_batch(items, store_host, np.array(qids, dtype=np.int64),
                       np.array(qoffs, dtype=np.int64), np.array(phys, dtype=np.int64), ts)
    singles = [encode_single(p, store_host, q, o, ph, ts)
               for p, q, o, ph in zip(items, qids, qoffs, phys)]
    assert got == b"".join(singles)
    at = 0
    for p, m, q, o, ph, single in zip(items, msgs, qids, qoffs, phys, singles):
        assert single == _encode_via_record(p, store_host, q, o, ph, ts)
        d = decode_record(got, at)
        assert d.size == len(single) == p.size
        assert d.queue_id == q and d.queue_offset == o and d.phys_offset == ph
        assert d.body == m.body
        assert d.topic == m.topic
        assert d.flag == m.flag
        assert d.reconsume_times == m.reconsume_times
        assert d.prepared_tx_offset == m.prepared_tx_offset
        expected_born = store_host if m.born_host is None else parse_host(m.born_host)
        assert d.born_host == expected_born
        assert d.born_timestamp == (ts if m.born_timestamp is None else m.born_timestamp)
        assert d.store_timestamp == ts
        assert d.store_host == store_host
        assert bool(d.sysflag & SYSFLAG_BORNHOST_V6) == expected_born.is_v6
        assert bool(d.sysflag & SYSFLAG_STOREHOST_V6) == store_host.is_v6
        assert d.sysflag & ~0x30 == m.sysflag
        at += d.size
    assert at == len(got)


def test_encode_batch_mixed_ipv4_ipv6_born_hosts():
    store_host = parse_host("127.0.0.1:10911")
    ctx = PutContext(store_host, 4 << 20, True, False)
    msgs = [Message("T", b"a", born_host="10.0.0.1:1"),
            Message("T", b"bb", born_host="[::1]:2"),
            Message("T", b"", tags="TagA"),
            Message("T", b"dddd", born_host="10.0.0.2:3", born_timestamp=5)]
    items = [prepare(m, ctx) for m in msgs]
    sizes = [p.size for p in items]
    assert sizes == [93, 106, 102, 96]
    phys = np.cumsum([0] + sizes[:-1]).astype(np.int64)
    got = encode_batch(items, store_host, np.zeros(4, dtype=np.int64),
                       np.arange(4, dtype=np.int64), phys, 1_700_000_000_123)
    assert got == b"".join(
        encode_single(p, store_host, 0, i, int(ph), 1_700_000_000_123)
        for i, (p, ph) in enumerate(zip(items, phys)))
    assert decode_record(got, 93).born_host == Host(LOOPBACK_V6, 2)
    assert decode_record(got, 93).sysflag == 0x10


def test_encode_batch_distinct_ipv4_born_hosts_same_layout():
    store_host = parse_host("127.0.0.1:10911")
    ctx = PutContext(store_host, 4 << 20, True, False)
    msgs = [Message("T", b"x", born_host="1.0.0.0:1"), Message("T", b"y", born_host="0.0.0.1:2"),
            Message("T", b"z", born_host="0.0.0.0:0")]
    items = [prepare(m, ctx) for m in msgs]
    got = encode_batch(items, store_host, np.zeros(3, dtype=np.int64),
                       np.arange(3, dtype=np.int64), np.array([0, 93, 186], dtype=np.int64), 7)
    assert got == b"".join(encode_single(p, store_host, 0, i, 93 * i, 7)
                           for i, p in enumerate(items))
    assert [decode_record(got, 93 * i).born_host for i in range(3)] == [
        Host(b"\x01\x00\x00\x00", 1), Host(b"\x00\x00\x00\x01", 2), Host(b"\x00\x00\x00\x00", 0)]


def test_prepare_writes_v2_for_long_retry_topic():
    store_host = parse_host("127.0.0.1:10911")
    ctx = PutContext(store_host, 4 << 20, True, False)
    topic = "%RETRY%" + "g" * 150
    p = prepare(Message(topic, b"hello"), ctx)
    assert p.magic == MAGIC_V2
    rec = encode_single(p, store_host, 0, 0, 0, 1)
    assert rec[4:8] == bytes.fromhex("daa320ab")
    assert rec[93:95] == struct.pack(">h", 157)
    assert decode_record(rec).topic == topic

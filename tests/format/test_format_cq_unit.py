"""Consume-queue unit layout (spec section 4, behaviour 18) and the checkpoint layout (section 6,
behaviour 61)."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.format.cq_unit import (
    CQ_DTYPE, CQ_UNIT_SIZE, EXT_ADDRESS_MAX, FILLER_SIZE, decode_units, encode_units,
    round_file_bytes, valid_prefix,
)
from mqstore.hashing import java_string_hash
from mqstore.storage.checkpoint import CHECKPOINT_BYTES, Checkpoint


def test_dtype_layout():
    assert CQ_UNIT_SIZE == 20
    assert CQ_DTYPE.itemsize == 20
    assert CQ_DTYPE.names == ("phys_offset", "size", "tags_code")
    assert CQ_DTYPE.fields["phys_offset"][1] == 0
    assert CQ_DTYPE.fields["size"][1] == 8
    assert CQ_DTYPE.fields["tags_code"][1] == 12
    assert FILLER_SIZE == 0x7FFFFFFF
    assert EXT_ADDRESS_MAX == -2147483649


def test_behaviour_18_unit_for_tag_a():
    raw = encode_units([0], [107], [java_string_hash("TagA")])
    assert raw == bytes.fromhex("0000000000000000" "0000006b" "000000000027a807")


def test_behaviour_18_unit_without_tags():
    raw = encode_units([0], [107], [0])
    assert raw == bytes.fromhex("0000000000000000" "0000006b" "0000000000000000")


def test_behaviour_18_polygenelubricants_sign_extended():
    code = java_string_hash("polygenelubricants")
    assert code == -2147483648
    raw = encode_units([0], [107], [code])
    assert raw[12:] == bytes.fromhex("ffffffff80000000")
    assert decode_units(raw)["tags_code"][0] == -2147483648


def test_encode_several_units_big_endian():
    raw = encode_units([0, 107, 1 << 40], [107, 200, 1], [2598919, -1, 0])
    assert len(raw) == 60
    assert raw[20:40] == bytes.fromhex("000000000000006b" "000000c8" "ffffffffffffffff")
    assert raw[40:60] == bytes.fromhex("0000010000000000" "00000001" "0000000000000000")


def test_encode_units_empty():
    assert encode_units([], [], []) == b""
    assert len(decode_units(b"")) == 0


def test_filler_unit_bytes():
    assert encode_units([0], [FILLER_SIZE], [0]) == bytes.fromhex(
        "0000000000000000" "7fffffff" "0000000000000000")


def test_decode_units_is_a_view():
    buf = bytearray(encode_units([5, 6], [7, 8], [9, 10]))
    units = decode_units(buf)
    assert units.dtype == CQ_DTYPE
    assert units["phys_offset"].tolist() == [5, 6]
    assert units["size"].tolist() == [7, 8]
    assert units["tags_code"].tolist() == [9, 10]
    buf[31] = 99  # size of unit 1 (bytes 28..31), low byte
    assert units["size"].tolist() == [7, 99]


def test_decode_units_of_memoryview_slice():
    raw = encode_units([1, 2, 3], [4, 5, 6], [7, 8, 9])
    units = decode_units(memoryview(raw)[20:60])
    assert units["phys_offset"].tolist() == [2, 3]


def test_decode_units_rejects_partial_unit():
    with pytest.raises(ValueError):
        decode_units(bytes(21))


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(-(1 << 63), (1 << 63) - 1),
                          st.integers(-(1 << 31), (1 << 31) - 1),
                          st.integers(-(1 << 63), (1 << 63) - 1)), max_size=30))
def test_units_round_trip(rows):
    phys = [r[0] for r in rows]
    sizes = [r[1] for r in rows]
    tags = [r[2] for r in rows]
    raw = encode_units(phys, sizes, tags)
    assert len(raw) == 20 * len(rows)
    assert raw == b"".join(struct.pack(">qiq", *r) for r in rows)
    units = decode_units(raw)
    assert units["phys_offset"].tolist() == phys
    assert units["size"].tolist() == sizes
    assert units["tags_code"].tolist() == tags


def test_encode_units_accepts_numpy_arrays():
    raw = encode_units(np.array([0, 107], dtype=np.int64), np.array([107, 107], dtype=np.int32),
                       np.array([2598919, 0], dtype=np.int64))
    assert raw == bytes.fromhex(
        "0000000000000000" "0000006b" "000000000027a807"
        "000000000000006b" "0000006b" "0000000000000000")


# ---------------------------------------------------------------------------------------------
# valid_prefix
# ---------------------------------------------------------------------------------------------


def test_valid_prefix_examples():
    assert valid_prefix(decode_units(b"")) == 0
    assert valid_prefix(decode_units(bytes(60))) == 0  # zero size is invalid
    raw = encode_units([0, 0, 107, 214, 0], [FILLER_SIZE, 107, 107, 107, 0], [0, 0, 1, 2, 0])
    assert valid_prefix(decode_units(raw)) == 4
    raw = encode_units([0, -1, 5], [1, 1, 1], [0, 0, 0])
    assert valid_prefix(decode_units(raw)) == 1
    raw = encode_units([0, 1], [1, -5], [0, 0])
    assert valid_prefix(decode_units(raw)) == 1
    raw = encode_units([0, 1, 2], [1, 1, 1], [0, 0, 0])
    assert valid_prefix(decode_units(raw)) == 3


def test_valid_prefix_ends_where_records_stop_following_each_other():
    # Dispatch writes units in commit-log order: a unit that starts inside or before the
    # record of the unit before it was copied in or torn.
    raw = encode_units([0, 100, 50, 300], [100, 100, 100, 100], [0, 0, 0, 0])
    assert valid_prefix(decode_units(raw)) == 1  # 100 or 50 is the stray one: both go
    raw = encode_units([0, 100, 900, 300, 400], [100, 100, 100, 100, 100], [0] * 5)
    assert valid_prefix(decode_units(raw)) == 2  # 900 jumped ahead
    raw = encode_units([0, 100, 0, 200], [100, 100, FILLER_SIZE, 100], [0, 0, 0, 0])
    assert valid_prefix(decode_units(raw)) == 4  # fillers hold places anywhere
    raw = encode_units([40, 200], [10, 10], [0, 0])
    assert valid_prefix(decode_units(raw), prev_end=100) == 0


@settings(max_examples=200)
@given(st.lists(st.tuples(st.integers(-3, 40), st.integers(-3, 5) | st.just(FILLER_SIZE)),
                max_size=20))
def test_valid_prefix_matches_first_invalid(rows):
    raw = encode_units([r[0] for r in rows], [r[1] for r in rows], [0] * len(rows))
    expected, prev_end, prev_real = 0, -1, False
    for off, size in rows:
        if off < 0 or size <= 0:
            break
        if size != FILLER_SIZE:
            if off < prev_end:
                expected -= 1 if expected and prev_real else 0
                break
            prev_end = max(prev_end, off + size)
        prev_real = size != FILLER_SIZE
        expected += 1
    assert valid_prefix(decode_units(raw)) == expected


# ---------------------------------------------------------------------------------------------
# round_file_bytes
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("configured", "rounded"),
    [(6_000_000, 6_000_000), (1, 20), (20, 20), (21, 40), (39, 40), (40, 40), (1000, 1000),
     (1001, 1020), (1024, 1040)],
)
def test_round_file_bytes(configured, rounded):
    assert round_file_bytes(configured) == rounded


@settings(max_examples=200)
@given(st.integers(1, 1 << 40))
def test_round_file_bytes_property(n):
    r = round_file_bytes(n)
    assert r % 20 == 0
    assert n <= r < n + 20


# ---------------------------------------------------------------------------------------------
# Checkpoint (behaviour 61)
# ---------------------------------------------------------------------------------------------


def test_checkpoint_layout(tmp_path):
    cp = Checkpoint(str(tmp_path))
    cp.physic_msg_timestamp = 0x0102030405060708
    cp.logics_msg_timestamp = 1_700_000_000_123
    cp.index_msg_timestamp = -2
    cp.master_flushed_offset = 4096
    cp.confirm_phy_offset = 1 << 40
    cp.close()
    raw = (tmp_path / "checkpoint").read_bytes()
    assert CHECKPOINT_BYTES == 4096
    assert len(raw) == 4096
    assert raw[0:8] == bytes.fromhex("0102030405060708")
    assert raw[8:16] == bytes.fromhex("0000018bcfe5687b")
    assert raw[16:24] == bytes.fromhex("fffffffffffffffe")
    assert raw[24:32] == bytes.fromhex("0000000000001000")
    assert raw[32:40] == bytes.fromhex("0000010000000000")
    assert raw[40:] == bytes(4056)


def test_checkpoint_appended_field_lives_in_rocketmq_padding(tmp_path):
    """mqstore's ``appended`` (@40) is in the file at once (no flush: a crash right after an
    append must find it) and zero again after a clean close."""
    cp = Checkpoint(str(tmp_path))
    cp.note_appended(0x0A0B0C0D0E)
    raw = (tmp_path / "checkpoint").read_bytes()
    assert raw[40:48] == bytes.fromhex("0000000a0b0c0d0e") and raw[48:] == bytes(4048)
    assert Checkpoint(str(tmp_path), read_only=True).appended_offset == 0x0A0B0C0D0E
    cp.close()
    assert (tmp_path / "checkpoint").read_bytes()[40:] == bytes(4056)


def test_checkpoint_reads_rocketmq_4x_three_field_file(tmp_path):
    (tmp_path / "checkpoint").write_bytes(struct.pack(">qqq", 11, 22, 33) + bytes(4096 - 24))
    cp = Checkpoint(str(tmp_path), read_only=True)
    assert (cp.physic_msg_timestamp, cp.logics_msg_timestamp, cp.index_msg_timestamp,
            cp.master_flushed_offset, cp.confirm_phy_offset) == (11, 22, 33, 0, 0)
    assert cp.min_timestamp() == 0
    cp.close()


def test_checkpoint_min_timestamp(tmp_path):
    cp = Checkpoint(str(tmp_path), read_only=True)
    cp.physic_msg_timestamp = 10_000
    cp.logics_msg_timestamp = 8_000
    assert cp.min_timestamp() == 5_000
    cp.logics_msg_timestamp = 2_000
    assert cp.min_timestamp() == 0
    cp.close()

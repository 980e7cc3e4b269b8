"""Index file layer: layout arithmetic, putKey/selectPhyOffset rules (spec §5, behaviours 49-52),
a property test against a plain oracle, and the six index files RocketMQ 4.9.8 wrote."""

from __future__ import annotations

import os
import shutil
import struct
import tempfile

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.errors import MQStoreError
from mqstore.format import index_layout as L
from mqstore.hashing import java_string_hash, mmh3_string_hash
from mqstore.storage import index_file
from mqstore.storage.index_file import IndexFile


LONG_MAX = (1 << 63) - 1
S = 1_795_324_267_531


def jhash(topic: str, key: str) -> int:
    return L.index_hash(L.key_string(topic, key), java_string_hash)


@pytest.fixture
def opened():
    files: list[IndexFile] = []
    yield files
    for f in files:
        f.close()


def new_file(opened, path, slots, entries, **kw) -> IndexFile:
    f = IndexFile.create(str(path), slots, entries, **kw)
    opened.append(f)
    return f


# -- layout ------------------------------------------------------------------------------------
def test_sizes_and_positions():
    assert L.file_size(L.DEFAULT_SLOTS, L.DEFAULT_ENTRIES) == 420_000_040
    assert L.file_size(32, 128) == 2728
    assert L.counts_for_size(2728) == (32, 128)
    assert L.counts_for_size(420_000_040) == (5_000_000, 20_000_000)
    assert L.counts_for_size(2728, slots=32) == (32, 128)
    assert L.counts_for_size(2728, entries=128) == (32, 128)
    assert L.counts_for_size(156, slots=4) == (4, 5)
    assert L.counts_for_size(156, entries=5) == (4, 5)
    assert L.slot_position(2539445) == 10_157_820
    assert L.entry_position(5_000_000, 1) == 20_000_060
    assert L.entries_start(32) == 168


@pytest.mark.parametrize("size, slots, entries", [
    (2729, None, None), (40, None, None), (0, None, None), (123, None, None),
    (2728, 31, None), (2728, None, 200), (2728, 32, 127), (156, None, None),
])
def test_sizes_that_do_not_fit(size, slots, entries):
    with pytest.raises(ValueError, match=f"index file size {size} does not fit"):
        L.counts_for_size(size, slots, entries)


def test_header_pack_is_big_endian():
    h = L.IndexHeader(1, 2, 3, 4, 5, 6)
    raw = L.pack_header(h)
    assert raw == (b"\0" * 7 + b"\x01" + b"\0" * 7 + b"\x02" + b"\0" * 7 + b"\x03"
                   + b"\0" * 7 + b"\x04" + b"\0\0\0\x05" + b"\0\0\0\x06")
    assert L.unpack_header(raw) == h
    assert L.ENTRY_DTYPE.names == ("key_hash", "phys_offset", "time_diff", "prev_index")
    assert L.ENTRY_DTYPE.itemsize == 20


def test_key_hashing_behaviour_52():
    assert java_string_hash("polygenelubricants") == -2147483648
    assert L.index_hash("polygenelubricants", java_string_hash) == 0
    assert L.key_string("T", "k1") == "T#k1"
    assert L.index_hash("T#k1", java_string_hash) == 2539445
    assert java_string_hash("T#Aa") == java_string_hash("T#BB") == 2538191
    assert L.index_hash("x", lambda _s: -123456789) == 123456789
    assert L.index_hash("x", lambda _s: 2147483647) == 2147483647
    assert L.index_hash("T#k1", mmh3_string_hash) == abs(mmh3_string_hash("T#k1"))
    assert L.slot_of(2539445, 5_000_000) == 2539445
    assert L.slot_of(2539445, 32) == 21


def test_time_diff_quirks():
    assert L.time_diff_seconds(S + 2500, S) == 2
    assert L.time_diff_seconds(S + 999, S) == 0
    assert L.time_diff_seconds(S - 5000, S) == 0
    assert L.time_diff_seconds(S, 0) == 0
    assert L.time_diff_seconds(S, -7) == 0
    assert L.time_diff_seconds(1 + 3_000_000_000_000, 1) == 2147483647
    assert L.entry_time_ms(S, 2) == S + 2000


# -- putKey / selectPhyOffset --------------------------------------------------------------------
def test_behaviour_50_default_size_file_byte_for_byte(tmp_path, opened):
    path = tmp_path / "20261122051107550"
    f = new_file(opened, path, L.DEFAULT_SLOTS, L.DEFAULT_ENTRIES)
    assert os.path.getsize(path) == 420_000_040
    assert f.index_count == 1 and f.header == L.IndexHeader(0, 0, 0, 0, 0, 1)
    with open(path, "rb") as fh:
        assert fh.read(40) == bytes(40)  # indexCount reaches the disk with the first put
    assert f.put_key(jhash("T", "k1"), 0, S) is True
    assert f.header == L.IndexHeader(S, S, 0, 0, 1, 2)
    f.flush()
    with open(path, "rb") as fh:
        assert struct.unpack(">qqqqii", fh.read(40)) == (S, S, 0, 0, 1, 2)
        fh.seek(10_157_820)
        assert struct.unpack(">i", fh.read(4)) == (1,)
        fh.seek(20_000_040)
        assert fh.read(20) == bytes(20)
        assert struct.unpack(">iqii", fh.read(20)) == (2539445, 0, 0, 0)
    assert os.stat(path).st_blocks * 512 < 1 << 20
    assert f.select(2539445, 32, 0, LONG_MAX) == [(0, S)]
    assert f.verify() is None
    f.close()
    g = IndexFile.load(str(path), read_only=True)
    opened.append(g)
    assert (g.slots, g.entries) == (5_000_000, 20_000_000)
    assert g.header == L.IndexHeader(S, S, 0, 0, 1, 2)
    assert g.read_entry(1) == (2539445, 0, 0, 0)


def test_new_file_header_on_disk_after_flush(tmp_path, opened):
    f = new_file(opened, tmp_path / "a", 4, 5, prev_end_phys_offset=900, prev_end_timestamp=S)
    assert f.header == L.IndexHeader(S, S, 900, 900, 0, 1)
    assert (tmp_path / "a").read_bytes()[:40] == L.pack_header(L.IndexHeader(S, S, 900, 900, 0, 0))
    f.flush()
    assert (tmp_path / "a").read_bytes()[:40] == L.pack_header(L.IndexHeader(S, S, 900, 900, 0, 1))
    assert f.select(0, 10, 0, LONG_MAX) == []
    assert f.verify() is None


def test_behaviour_51_five_entries_hold_four(tmp_path, opened):
    first = new_file(opened, tmp_path / "1", 4, 5)
    keys = ["k1", "k2", "k3", "k4", "k5"]
    for n, key in enumerate(keys[:4]):
        assert first.put_key(jhash("T", key), 100 * n, S + 1000 * n) is True
    assert first.is_full() and first.index_count == 5
    assert first.put_key(jhash("T", "k5"), 400, S + 4000) is False
    assert first.header == L.IndexHeader(S, S + 3000, 0, 300, first.hash_slot_count, 5)
    second = new_file(opened, tmp_path / "2", 4, 5, prev_end_phys_offset=first.end_phys_offset,
                      prev_end_timestamp=first.end_timestamp)
    assert second.put_key(jhash("T", "k5"), 400, S + 4000) is True
    assert second.index_count == 2 and not second.is_full()
    assert second.header == L.IndexHeader(S + 4000, S + 4000, 400, 400, 1, 2)
    found = {}
    for key in keys:
        for f in (second, first):
            for phys, _t in f.select(jhash("T", key), 64, 0, LONG_MAX):
                found[key] = phys
    assert found == {"k1": 0, "k2": 100, "k3": 200, "k4": 300, "k5": 400}
    assert first.verify() is None and second.verify() is None


def test_behaviour_49_second_granularity(tmp_path, opened):
    f = new_file(opened, tmp_path / "i", 8, 16)
    f.put_key(jhash("T", "k1"), 0, S)
    f.put_key(jhash("T", "k2"), 300, S + 2500)
    assert f.read_entry(2)[2] == 2
    assert f.select(jhash("T", "k2"), 32, S + 2400, S + 3000) == []
    assert f.select(jhash("T", "k2"), 32, S + 2000, S + 3000) == [(300, S + 2000)]
    assert f.select(jhash("T", "k1"), 32, S, S) == [(0, S)]


def test_first_put_after_rollover_measures_from_previous_end(tmp_path, opened):
    prev_end = S
    f = new_file(opened, tmp_path / "i", 8, 16, prev_end_timestamp=prev_end,
                 prev_end_phys_offset=5000)
    f.put_key(7, 6000, S + 1700)
    f.put_key(7, 6100, S + 2900)
    assert f.begin_timestamp == S + 1700 and f.begin_phys_offset == 6000
    assert [f.read_entry(1)[2], f.read_entry(2)[2]] == [1, 1]
    assert f.select(7, 32, 0, LONG_MAX) == [(6100, S + 2700), (6000, S + 2700)]
    g = new_file(opened, tmp_path / "j", 8, 16, prev_end_timestamp=S)
    g.put_key(7, 0, S + 2000)
    g.put_key(7, 100, S + 2100)
    assert g.select(7, 32, 0, LONG_MAX) == [(100, S + 2000), (0, S + 4000)]
    assert g.select(7, 32, S + 3000, LONG_MAX) == []


def test_collisions_in_one_slot_compare_stored_hashes(tmp_path, opened):
    f = new_file(opened, tmp_path / "i", 4, 16)
    for n, h in enumerate([1, 5, 9, 5, 13, 1]):
        assert f.put_key(h, 10 * n, S)
    assert f.hash_slot_count == 1 and f.slot_value(1) == 6
    assert [f.read_entry(i)[3] for i in range(1, 7)] == [0, 1, 2, 3, 4, 5]
    assert f.select(5, 32, 0, LONG_MAX) == [(30, S), (10, S)]
    assert f.select(1, 32, 0, LONG_MAX) == [(50, S), (0, S)]
    assert f.select(13, 32, 0, LONG_MAX) == [(40, S)]
    assert f.select(17, 32, 0, LONG_MAX) == []
    assert f.select(2, 32, 0, LONG_MAX) == []
    assert f.verify() is None


def test_equal_hashes_cannot_be_told_apart(tmp_path, opened):
    f = new_file(opened, tmp_path / "i", 32, 16)
    f.put_key(jhash("T", "Aa"), 0, S)
    f.put_key(jhash("T", "BB"), 100, S)
    assert f.select(jhash("T", "Aa"), 32, 0, LONG_MAX) == [(100, S), (0, S)]
    assert f.select(jhash("U", "Aa"), 32, 0, LONG_MAX) == []


def test_chain_is_newest_first_and_max_num_is_honoured(tmp_path, opened):
    f = new_file(opened, tmp_path / "i", 8, 32)
    for n in range(10):
        f.put_key(3, 100 * n, S + 1000 * n)
    assert f.select(3, 3, 0, LONG_MAX) == [(900, S + 9000), (800, S + 8000), (700, S + 7000)]
    assert f.select(3, 1, 0, LONG_MAX) == [(900, S + 9000)]
    assert f.select(3, 0, 0, LONG_MAX) == []
    assert len(f.select(3, 64, 0, LONG_MAX)) == 10
    assert f.select(3, 64, S + 2000, S + 4000) == [(400, S + 4000), (300, S + 3000), (200, S + 2000)]


def test_walk_stops_at_the_first_entry_older_than_begin(tmp_path, opened):
    f = new_file(opened, tmp_path / "i", 8, 32)
    f.put_key(3, 0, S)
    f.put_key(3, 100, S + 5000)
    f.put_key(3, 200, S + 1000)
    f.put_key(3, 300, S + 6000)
    assert f.select(3, 32, S + 4000, LONG_MAX) == [(300, S + 6000)]
    assert f.select(3, 32, 0, LONG_MAX) == [(300, S + 6000), (200, S + 1000),
                                            (100, S + 5000), (0, S)]


def test_read_only_file_rejects_puts(tmp_path, opened):
    f = new_file(opened, tmp_path / "i", 4, 5)
    f.put_key(1, 0, S)
    f.close()
    g = IndexFile.load(str(tmp_path / "i"), 4, 5, read_only=True)
    opened.append(g)
    with pytest.raises(MQStoreError, match="read-only"):
        g.put_key(1, 10, S)
    with pytest.raises(ValueError, match="key_hash -1"):
        new_file(opened, tmp_path / "j", 4, 5).put_key(-1, 0, S)


def test_destroy_removes_the_file(tmp_path):
    f = IndexFile.create(str(tmp_path / "i"), 4, 5)
    f.put_key(1, 0, S)
    f.destroy()
    assert not (tmp_path / "i").exists()


KEYS = ["a", "b", "c", "d", "Aa", "BB", "k1", "订单-1", "用户😀"]


@settings(max_examples=60, deadline=None)
@given(
    puts=st.lists(st.tuples(st.sampled_from(KEYS), st.integers(0, 2500)), min_size=0, max_size=40),
    prev_end=st.sampled_from([0, S - 3300]),
    queries=st.lists(st.tuples(st.sampled_from(KEYS + ["zz"]), st.integers(0, 8),
                               st.integers(-1000, 60_000), st.integers(0, 60_000)), max_size=12),
)
def test_select_matches_a_plain_oracle(puts, prev_end, queries):
    """The oracle walks a plain list newest first within the key's slot, stopping at the
    first entry older than ``begin``: after a rollover the first entry's time can be later
    than the next ones' (see spec §5), and that entry is then out of reach."""
    entries = 32
    with tempfile.TemporaryDirectory() as d:
        f = IndexFile.create(os.path.join(d, "i"), 3, entries, prev_end_timestamp=prev_end)
        oracle: list[tuple[int, int, int]] = []
        ts, begin = S, 0
        for n, (key, step) in enumerate(puts):
            ts += step
            ok = f.put_key(jhash("T", key), 1000 * n, ts)
            assert ok == (len(oracle) < entries - 1)
            if not ok:
                continue
            if not oracle:
                base = prev_end
                diff = (ts - base) // 1000 if base > 0 else 0
                begin = ts
                oracle.append((jhash("T", key), 1000 * n, ts + diff * 1000))
            else:
                oracle.append((jhash("T", key), 1000 * n, begin + (ts - begin) // 1000 * 1000))
        for key, max_num, lo, hi in queries:
            h = jhash("T", key)
            lo_ms, hi_ms = S + lo, S + lo + hi
            want = []
            for kh, p, t in reversed(oracle):
                if kh % 3 != h % 3:
                    continue
                if len(want) >= max_num:
                    break
                if kh == h and lo_ms <= t <= hi_ms:
                    want.append((p, t))
                if t < lo_ms:
                    break
            assert f.select(h, max_num, lo_ms, hi_ms) == want
        assert f.index_count == len(oracle) + 1
        assert f.verify() is None
        f.destroy()


@pytest.mark.parametrize("chunk", [1 << 20, 2])
def test_verify_reports_corruption(tmp_path, opened, monkeypatch, chunk):
    """The same answers whether the entries are checked at once or two at a time (chains
    and the newest entry of a slot then cross chunks)."""
    monkeypatch.setattr(index_file, "_VERIFY_CHUNK", chunk)
    f = new_file(opened, tmp_path / "good", 4, 8)
    for n, h in enumerate([1, 5, 2, 9, 3]):
        f.put_key(h, 10 * n, S + 1000 * n)
    f.close()
    good = (tmp_path / "good").read_bytes()
    pos1 = L.entry_position(4, 1)

    def damaged(name, at, fmt, value):
        raw = bytearray(good)
        struct.pack_into(fmt, raw, at, value)
        (tmp_path / name).write_bytes(bytes(raw))
        g = IndexFile.load(str(tmp_path / name), 4, 8)
        opened.append(g)
        return g.verify()

    assert IndexFile.load(str(tmp_path / "good"), 4, 8, read_only=True).verify() is None
    assert "indexCount 9 outside [0, 8]" in damaged("a", L.INDEX_COUNT_AT, ">i", 9)
    assert "indexCount -3 outside [0, 8]" in damaged("b", L.INDEX_COUNT_AT, ">i", -3)
    assert "hashSlotCount 5 outside [0, 4]" in damaged("c", L.HASH_SLOT_COUNT_AT, ">i", 5)
    assert "hashSlotCount 2 but 3 slots are in use" in damaged("d", L.HASH_SLOT_COUNT_AT, ">i", 2)
    assert "slot 1 holds 7, outside [0, 5]" in damaged("e", L.slot_position(1), ">i", 7)
    assert "slot 2 holds -1, outside [0, 5]" in damaged("f", L.slot_position(2), ">i", -1)
    assert "slot 1 holds 1, newest entry there is 4" in damaged("g", L.slot_position(1), ">i", 1)
    assert "entry 3: prevIndex 3 is not in [0, own number)" in damaged(
        "h", L.entry_position(4, 3) + 16, ">i", 3)
    assert "entry 2: prevIndex 4 is not in [0, own number)" in damaged(
        "i", L.entry_position(4, 2) + 16, ">i", 4)
    assert "entry 1: phys offset -1 is negative" in damaged("j", pos1 + 4, ">q", -1)
    assert "entry 4 chains to entry 3 in another slot" in damaged(
        "k", L.entry_position(4, 4) + 16, ">i", 3)
    assert "header phys range [0, 99]" in damaged("l", L.END_PHYS_OFFSET_AT, ">q", 99)
    assert "entry 2: key hash -5 is negative" in damaged("m", L.entry_position(4, 2), ">i", -5)


def test_select_survives_a_chain_cycle(tmp_path, opened):
    f = new_file(opened, tmp_path / "i", 4, 8)
    for n in range(3):
        f.put_key(1, 10 * n, S)
    f.close()
    raw = bytearray((tmp_path / "i").read_bytes())
    struct.pack_into(">i", raw, L.entry_position(4, 1) + 16, 3)
    (tmp_path / "i").write_bytes(bytes(raw))
    f = IndexFile.load(str(tmp_path / "i"), slots=4, read_only=True)
    opened.append(f)
    # Chains only lead to earlier entries: the walk stops at the link back up to entry 3.
    assert f.select(1, 100, 0, LONG_MAX) == [(20, S), (10, S), (0, S)]
    assert "entry 1: prevIndex 3" in f.verify()


# -- RocketMQ 4.9.8's own index files ----------------------------------------------------------
REAL_HEADERS = {
    "20261122051107550": (1795324267531, 1795324267677, 0, 29040, 31, 128),
    "20261122051107680": (1795324267680, 1795324267780, 29290, 123329, 31, 128),
    "20261122051107780": (1795324267780, 1795324269192, 124021, 166472, 31, 128),
    "20261122051109196": (1795324269192, 1795324269289, 166472, 221900, 31, 128),
    "20261122051109290": (1795324269289, 1795324270700, 221900, 315285, 32, 128),
    "20261122051110703": (1795324270700, 1795324270789, 315285, 366280, 31, 120),
}


@pytest.fixture(scope="module")
def index_dir(rocketmq_dir):
    return rocketmq_dir / "index"


@pytest.fixture(scope="module")
def real_files(index_dir):
    files = [IndexFile.load(str(p), read_only=True) for p in sorted(index_dir.iterdir())]
    yield files
    for f in files:
        f.close()


def message_keys(m) -> list[str]:
    """What RocketMQ's buildIndex puts for a message: UNIQ_KEY first, then each non-empty key."""
    keys = [m["uniqKey"]] if m["uniqKey"] else []
    return keys + [k for k in (m["keys"] or "").split(" ") if k]


def test_real_headers_and_sizes(index_dir, real_files):
    assert [os.path.basename(f.path) for f in real_files] == sorted(REAL_HEADERS)
    for f in real_files:
        assert os.path.getsize(f.path) == 2728
        assert (f.slots, f.entries) == L.counts_for_size(2728) == (32, 128)
        assert tuple(f.header) == REAL_HEADERS[os.path.basename(f.path)]
        assert tuple(f.stored_header) == REAL_HEADERS[os.path.basename(f.path)]
        assert f.verify() is None
        assert f.read_entry(0) == (0, 0, 0, 0)
    assert [f.is_full() for f in real_files] == [True] * 5 + [False]
    assert sum(f.index_count - 1 for f in real_files) == 754


def test_every_real_message_key_is_found(real_files, manifest):
    checked = 0
    for m in manifest["messages"]:
        for key in message_keys(m):
            h = jhash(m["topic"], key)
            hits = [p for f in real_files for p, _t in f.select(h, 128, 0, LONG_MAX)]
            assert m["commitLogOffset"] in hits, (m["index"], key)
            times = [t for f in real_files for p, t in f.select(h, 128, 0, LONG_MAX)
                     if p == m["commitLogOffset"]]
            assert all(abs(t - m["storeTimestamp"]) < 2000 for t in times), (m["index"], key)
            checked += 1
    assert checked == 754
    assert sum(1 for m in manifest["messages"] if m["uniqKey"]) == 287


def test_replaying_the_messages_rebuilds_the_real_files_byte_for_byte(tmp_path, index_dir,
                                                                       manifest):
    names = sorted(REAL_HEADERS)
    made: list[IndexFile] = []
    try:
        current = IndexFile.create(str(tmp_path / names[0]), 32, 128)
        made.append(current)
        for m in sorted(manifest["messages"], key=lambda m: m["commitLogOffset"]):
            assert m["commitLogOffset"] >= current.end_phys_offset
            for key in message_keys(m):
                h = jhash(m["topic"], key)
                while not current.put_key(h, m["commitLogOffset"], m["storeTimestamp"]):
                    current = IndexFile.create(
                        str(tmp_path / names[len(made)]), 32, 128,
                        prev_end_phys_offset=current.end_phys_offset,
                        prev_end_timestamp=current.end_timestamp)
                    made.append(current)
    finally:
        for f in made:
            f.close()
    assert len(made) == 6
    for name in names:
        assert (tmp_path / name).read_bytes() == (index_dir / name).read_bytes(), name


def query_offsets(files, topic, key, max_num, begin, end):
    """RocketMQ IndexService.queryOffset over ``files`` (oldest first)."""
    max_num = min(max_num, 64)
    h = jhash(topic, key)
    offsets: list[int] = []
    for f in reversed(files):
        if f.overlaps(begin, end):
            offsets += [p for p, _t in f.select(h, max_num - len(offsets), begin, end)]
        if f.begin_timestamp < begin or len(offsets) >= max_num:
            break
    return offsets


def test_query_message_answers_match_rocketmq(real_files, manifest):
    store_ts = {m["commitLogOffset"]: m["storeTimestamp"] for m in manifest["messages"]}
    cases = manifest["expected"]["queryMessage"]
    for case in cases:
        got: list[int] = []
        last = case["end"]
        for _round in range(3):
            offsets = sorted(query_offsets(real_files, case["topic"], case["key"],
                                           case["maxNum"], case["begin"], last))
            if not offsets:
                break
            last = store_ts[offsets[0]]
            got += offsets
            if got or last < case["begin"]:
                break
        want = [m["commitLogOffset"] for m in case["messages"]]
        assert got == want, case
        if not want:
            continue
        assert real_files[-1].end_timestamp == case["indexLastUpdateTimestamp"]
        assert real_files[-1].end_phys_offset == case["indexLastUpdatePhyoffset"]
    assert len(cases) == 87


def test_verify_reports_a_damaged_copy_of_a_real_file(tmp_path, index_dir, opened):
    src = index_dir / "20261122051110703"
    for name, at, value, want in [
        ("count", L.INDEX_COUNT_AT, b"\x00\x00\x01\x00", "indexCount 256 outside [0, 128]"),
        ("slots", L.slot_position(0), b"\x00\x00\x00\x78", "slot 0 holds 120, outside [0, 119]"),
        ("prev", L.entry_position(32, 50) + 16, b"\x00\x00\x00\x33",
         "entry 50: prevIndex 51 is not in [0, own number)"),
        ("phys", L.entry_position(32, 7) + 4, b"\xff" * 8, "entry 7: phys offset -1 is negative"),
    ]:
        copy = tmp_path / name
        shutil.copyfile(src, copy)
        raw = bytearray(copy.read_bytes())
        raw[at:at + len(value)] = value
        copy.write_bytes(bytes(raw))
        g = IndexFile.load(str(copy), read_only=True)
        opened.append(g)
        assert want in g.verify(), name


# -- batch puts --------------------------------------------------------------------------------


@settings(max_examples=60, deadline=None)
@given(
    keys=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 5000)), min_size=1, max_size=40),
    split=st.integers(0, 40),
    prev_end=st.sampled_from([0, 1_700_000_000_000]),
)
def test_put_keys_equals_sequential_put_key(tmp_path_factory, keys, split, prev_end):
    d = tmp_path_factory.mktemp("batch")
    slots, entries = 5, 24
    one = IndexFile.create(str(d / "one"), slots, entries, prev_end_phys_offset=prev_end // 1000,
                           prev_end_timestamp=prev_end)
    many = IndexFile.create(str(d / "many"), slots, entries, prev_end_phys_offset=prev_end // 1000,
                            prev_end_timestamp=prev_end)
    base = 1_700_000_000_000
    hashes = np.array([h for h, _ in keys], dtype=np.int64)
    times = base + np.cumsum([t for _, t in keys])
    phys = np.arange(len(keys), dtype=np.int64) * 100
    expected = 0
    for h, p, t in zip(hashes.tolist(), phys.tolist(), times.tolist()):
        expected += one.put_key(h, p, t)
    got = many.put_keys(hashes[:split], phys[:split], times[:split])
    got += many.put_keys(hashes[split:], phys[split:], times[split:])
    assert got == expected
    one.flush()
    many.flush()
    assert bytes(one._mm) == bytes(many._mm)
    assert one.header == many.header
    one.close()
    many.close()

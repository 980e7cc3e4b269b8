"""The time-column search (``mqstore.read.time_cache``) answers exactly as the probing search did.

``probing_offset_by_time`` (one commit-log read per probe, as spec 10.7 describes the search)
defines the answers; the behaviour and fixture tests pin it. Every answer of ``offset_by_time``
is compared with it, over stores built unit by unit (fillers,
cleanup, cut queues, units whose records cannot be read, times going backwards, several
consume-queue files) and over real stores (repeated timestamps on a manual clock, cleanup,
appends while a dispatch worker in another process builds the queues, read-only followers).
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import sys
import tempfile
import threading
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import Message, MessageBatch, MessageStore, PutStatus, load_config
from mqstore.read import time_cache as time_index
from mqstore.format.cq_unit import CQ_DTYPE, CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.hosts import Host
from mqstore.format.record import encode_record
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.read.time_search import offset_by_time
from mqstore.read.time_search import probing_offset_by_time as reference

LOWER, UPPER = "lower", "upper"
BOUNDS = (LOWER, UPPER)


# -- stores built unit by unit ---------------------------------------------------------------
V4 = Host(bytes([10, 0, 0, 1]), 7)
V6 = Host(bytes(15) + b"\x01", 7)
STORE_HOST = Host(bytes([10, 0, 0, 2]), 10911)


class Built:
    """A commit log and consume queues written directly: any unit may name anything."""

    def __init__(self, root: str, segment_bytes: int, file_units: int) -> None:
        self.root = root
        self.log = CommitLog(os.path.join(root, "commitlog"), segment_bytes)
        self.file_bytes = file_units * CQ_UNIT_SIZE
        self.queues: dict[int, ConsumeQueue] = {}
        self.records: dict[int, list[int]] = {}  # queue -> phys offsets of its records
        self.times: set[int] = set()

    def queue(self, q: int) -> ConsumeQueue:
        if q not in self.queues:
            self.queues[q] = ConsumeQueue(self.root, "T", q, self.file_bytes)
            self.records[q] = []
        return self.queues[q]

    def record(self, q: int, store_ts: int, v6: bool = False, body: int = 8) -> None:
        """A record stored at ``store_ts`` and its unit."""
        cq = self.queue(q)
        fields = dict(queue_id=q, flag=0, queue_offset=cq.max_offset, sysflag=0,
                      born_timestamp=store_ts, born_host=V6 if v6 else V4,
                      store_timestamp=store_ts, store_host=STORE_HOST, reconsume_times=0,
                      prepared_tx_offset=0, body=b"b" * body, topic=b"T", properties=b"")
        size = len(encode_record(phys_offset=0, **fields))
        seg = self.log.reserve_locked(size)
        phys = seg.start + seg.wrote
        seg.write(encode_record(phys_offset=phys, **fields))
        self.records[q].append(phys)
        self.times.add(store_ts)
        self.unit(q, phys, size)

    def unit(self, q: int, phys: int, size: int) -> None:
        units = np.zeros(1, dtype=CQ_DTYPE)
        units["phys_offset"], units["size"] = phys, size
        self.queue(q)._append(units)

    def fillers(self, q: int, count: int) -> None:
        for _ in range(count):
            self.unit(q, 0, FILLER_SIZE)

    def cleanup(self, count: int, fix: str) -> None:
        """Delete the oldest commit-log segments (never the last); ``fix``: what the queues
        are told (nothing, as a follower that has not looked yet; their min offset; their
        files below the new minimum)."""
        count = min(count, len(self.log.segments.segments) - 1)
        if count <= 0:
            return
        self.log.segments.drop_first(count)
        for cq in self.queues.values():
            if fix == "correct":
                cq.correct_min_offset(self.log.min_offset)
            elif fix == "delete":
                cq.delete_files_below(self.log.min_offset)
                cq.correct_min_offset(self.log.min_offset)

    def timestamps(self, extra=(), sample: int | None = None) -> list[int]:
        """Every stored time and its neighbours, and a few beyond (``sample`` of them)."""
        ts_set = {0, 1, -1, -2, -3, 1 << 62, *extra}
        for t in self.times:
            ts_set.update((t - 1, t, t + 1))
        ts_list = sorted(ts_set)
        return ts_list if sample is None else random.Random(sample).sample(
            ts_list, min(sample, len(ts_list)))

    def check(self, extra=(), sample: int | None = None) -> int:
        """Compare every queue's answers (and an unknown queue's) with the reference; returns
        how many of them the column gave."""
        return self._check(extra, sample)[0]

    def _check(self, extra=(), sample: int | None = None) -> tuple[int, int]:
        """(answers the column gave, answers it could give: for ts >= 0 in queues with
        units)."""
        ts_list = self.timestamps(extra, sample)
        given = possible = 0
        for cq in [*self.queues.values(), None]:
            with_units = cq is not None and any(s.wrote >= CQ_UNIT_SIZE
                                                for s in cq.segments.segments)
            for ts in ts_list:
                for b in BOUNDS:
                    want = reference(self.log, cq, ts, b)
                    assert offset_by_time(self.log, cq, ts, b) == want, (ts, b)
                    given += time_index.search(self.log, cq, ts, b == UPPER) is not None
                    possible += with_units and ts >= 0
        return given, possible

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
        self.log.close()


def built(segment_bytes=1024, file_units=4):
    root = tempfile.mkdtemp(prefix="mqstore-time-")
    return Built(root, segment_bytes, file_units), root


def _remove(root: str) -> None:
    shutil.rmtree(root, ignore_errors=True)


QUEUE = st.integers(0, 2)
# What a store does: appends (times repeating, v4 and v6 born hosts), fillers, cleanup, min
# offsets moving, queues cut.
BENIGN = [
    *[st.tuples(st.just("put"), QUEUE, st.integers(0, 3), st.booleans(), st.integers(0, 60))] * 8,
    st.tuples(st.just("fillers"), QUEUE, st.integers(1, 5)),
    st.tuples(st.just("cleanup"), st.integers(1, 3),
              st.sampled_from(["none", "correct", "delete"])),
    st.tuples(st.just("min"), QUEUE, st.integers(0, 60)),
    st.tuples(st.just("truncate"), QUEUE, st.integers(0, 60)),
    st.tuples(st.just("query")),
]
# What damage, clocks and followers add: times going back, units naming odd bytes or records
# not yet readable, a segment missing.
NASTY = [
    st.tuples(st.just("back"), QUEUE, st.integers(1, 6)),
    st.tuples(st.just("raw"), QUEUE, st.integers(-5, -1)),
    st.tuples(st.just("dup"), QUEUE, st.integers(0, 60)),
    st.tuples(st.just("stray"), QUEUE, st.integers(0, 1 << 14)),
    st.tuples(st.just("edge"), QUEUE, st.integers(0, 8), st.integers(1, 80)),
    st.tuples(st.just("hole"), st.integers(0, 8)),
    st.tuples(st.just("ahead"), QUEUE),
]


def apply(b: Built, op, clock: list[int]) -> None:
    kind = op[0]
    if kind == "put":
        clock[0] += op[2]
        b.record(op[1], clock[0], v6=op[3], body=op[4])
    elif kind == "back":  # the clock went backwards
        clock[0] -= op[2]
        b.record(op[1], clock[0])
    elif kind == "fillers":
        b.fillers(op[1], op[2])
    elif kind == "raw":  # a record stored with a negative time
        b.record(op[1], op[2])
    elif kind == "dup":  # a unit naming an earlier record again: phys offsets go back
        phys = b.records.get(op[1])
        if phys:
            b.unit(op[1], phys[op[2] % len(phys)], 100)
    elif kind == "stray":  # a unit naming any byte: inside a record, a blank, past the end
        b.unit(op[1], max(0, b.log.min_offset) + op[2], 100)
    elif kind == "edge":  # a head in a segment's last bytes, or a timestamp in the next one
        segs = b.log.segments.segments
        if segs:
            b.unit(op[1], segs[op[2] % len(segs)].end - op[3], 100)
    elif kind == "hole":  # a segment missing between others
        _hole(b.log, op[1])
    elif kind == "ahead":  # dispatched before the log shows the record
        b.unit(op[1], b.log.max_offset + 8, 100)
    elif kind == "cleanup":
        b.cleanup(op[1], op[2])
    elif kind == "min":  # a min offset anywhere in the queue (a follower lagging, or not)
        cq = b.queue(op[1])
        cq.min_logic_offset = min(op[2], cq.max_offset) * CQ_UNIT_SIZE
    elif kind == "truncate":
        phys = b.records.get(op[1]) or [0]
        b.queue(op[1]).truncate_to_phys(phys[min(op[2], len(phys) - 1)])
    elif kind == "query":
        b.check()


def _hole(log, i: int) -> None:
    segs = log.segments.segments
    if len(segs) > 2:
        victim = segs[1 + i % (len(segs) - 2)]
        log.segments.segments = [s for s in segs if s is not victim]
        victim.close()


@contextlib.contextmanager
def gathering(few: int):
    """New units gathered one by one up to ``few`` of them, else in vectorised passes."""
    saved = time_index._FEW_UNITS
    time_index._FEW_UNITS = few
    try:
        yield
    finally:
        time_index._FEW_UNITS = saved


# Both ways of gathering, each against the probing search.
GATHERING = pytest.mark.parametrize("few", [0, 1 << 30], ids=["vectorised", "one_by_one"])
# And the default: a few new units one by one, more in vectorised passes.
EVERY_GATHERING = pytest.mark.parametrize("few", [0, time_index._FEW_UNITS, 1 << 30],
                                          ids=["vectorised", "mixed", "one_by_one"])


@GATHERING
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=st.lists(st.one_of(*BENIGN), max_size=80),
       segment_bytes=st.sampled_from([512, 1024, 4096]), file_units=st.integers(1, 9))
def test_store_operations_are_answered_from_the_column(few, ops, segment_bytes, file_units):
    """Same answers as the probing search, all of them (ts >= 0) from the column."""
    b, root = built(segment_bytes, file_units)
    try:
        with gathering(few):
            clock = [1_000]
            for op in ops:
                apply(b, op, clock)
                if op[0] == "query":
                    given, possible = b._check()
                    assert given == possible
            given, possible = b._check()
            assert given == possible
    finally:
        b.close()
        _remove(root)


@GATHERING
@settings(max_examples=60, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(ops=st.lists(st.one_of(*BENIGN, *BENIGN, *NASTY), max_size=80),
       segment_bytes=st.sampled_from([512, 1024, 4096]), file_units=st.integers(1, 9))
def test_same_answers_as_the_probing_search(few, ops, segment_bytes, file_units):
    b, root = built(segment_bytes, file_units)
    try:
        with gathering(few):
            clock = [1_000]
            for op in ops:
                apply(b, op, clock)
            b.check()
    finally:
        b.close()
        _remove(root)


@GATHERING
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(steps=st.lists(st.tuples(st.integers(0, 4), st.integers(1, 200)), min_size=1,
                      max_size=40),
       file_units=st.sampled_from([7, 64, 100, 1000]))
def test_monotone_queues_are_answered_from_the_column(few, steps, file_units):
    """Times that never go backwards, repeated, across files and strides: every answer for a
    timestamp >= 0 comes from the column (none from the probing search), and is its answer."""
    b, root = built(1 << 16, file_units)
    try:
        with gathering(few):
            t = 5_000
            for dt, count in steps:
                t += dt
                for _ in range(count):
                    b.record(0, t)
            assert b.check() == 2 * sum(ts >= 0 for ts in b.timestamps())
    finally:
        b.close()
        _remove(root)


# -- targeted cases --------------------------------------------------------------------------
@pytest.fixture
def small():
    b, root = built(1 << 16, 500)
    yield b
    b.close()
    _remove(root)


def test_appends_are_gathered_alone(small, monkeypatch):
    """Only what was appended since the last search is read: a few units one by one, more in
    one vectorised pass."""
    for i in range(1000):
        small.record(0, 10_000 + i // 3)
    small.check()
    read = []
    one, many = time_index._record_time, time_index._record_times
    monkeypatch.setattr(time_index, "_record_time",
                        lambda log, phys: read.append(1) or one(log, phys))
    monkeypatch.setattr(time_index, "_record_times",
                        lambda log, phys: read.append(len(phys)) or many(log, phys))
    for n, expected in ((10, [1] * 10), (200, [200])):
        for i in range(n):
            small.record(0, 20_000 + i)
        assert offset_by_time(small.log, small.queues[0], 20_005, LOWER) == \
            len(small.records[0]) - n + 5
        assert read == expected
        read.clear()
        small.check()
        assert read == []


def test_memory_is_under_one_percent_of_the_units(small):
    rng = random.Random(3)
    t = 1_700_000_000_000
    for _ in range(20_000):
        t += rng.choice((0, 0, 1, 5))
        small.record(0, t, body=0)
    small.check(sample=300)
    files = time_index._indexes[id(small.queues[0])][1].files
    column = sum(len(ft.times) * ft.times.itemsize for ft in files)
    assert all(ft.times.typecode == "i" for ft in files)
    assert 0 < column <= 0.01 * 20_000 * CQ_UNIT_SIZE


def test_where_times_repeat_a_search_reads_one_record(small, monkeypatch):
    """Messages stored together share a time (a batch): a search skips the units of its
    stride that share the stride's first time and reads the record after them, which here
    already has the time sought, instead of bisecting the stride (five reads)."""
    for i in range(600):
        small.record(0, 10_000 + i // 70)  # times change inside strides, never at their start
    small.check()
    cq = small.queues[0]
    with counting_reads(monkeypatch) as reads:
        for g in range(1, 9):
            for ts, bound, want in ((10_000 + g, LOWER, 70 * g),
                                    (10_000 + g - 1, UPPER, 70 * g - 1),
                                    (10_000 + g, UPPER, min(70 * g + 69, 599))):
                reads.clear()
                assert time_index.search(small.log, cq, ts, bound == UPPER) == want, (ts, bound)
                assert len(reads) <= 1, (ts, bound, reads)


def test_times_spanning_more_than_int32_milliseconds(small):
    t = 1_000
    for i in range(1500):
        t += (1 << 31) if i % 700 == 0 else 1
        small.record(0, t)
    assert small.check(sample=300) > 0
    assert any(ft.times.typecode == "q" for ft in time_index._indexes[id(small.queues[0])][1].files)


def test_a_file_with_times_going_back_is_left_to_the_probing_search(small):
    for i in range(600):  # file 0: 500 units, one step back; file 1: monotone
        small.record(0, 1_000 + i - (50 if 200 <= i < 210 else 0))
    small.check()
    files = time_index._indexes[id(small.queues[0])][1].files
    assert [ft.monotone for ft in files] == [False, True]
    assert len(files[0].times) == 0
    assert time_index.search(small.log, small.queues[0], 1_300, False) is None
    assert time_index.search(small.log, small.queues[0], 1_550, False) == 550


def test_cleanup_then_a_cut_queue_written_over_again(small):
    for i in range(1200):
        small.record(i % 2, 2_000 + i)
    small.check(sample=400)
    small.cleanup(1, "none")  # nothing moved in the queues: the first units name removed records
    small.check(sample=400)
    cq = small.queues[0]
    segments = cq.segments.segments
    cq.truncate_to_phys(small.records[0][590])
    for i in range(10):  # as many units as were cut, in the same file: only their contents differ
        small.record(0, 9_000 + i)
    assert cq.segments.segments is segments and cq.max_offset == 600
    small.check(sample=400)
    assert offset_by_time(small.log, cq, 9_000, LOWER) == 590


def test_unreadable_units_in_earlier_files(small):
    """Units whose record cannot be read (its head in a segment's last bytes, its timestamp
    past the segment's end, in a missing segment) in files before the last one."""
    b, root = built(1024, 6)
    try:
        clock = 100
        for k in list(range(1, 80, 3)) + [None] * 30:
            clock += 1
            b.record(0, clock)
            if k is not None and len(b.log.segments.segments) > 1:
                b.unit(0, b.log.segments.segments[0].end - k, 100)
        b.check()
        _hole(b.log, 0)
        b.record(0, clock + 1)
        b.check()
    finally:
        b.close()
        _remove(root)


def test_negative_timestamps_are_left_to_the_probing_search():
    b, root = built(1024, 50)
    try:
        for i in range(300):
            b.record(0, 7_000 + i // 2)
        b.cleanup(3, "none")  # min offset still at 0, its first units removed
        assert b.log.min_offset > 0
        b.check()
        for ts in (-1, -2, -3):
            for upper in (False, True):
                assert time_index.search(b.log, b.queues[0], ts, upper) is None
    finally:
        b.close()
        _remove(root)


def test_an_unreadable_unit_before_the_last_file():
    """LOWER picks a file by its last unit's time, read past an unreadable one."""
    b, root = built(1024, 6)
    try:
        for t in range(1, 12):
            b.record(0, 100 + t)
            if t == 2:
                b.unit(0, b.log.segments.segments[0].end - 4, 100)  # a head cut short
        while len(b.log.segments.segments) < 2:
            b.record(1, 50)
        b.check()
        assert offset_by_time(b.log, b.queues[0], 104, LOWER) == 0  # the probe hits it
    finally:
        b.close()
        _remove(root)


@pytest.mark.parametrize("seed", range(12))
def test_phys_offsets_going_back_then_cleanup(seed):
    """A unit naming an earlier record again, stored at the same time (every record is),
    keeps times from decreasing; once cleanup removes that record its time drops to -2 in the
    middle of the queue."""
    rng = random.Random(seed)
    b, root = built(1024, rng.choice((16, 40, 100)))
    try:
        for _ in range(rng.randint(20, 80)):
            b.record(0, 500)
            if rng.random() < 0.15:
                b.unit(0, b.records[0][rng.randrange(min(5, len(b.records[0])))], 100)
        b.check()
        b.cleanup(1, rng.choice(("none", "correct")))
        b.check()
    finally:
        b.close()
        _remove(root)


def test_v6_born_hosts_fillers_and_min_offsets_anywhere():
    """Every unit read one by one (fillers in strides, a min offset off the strides) names
    records with IPv6 born hosts, whose store time sits 12 bytes further."""
    b, root = built(1 << 16, 100)
    try:
        for i in range(300):
            b.record(0, 40_000 + i // 2, v6=True)
            if i % 7 == 3:
                b.fillers(0, 2)
        cq = b.queues[0]
        for low in (0, 1, 33, 50, 99, 101, 170, 250):
            cq.min_logic_offset = low * CQ_UNIT_SIZE
            assert b.check(sample=120) == 2 * sum(ts >= 0 for ts in b.timestamps(sample=120))
    finally:
        b.close()
        _remove(root)


@pytest.mark.parametrize("fix", ["none", "correct"])
def test_cleanup_ending_anywhere_in_a_stride(fix):
    """Each cleanup moves the log's minimum to another place within a stride, after the times
    of the records it removes were gathered."""
    b, root = built(1024, 1000)
    try:
        for i in range(400):
            b.record(0, 60_000 + i // 3)
        b.check(sample=100)
        while len(b.log.segments.segments) > 1:
            b.cleanup(1, fix)
            b.check(extra=[0, 60_000], sample=100)
    finally:
        b.close()
        _remove(root)


def test_a_segment_closed_under_a_gather_is_not_read():
    """Cleanup in another thread may close a segment the gather is about to read."""
    b, root = built(1024, 100)
    try:
        for i in range(40):
            b.record(0, 100 + i)
        closed = b.log.segments.segments[1]
        closed.close()
        phys = np.array(b.records[0], dtype=np.int64)
        times, ok = time_index._record_times(b.log, phys)
        inside = (phys >= closed.start) & (phys < closed.end)
        assert inside.any() and not ok[inside].any() and ok[~inside].all()
        assert (times[~inside] == 100 + np.flatnonzero(~inside)).all()
    finally:
        b.close()
        _remove(root)


def test_unreadable_record_at_the_tail_until_it_can_be_read(small):
    for i in range(100):
        small.record(0, 3_000 + i)
    seg = small.log.segments.segments[-1]
    small.check(extra=[3_050])
    seg.stage()  # the next records go to a pool buffer: not readable until committed
    for i in range(100, 110):
        small.record(0, 3_000 + i)
    small.check(extra=[3_105])
    assert time_index.search(small.log, small.queues[0], 3_105, False) is None
    seg.set_committed(seg.wrote)
    small.check(extra=[3_105])
    assert time_index.search(small.log, small.queues[0], 3_105, False) == 105


def test_a_record_not_readable_yet_leaves_earlier_files_to_the_column(small):
    """Units written ahead of their records (a follower, a pool writer not committed yet) keep
    the last file from being gathered whole; searches that end in earlier files are still
    answered from the column, the others by the probing search, each as it answers."""
    for i in range(1200):  # files of 500, 500 and 200 units
        small.record(0, 5_000 + i)
    small.unit(0, small.log.max_offset + 8, 100)
    cq = small.queues[0]
    for ts in (5_000, 5_100, 5_499, 5_700):
        for upper in (False, True):
            assert time_index.search(small.log, cq, ts, upper) == ts - 5_000, (ts, upper)
    assert time_index.search(small.log, cq, 6_100, False) is None
    small.check(extra=[5_100, 6_100])


# -- real stores -------------------------------------------------------------------------------
def _put_times(store, clock, times, queue_id=0, topic="T"):
    for t in times:
        clock.now = t
        r = store.put(Message(topic, b"x", tags="A", queue_id=queue_id))
        assert r.status is PutStatus.PUT_OK and r.store_timestamp == t


def _compare_store(store, queues, times):
    ts_set = {0, -1} | {t + d for t in times for d in (-1, 0, 1)}
    for topic, q in queues:
        store.offset_by_time(topic, q, 0)  # a follower's first look maps the queue
        cq = store.consume_queue(topic, q)
        for ts in sorted(ts_set):
            for b in BOUNDS:
                assert store.offset_by_time(topic, q, ts, b) == \
                    reference(store.internals.commit_log, cq, ts, b), (topic, q, ts, b)


def test_store_with_repeated_times_several_files_and_cleanup(make_store, manual_clock):
    store = make_store({"consume_queue": {"file_units": 7}, "commit_log": {"segment_bytes": 2048}})
    rng = random.Random(11)
    t, times = 1_700_000_000_000, []
    for _ in range(30):
        t += rng.choice((0, 1, 1, 7))
        times.append(t)
        if rng.random() < 0.5:  # a batch's messages share its store time
            manual_clock.now = t
            n = rng.randint(1, 12)
            r = store.put_batch(MessageBatch(topic="T", bodies=[b"y"] * n,
                                             queue_ids=[rng.randrange(3) for _ in range(n)]))
            assert r.status is PutStatus.PUT_OK
        else:
            _put_times(store, manual_clock, [t] * rng.randint(1, 4), queue_id=rng.randrange(3))
    store.wait_dispatched()
    queues = [("T", q) for q in range(3)]
    _compare_store(store, queues, times)
    store.delete_expired_segments(force=True, max_segments=5)
    assert store.min_phys_offset > 0
    _compare_store(store, queues, times)


def _check_growing(search, max_offset, t0: int, total: int, done, seed: int, failures,
                   run: int = 1) -> None:
    """Ask for times of messages already in the queue (message i stored at t0 + 2 (i // run))
    while it grows: each answer is known whatever was appended meanwhile."""
    rng, checked = random.Random(seed), 0
    try:
        while not done.is_set() or checked < 200:
            seen = max_offset() // run  # times every message of which is in
            if not seen:
                time.sleep(0.001)
                continue
            k = rng.randrange(seen)
            assert search(t0 + 2 * k, LOWER) == k * run
            assert search(t0 + 2 * k, UPPER) == k * run + run - 1
            assert search(t0 + 2 * k + 1, LOWER) == (k + 1) * run
            assert search(t0 + 2 * k + 1, UPPER) == k * run + run - 1
            assert seen * run <= search(t0 + 2 * total, LOWER) <= total
            checked += 1
    except BaseException as exc:  # reported by the test's thread
        failures.append(exc)


def test_concurrent_appends_with_dispatch_in_another_process(make_store, manual_clock):
    # Several reading threads: each search refreshes the queue view the others read.
    store = make_store({"consume_queue": {"file_units": 50},
                        "commit_log": {"segment_bytes": 64 * 1024}})
    assert store.internals.supervisor is not None  # the queues are written by the dispatch worker
    t0, total = 1_800_000_000_000, 3000
    done = threading.Event()

    def writer():
        try:
            for i in range(total):
                manual_clock.now = t0 + 2 * i
                store.put(Message("T", b"z", queue_id=0))
        finally:
            done.set()

    failures: list = []
    threads = [threading.Thread(target=writer)] + [threading.Thread(
        target=_check_growing,
        args=(lambda ts, b: store.offset_by_time("T", 0, ts, b),
              lambda: store.max_offset("T", 0), t0, total, done, seed, failures))
        for seed in (5, 6, 7)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    store.wait_dispatched()
    _compare_store(store, [("T", 0)], [t0 + 2 * i for i in range(0, total, 37)])


@GATHERING
@pytest.mark.parametrize("run", [1, 45], ids=["distinct", "repeated"])
def test_searches_from_several_threads_while_the_queue_grows(few, run):
    """Searches read a plan of the column while other threads gather into it and plan anew;
    with times repeated, the last stride's run grows under them too."""
    b, root = built(4096, 50 if run == 1 else 500)
    t0, total = 1_800_000_000_000, 3000 - 3000 % run
    done = threading.Event()
    failures: list = []

    def writer():
        try:
            for i in range(total):
                b.record(0, t0 + 2 * (i // run))
                if i % 100 == 0:
                    time.sleep(0.001)  # let the readers in
        finally:
            done.set()

    interval = sys.getswitchinterval()
    try:
        sys.setswitchinterval(1e-6)  # threads switch often, inside searches too
        with gathering(few):
            b.queue(0)
            threads = [threading.Thread(target=writer)] + [threading.Thread(
                target=_check_growing,
                args=(lambda ts, bound: offset_by_time(b.log, b.queues[0], ts, bound),
                      lambda: b.queues[0].max_offset, t0, total, done, seed, failures, run))
                for seed in (5, 6, 7)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            assert not failures, failures
            b.check(sample=200)
    finally:
        sys.setswitchinterval(interval)
        b.close()
        _remove(root)


def test_read_only_follower(tmp_path, manual_clock):
    root = tmp_path / "store"
    cfg = load_config(overrides={
        "commit_log": {"segment_bytes": 4096}, "consume_queue": {"file_units": 30},
        "plugins": {"load_entry_points": False}, "store": {"hash": "java"}})
    with MessageStore.open(root, config=cfg, clock=manual_clock) as writer, \
            MessageStore.open(root, read_only=True) as follower:
        times = [10_000 + i // 4 for i in range(400)]
        _put_times(writer, manual_clock, times[:200])
        writer.wait_dispatched()
        _compare_store(follower, [("T", 0)], times[:200])
        _put_times(writer, manual_clock, times[200:])
        writer.wait_dispatched()
        writer.delete_expired_segments(force=True, max_segments=3)
        deadline = time.monotonic() + 10
        while follower.max_offset("T", 0) < 400:  # it follows the log as it is checked
            assert time.monotonic() < deadline
            time.sleep(0.01)
        _compare_store(follower, [("T", 0)], times)
        assert follower.offset_by_time("T", 0, times[-1], UPPER) == 399


# -- a batch's time giving way to the next inside a stride -----------------------------------
STRIDE = time_index.STRIDE


@contextlib.contextmanager
def counting_reads(monkeypatch):
    """The records' timestamps the column reads (probes and gathering), as a list of where."""
    reads: list[int] = []
    real = time_index._LONG

    class Counting:
        @staticmethod
        def unpack_from(buf, at=0):
            reads.append(at)
            return real.unpack_from(buf, at)

    monkeypatch.setattr(time_index, "_LONG", Counting)
    try:
        yield reads
    finally:
        monkeypatch.setattr(time_index, "_LONG", real)


def _two_timed(times: list[int], b: int, file_units: int) -> bool:
    """Whether the time of offset ``b`` starts inside a stride (of its consume-queue file) that
    holds only it and the time before, and the next stride, in the same file and stored, starts
    with it."""
    local = b % file_units
    first = b - local % STRIDE
    nxt = first + STRIDE
    return (local % STRIDE != 0 and nxt < min(len(times), b - local + file_units)
            and times[first] == times[b - 1] and times[nxt] == times[b])


def _check_boundaries(search, times: list[int], reads: list[int], file_units: int) -> int:
    """Around every offset ``b`` whose time differs from the one before (offset i stored at
    ``times[i]``, never decreasing), the four searches answer as the times say; where the stride
    is two-timed (``_two_timed``) they read no record. Returns how many boundaries were."""
    free = 0
    for b in range(1, len(times)):
        if times[b] == times[b - 1]:
            continue
        cases = ((times[b], LOWER, b), (times[b - 1] + 1, LOWER, b),
                 (times[b - 1], UPPER, b - 1), (times[b] - 1, UPPER, b - 1))
        two = _two_timed(times, b, file_units)
        for ts, bound, want in cases:
            reads.clear()
            assert search(ts, bound) == want, (b, ts, bound, times[b - 1], times[b])
            assert not two or reads == [], (b, ts, bound, reads)
        free += two
    return free


def _batch_times(sizes, t0: int = 10_000) -> list[int]:
    """Store times of consecutive batches of ``sizes`` messages, each batch one ms later."""
    return [t0 + k for k, n in enumerate(sizes) for _ in range(n)]


@EVERY_GATHERING
def test_a_time_giving_way_to_the_next_inside_a_stride_reads_no_record(few, monkeypatch):
    """Where one batch's time gives way to the next's inside a stride and the next stride
    starts with it, a search ending there reads no record, whatever pieces the queue grew in
    (a gather stops and resumes anywhere in a stride, vectorised or unit by unit) and across
    files; elsewhere (three times in a stride, the last stride) it probes as before. Every
    answer is the probing search's."""
    file_units = 200
    b, root = built(1 << 16, file_units)
    times = _batch_times([45, 70, 13, 100, 32, 64, 7, 33, 250, 1, 2, 90, 31, 29, 300, 60] * 2)
    try:
        with gathering(few), counting_reads(monkeypatch) as reads:
            done, free = 0, 0
            pieces = iter([1, 5, 31, 32, 33, 47, 48, 49, 64, 100, 3, 250, 7, 1, 90] * 10)
            while done < len(times):
                for t in times[done:done + next(pieces)]:
                    b.record(0, t)
                done = len(b.records[0])
                search = (lambda ts, bound:
                          offset_by_time(b.log, b.queues[0], ts, bound))  # noqa: E731
                search(0, LOWER)  # gathers what was appended
                free = _check_boundaries(search, times[:done], reads, file_units)
            b.check(sample=80)
        assert free >= 10
    finally:
        b.close()
        _remove(root)


@EVERY_GATHERING
@pytest.mark.parametrize("sizes", [(5, 7, 29), (31, 1, 40), (12, 20, 1, 30), (40, 3, 30)])
def test_a_gather_stopping_anywhere_in_a_stride(few, sizes, monkeypatch):
    """Batches of ``sizes`` messages (two or three times in a stride), the queue searched
    once after each unit up to a split and again after the rest: whatever was gathered
    before, a stride is two-timed only when its first unit after the run has the next
    stride's time."""
    times = _batch_times(sizes)
    for split in range(1, len(times)):
        b, root = built(1 << 16, 500)
        try:
            with gathering(few), counting_reads(monkeypatch) as reads:
                search = (lambda ts, bound:
                          offset_by_time(b.log, b.queues[0], ts, bound))  # noqa: E731
                for t in times[:split]:
                    b.record(0, t)
                search(0, LOWER)
                for t in times[split:]:
                    b.record(0, t)
                search(0, LOWER)
                _check_boundaries(search, times, reads, 500)
        finally:
            b.close()
            _remove(root)


@GATHERING
def test_a_stride_cut_and_written_over_with_other_times(few, monkeypatch, small):
    """A queue cut inside a stride whose later units had the next stride's time, then written
    again with other times: the stride is looked at anew (a search for a time the cut units
    had finds the units written since), and a stride the new units leave two-timed reads no
    record."""
    with gathering(few), counting_reads(monkeypatch) as reads:
        for t in [100] * 10 + [200] * 31:  # stride 0: 10 units of 100, then 200 into stride 1
            small.record(0, t)
        cq = small.queues[0]
        assert time_index.search(small.log, cq, 150, False) == 10
        cq.truncate_to_phys(small.records[0][20])  # units 0-19 stay
        assert cq.max_offset == 20
        times = [100] * 10 + [200] * 10 + [300] * 21 + [400] * 40
        for t in times[20:]:
            small.record(0, t)
        search = lambda ts, bound: offset_by_time(small.log, cq, ts, bound)  # noqa: E731
        search(0, LOWER)
        assert search(250, LOWER) == 20 and search(250, UPPER) == 19
        assert search(150, LOWER) == 10
        reads.clear()
        assert search(350, LOWER) == 41 and reads == []  # stride 1: 300 then 400 from 41 on
        assert _check_boundaries(search, times, reads, 500) == 1
        small.check()


def _put_batches(store, clock, sizes, t0: int, queue_id: int = 0) -> list[int]:
    """``put_batch`` each of ``sizes`` messages to queue ``queue_id`` of topic T, a ms apart:
    the store times of the messages in queue order."""
    times = []
    for k, n in enumerate(sizes):
        clock.now = t0 + k
        r = store.put_batch(MessageBatch(topic="T", bodies=[b"m"] * n, queue_ids=queue_id))
        assert r.status is PutStatus.PUT_OK and r.store_timestamp == t0 + k
        times += [t0 + k] * n
    return times


def _store_boundaries(store, times, reads) -> int:
    """``_check_boundaries`` through ``store.offset_by_time`` on queue T/0 (one file), after a
    first search that gathers; every answer from the column."""
    store.offset_by_time("T", 0, 0)
    cq, log = store.consume_queue("T", 0), store.internals.commit_log
    assert cq.max_offset == len(times)
    for b in range(1, len(times)):
        if times[b] != times[b - 1]:
            assert time_index.search(log, cq, times[b], False) == b
    return _check_boundaries(lambda ts, bound: store.offset_by_time("T", 0, ts, bound), times,
                             reads, cq.file_bytes // CQ_UNIT_SIZE)


SIZES = [45, 70, 13, 100, 32, 64, 7, 33, 250, 1, 2, 90]


def test_batches_while_another_process_writes_the_queue(make_store, manual_clock, monkeypatch):
    """The store's dispatch worker (another process) writes the queue and this process follows
    it in windows, so gathers stop anywhere in a stride; a read-only store opened on the same
    files follows the log in a process of its own view. Both read no record for a search that
    ends where a batch's time gives way to the next inside a stride, as the queue grows."""
    store = make_store()
    assert store.internals.supervisor is not None
    follower = make_store(root=store.root, read_only=True)
    times: list[int] = []
    with counting_reads(monkeypatch) as reads:
        for round_ in range(3):
            times += _put_batches(store, manual_clock, SIZES, 20_000 + 100 * round_)
            store.wait_dispatched()
            assert _store_boundaries(store, times, reads) == (4, 11, 18)[round_]
            deadline = time.monotonic() + 30
            while follower.max_offset("T", 0) < len(times):
                assert time.monotonic() < deadline
                time.sleep(0.01)
            assert _store_boundaries(follower, times, reads) == (4, 11, 18)[round_]


def test_batches_after_a_crash_cut_the_last_record(make_store, manual_clock, monkeypatch,
                                                    tmp_path):
    """Recovery cuts a torn last record and its unit inside a stride; the reopened store's
    searches agree with the times kept and read no record at two-timed strides, and so after
    a batch at a new time is written over the cut."""
    store = make_store()
    times = _put_batches(store, manual_clock, SIZES, 30_000)
    store.wait_dispatched()
    store.flush_commit_log(0)
    last = store.get("g", "T", 0, len(times) - 1, 1).messages[0]
    root = tmp_path / "crashed"
    shutil.copytree(store.root, root)
    seg = 1 << 20
    with open(root / "commitlog" / f"{last.phys_offset - last.phys_offset % seg:020d}",
              "r+b") as f:  # the last record torn in half, the checkpoint trusting nothing
        f.seek(last.phys_offset % seg + last.size // 2)
        f.write(bytes(last.size))
    with open(root / "checkpoint", "r+b") as f:
        f.seek(32)
        f.write(bytes(16))
    crashed = make_store(root=root)
    assert crashed.recovery_report.abnormal
    times.pop()
    with counting_reads(monkeypatch) as reads:
        assert _store_boundaries(crashed, times, reads) == 4
        times += _put_batches(crashed, manual_clock, [40, 3, 70], 40_000)
        crashed.wait_dispatched()
        assert _store_boundaries(crashed, times, reads) == 5

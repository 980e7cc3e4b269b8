"""Pulls across commit-log segment ends (64 KiB segments): each run of units inside one
segment is served column-wise, and every answer is the one the unit-by-unit walk gives.

The reference is twofold: a message-by-message ``get(max_msgs=1)`` walk over the whole queue
(rows and their exact bytes), and the same call with the column-wise path switched off
(status, next offset, filtered count, corrupt units, rows), call by call.
"""

from __future__ import annotations

import random

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.read import pull
from mqstore.read.segment_runs import COLUMNS_FROM, RUN_FROM, ColumnRuns
from mqstore.testing import fill

TOPIC = "R"
SEGMENT = 64 << 10
EXPRESSIONS = [None, "A", "A || B", "Z"]


def _fill(store, rng: random.Random, count: int, queues: int = 2) -> None:
    fill(store, count, topic=TOPIC, queues=queues, rng=rng, sizes=[0, 17, 128, 128, 700, 3000],
         tags=[None, "A", "B", "C"], keys=True)


@pytest.fixture(params=[24 << 30, 1 << 20], ids=["in-memory", "partly-on-disk"])
def rolled(make_store, request):
    """Two queues over 64 KiB segments. With 1 MiB of "physical memory", the older records
    count as on disk: getMessage's disk limits and suggest_pulling_from_slave come in."""
    store = make_store({"commit_log": {"segment_bytes": SEGMENT},
                        "get": {"physical_memory_bytes": request.param}})
    _fill(store, random.Random(11), 1500)
    return store


def _one_by_one(store, queue: int, expression) -> list:
    """(queue offset, record bytes) of every message ``get(max_msgs=1)`` serves in turn."""
    rows, offset = [], 0
    while True:
        got = store.get("g", TOPIC, queue, offset, 1, expression=expression)
        if got.next_begin_offset == offset:
            return rows
        rows += [(m.queue_offset, bytes(m.raw)) for m in got.messages]
        offset = got.next_begin_offset


def _read_all(store, queue: int, step: int, expression) -> list:
    rows, offset = [], 0
    while True:
        batch = store.read(TOPIC, queue, offset, step, expression=expression)
        if batch.next_begin_offset == offset:
            return rows
        for i in range(len(batch)):
            msg = batch.message(i)
            assert batch.body(i).tobytes() == msg.body
            assert int(batch.queue_offsets[i]) == msg.queue_offset
            rows.append((msg.queue_offset, bytes(msg.raw)))
        offset = batch.next_begin_offset


def _get_all(store, queue: int, step: int, expression) -> list:
    rows, offset = [], 0
    while True:
        got = store.get("g", TOPIC, queue, offset, step, expression=expression)
        if got.next_begin_offset == offset:
            return rows
        rows += [(m.queue_offset, bytes(m.raw)) for m in got.messages]
        offset = got.next_begin_offset


def _answer(result, rows) -> tuple:
    return (result.status, result.next_begin_offset, result.min_offset, result.max_offset,
            result.filtered_count, list(result.corrupt), rows,
            getattr(result, "suggest_pulling_from_slave", None))


def _answers(store, calls) -> list:
    out = []
    for queue, offset, count, expression, max_bytes in calls:
        batch = store.read(TOPIC, queue, offset, count, expression=expression,
                           max_total_bytes=max_bytes)
        out.append(_answer(batch, [bytes(batch.message(i).raw) for i in range(len(batch))]))
        got = store.get("g", TOPIC, queue, offset, count, expression=expression)
        out.append(_answer(got, [bytes(m.raw) for m in got.messages]))
    return out


def _walk_only(monkeypatch) -> None:
    monkeypatch.setattr(ColumnRuns, "_take_columns", lambda self, *args: None)


def _calls(store, rng: random.Random, k: int) -> list:
    ends = [store.max_offset(TOPIC, q) for q in range(2)]
    return [(q, rng.randrange(-2, ends[q] + 3), rng.choice([1, 40, 64, 65, 200, 900, 3000]),
             rng.choice(EXPRESSIONS), rng.choice([None, None, 5000, 60_000]))
            for q in (rng.randrange(2) for _ in range(k))]


def test_queue_read_across_segments_is_the_one_by_one_walk(rolled):
    phys = rolled.read(TOPIC, 0, 0, 10_000).phys_offsets
    assert len(set((phys // SEGMENT).tolist())) > 10  # many segment ends crossed
    for queue in (0, 1):
        for expression in EXPRESSIONS:
            expected = _one_by_one(rolled, queue, expression)
            assert expected or expression == "Z"
            for step in (64, 333, 5000):
                assert _read_all(rolled, queue, step, expression) == expected
            assert _get_all(rolled, queue, 400, expression) == expected


def test_answers_are_the_walks_call_by_call(rolled, monkeypatch):
    calls = _calls(rolled, random.Random(5), 300)
    with_columns = _answers(rolled, calls)
    _walk_only(monkeypatch)
    assert _answers(rolled, calls) == with_columns


@pytest.fixture
def uniform(make_store):
    """Queue 0: 5,000 messages of 120-byte bodies numbered by queue offset, about 250 a
    segment."""
    store = make_store({"commit_log": {"segment_bytes": SEGMENT}})
    for k in range(10):
        assert store.put_batch([Message(TOPIC, b"%06d" % (k * 500 + i) * 20, queue_id=0,
                                        tags="A") for i in range(500)]).status is PutStatus.PUT_OK
    store.wait_dispatched()
    return store


def _counting(monkeypatch) -> tuple[list, list]:
    """(units of each walk, whether each ``_take_columns`` served its run) from now on."""
    walked, runs = [], []
    walk, take_columns = pull._Scan._walk, ColumnRuns._take_columns

    def counting_walk(self, units, mask):
        walked.append((self.base, len(units)))
        return walk(self, units, mask)

    def counting_columns(self, units, *args):
        served = take_columns(self, units, *args)
        runs.append(served is not None)
        return served

    monkeypatch.setattr(pull._Scan, "_walk", counting_walk)
    monkeypatch.setattr(ColumnRuns, "_take_columns", counting_columns)
    return walked, runs


def test_runs_inside_segments_are_served_column_wise(uniform, monkeypatch):
    walked, runs = _counting(monkeypatch)
    for expression in (None, "A"):
        walked.clear(), runs.clear()
        batch = uniform.read(TOPIC, 0, 10, 4000, expression=expression)
        assert len(batch) == 4000 and batch.next_begin_offset == 4010
        segments = len(set((batch.phys_offsets // SEGMENT).tolist()))
        assert segments > 10
        # One run a segment, column-wise; only the last few messages of the batch (too few
        # for the column-wise checks to pay off) or a chunk's short tail may be walked.
        assert len(runs) >= segments and all(runs[:-1])
        assert sum(n for _at, n in walked) < 2 * RUN_FROM + COLUMNS_FROM
        assert [batch.body(i).tobytes() for i in range(4000)] == [
            b"%06d" % (10 + i) * 20 for i in range(4000)]


def test_only_the_unit_of_a_damaged_record_is_walked(uniform, monkeypatch):
    pos = int(uniform.read(TOPIC, 0, 1234, 1).phys_offsets[0])
    seg = uniform.internals.commit_log.segments.find(pos)
    seg.mm[pos - seg.start + 88 + 2] ^= 0x10  # a body byte (IPv4 hosts: the body at 88)
    walked, _runs = _counting(monkeypatch)
    for expression in (None, "A"):
        walked.clear()
        batch = uniform.read(TOPIC, 0, 10, 4000, expression=expression)
        assert [c[:2] for c in batch.corrupt] == [(1234, pos)]
        # The window is 4,000 units: the damaged one is passed over, not replaced.
        assert batch.queue_offsets.tolist() == [i for i in range(10, 4010) if i != 1234]
        assert (1234, 1) in walked
        assert sum(n for _at, n in walked) < 1 + 2 * RUN_FROM + COLUMNS_FROM


def test_damaged_record_across_segments_is_passed_over_as_the_walk_does(rolled, monkeypatch):
    whole = rolled.read(TOPIC, 0, 0, 10_000)
    with_body = [i for i in range(len(whole)) if len(whole.body(i)) > 2]
    picked = [with_body[40], with_body[41], with_body[300]]
    hits = [int(whole.queue_offsets[i]) for i in picked]
    for i in picked:
        pos = int(whole.phys_offsets[i])
        seg = rolled.internals.commit_log.segments.find(pos)
        seg.mm[pos - seg.start + 88 + 2] ^= 0x10  # a body byte (IPv4 hosts: the body at 88)
    batch = rolled.read(TOPIC, 0, 0, 10_000)
    assert [c[0] for c in batch.corrupt] == hits
    assert len(batch) == len(whole) - 3
    calls = [(0, off, count, expression, None) for off in (0, hits[0] - 5, hits[1], hits[2] - 9)
             for count in (64, 500, 3000) for expression in (None, "A")]
    with_columns = _answers(rolled, calls)
    _walk_only(monkeypatch)
    assert _answers(rolled, calls) == with_columns


def test_removed_segment_is_answered_as_the_walk_does(rolled, monkeypatch):
    """A reader that finds the log's first segments gone (cleanup ran) passes over their
    units and serves what follows, exactly as the walk answers."""
    segments = rolled.internals.commit_log.segments
    gone = 3 * SEGMENT
    find = type(segments).find

    def find_after_cleanup(self, pos):
        if self is segments and 0 <= pos < gone:
            return None
        return find(self, pos)

    monkeypatch.setattr(type(segments), "find", find_after_cleanup)
    calls = [(q, off, count, expression, None) for q in (0, 1) for off in (0, 5, 60)
             for count in (64, 500, 3000) for expression in (None, "A")]
    with_columns = _answers(rolled, calls)
    # The units pointing into the removed segments are passed over, not counted.
    first = with_columns[0]
    assert first[0] is GetStatus.FOUND and first[1] > 64 and len(first[6]) == 64
    _walk_only(monkeypatch)
    assert _answers(rolled, calls) == with_columns

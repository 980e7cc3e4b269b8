"""Queue offset by store time (spec 10.7, acceptance behaviours 39-43), 5.x LOWER/UPPER."""

from __future__ import annotations

import pytest

from mqstore import Message, PutStatus

LOWER, UPPER = "lower", "upper"


def put_at(store, clock, times, *, topic="T", queue_id=0):
    results = []
    for t in times:
        clock.now = t
        r = store.put(Message(topic, b"x", tags="A", queue_id=queue_id))
        assert r.status is PutStatus.PUT_OK
        assert r.store_timestamp == t
        results.append(r)
    store.wait_dispatched()
    return results


def both(store, ts, topic="T", queue_id=0):
    return (store.offset_by_time(topic, queue_id, ts, LOWER),
            store.offset_by_time(topic, queue_id, ts, UPPER))


@pytest.fixture
def three(make_store, manual_clock):
    store = make_store()
    put_at(store, manual_clock, [100, 200, 300])
    return store


# -- behaviours 39-42 --------------------------------------------------------------------

def test_b39_exact_and_between_timestamps(three):
    assert both(three, 200) == (1, 1)
    assert both(three, 150) == (1, 0)
    assert both(three, 100) == (0, 0)
    assert both(three, 300) == (2, 2)
    assert both(three, 250) == (2, 1)


def test_b40_before_first_and_after_last(three):
    assert both(three, 50) == (0, 0)
    assert both(three, 400) == (3, 2)
    assert three.max_offset("T", 0) == 3


def test_b41_equal_timestamps_lower_first_upper_last(make_store, manual_clock):
    store = make_store()
    put_at(store, manual_clock, [100, 200, 200, 200, 300])
    assert both(store, 200) == (1, 3)
    assert both(store, 199) == (1, 0)
    assert both(store, 201) == (4, 3)


@pytest.mark.loops("thread")
def test_b42_empty_or_unknown_queue_is_zero(make_store, manual_clock):
    store = make_store()
    put_at(store, manual_clock, [100, 200, 300])
    for ts in (0, 50, 200, 10_000):
        assert both(store, ts, "nope", 0) == (0, 0)
        assert both(store, ts, "T", 7) == (0, 0)
        assert store.offset_by_time("nope", 0, ts) == 0
    empty = store.consume_queue("E", 0, create=True)
    assert empty is not None and empty.max_offset == 0
    for ts in (0, 200, 10_000):
        assert both(store, ts, "E", 0) == (0, 0)


def test_b42_without_boundary_behaves_as_lower(three):
    for ts, lower in [(50, 0), (150, 1), (200, 1), (250, 2), (400, 3)]:
        assert three.offset_by_time("T", 0, ts) == lower
        assert three.offset_by_time("T", 0, ts, LOWER) == lower
    # The default is not UPPER (which differs at these points).
    assert three.offset_by_time("T", 0, 150) != three.offset_by_time("T", 0, 150, UPPER)
    assert three.offset_by_time("T", 0, 400) != three.offset_by_time("T", 0, 400, UPPER)


def test_unknown_boundary_is_rejected(three):
    with pytest.raises(ValueError, match="sideways"):
        three.offset_by_time("T", 0, 200, "sideways")


# -- behaviour 43: clamped to the corrected min ------------------------------------------

def test_b43_after_cleanup_answers_clamp_to_min(make_store, manual_clock):
    store = make_store({"commit_log": {"segment_bytes": 1024}})
    puts = []
    t = 1_000
    for queue_id in [0] * 5 + [1] * 5 + [0] * 5:
        t += 10
        puts.extend(put_at(store, manual_clock, [t], queue_id=queue_id))
    assert [p.size for p in puts] == [100] * 15
    store.delete_expired_segments(reserved_ms=0, force=True, max_segments=10)
    min_phys = store.min_phys_offset
    assert min_phys == 1024
    t0 = [p for p in puts if p.queue_id == 0]
    expected_min = next(p.queue_offset for p in t0 if p.phys_offset >= min_phys)
    assert expected_min == 5
    assert store.min_offset("T", 0) == 5
    assert store.max_offset("T", 0) == 10

    # Earlier than every remaining message, including times of removed ones.
    assert both(store, 0) == (5, 5)
    assert both(store, t0[0].store_timestamp) == (5, 5)
    assert both(store, t0[4].store_timestamp) == (5, 5)
    # Remaining messages still answer exactly.
    assert both(store, t0[5].store_timestamp) == (5, 5)
    assert both(store, t0[7].store_timestamp) == (7, 7)
    assert both(store, t0[7].store_timestamp + 5) == (8, 7)
    assert both(store, t0[9].store_timestamp + 1) == (10, 9)

    # A queue whose every unit was removed: min == max, any answer clamps to it.
    assert (store.min_offset("T", 1), store.max_offset("T", 1)) == (5, 5)
    assert both(store, 0, "T", 1) == (5, 5)
    assert both(store, 10_000, "T", 1) == (5, 5)


# -- consume-queue file boundaries -------------------------------------------------------

@pytest.fixture
def three_files(make_store, manual_clock):
    # Files of 3 units: [100, 200, 300] [400, 500, 600] [700]
    store = make_store({"consume_queue": {"file_units": 3}})
    put_at(store, manual_clock, [100, 200, 300, 400, 500, 600, 700])
    assert store.consume_queue("T", 0).file_bytes == 60
    assert len(store.consume_queue("T", 0).segments.segments) == 3
    return store


@pytest.mark.parametrize("ts, lower, upper", [
    (50, 0, 0),
    (100, 0, 0),
    (300, 2, 2),   # last unit of file 0
    (350, 3, 2),   # between files 0 and 1
    (400, 3, 3),   # first unit of file 1
    (450, 4, 3),
    (600, 5, 5),   # last unit of file 1
    (650, 6, 5),   # between file 1 and the last file
    (700, 6, 6),
    (800, 7, 6),   # after the last message: LOWER = max
])
@pytest.mark.loops("thread")
def test_search_across_consume_queue_files(three_files, ts, lower, upper):
    assert both(three_files, ts) == (lower, upper)


def test_search_when_the_last_file_is_full(make_store, manual_clock):
    store = make_store({"consume_queue": {"file_units": 3}})
    put_at(store, manual_clock, [100, 200, 300, 400, 500, 600])
    assert store.max_offset("T", 0) == 6
    assert both(store, 350) == (3, 2)
    assert both(store, 600) == (5, 5)
    assert both(store, 601) == (6, 5)
    assert both(store, 99) == (0, 0)


@pytest.mark.loops("thread")
def test_equal_timestamps_spanning_two_files(make_store, manual_clock):
    # Files of 4 units: [100, 200, 200, 200] [200, 200, 300, 400]
    store = make_store({"consume_queue": {"file_units": 4}})
    put_at(store, manual_clock, [100, 200, 200, 200, 200, 200, 300, 400])
    assert len(store.consume_queue("T", 0).segments.segments) == 2
    assert both(store, 200) == (1, 5)
    assert both(store, 150) == (1, 0)
    assert both(store, 250) == (6, 5)
    assert both(store, 300) == (6, 6)


@pytest.mark.loops("thread")
def test_equal_timestamps_filling_a_whole_file(make_store, manual_clock):
    # Files of 3 units: [100, 200, 200] [200, 200, 200] [200, 300]
    store = make_store({"consume_queue": {"file_units": 3}})
    put_at(store, manual_clock, [100, 200, 200, 200, 200, 200, 200, 300])
    assert len(store.consume_queue("T", 0).segments.segments) == 3
    assert both(store, 200) == (1, 6)
    assert both(store, 199) == (1, 0)
    assert both(store, 201) == (7, 6)
    assert both(store, 300) == (7, 7)
    assert both(store, 301) == (8, 7)


def test_equal_timestamps_ending_a_file(make_store, manual_clock):
    # Files of 3 units: [100, 200, 200] [300, 400, 500]
    store = make_store({"consume_queue": {"file_units": 3}})
    put_at(store, manual_clock, [100, 200, 200, 300, 400, 500])
    assert both(store, 200) == (1, 2)
    assert both(store, 250) == (3, 2)


def test_equal_timestamps_starting_a_file(make_store, manual_clock):
    # Files of 3 units: [100, 150, 180] [200, 200, 200] [300]
    store = make_store({"consume_queue": {"file_units": 3}})
    put_at(store, manual_clock, [100, 150, 180, 200, 200, 200, 300])
    assert both(store, 200) == (3, 5)
    assert both(store, 190) == (3, 2)

"""Pull semantics (spec 10.6, acceptance behaviours 23-37).

Behaviour 38 (SYNC_FLUSH visibility) is covered with the flush tests.
"""

from __future__ import annotations

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.errors import PluginError, StoreClosedError
from mqstore.hashing import java_string_hash

GROUP = "G"


def put_n(store, n, *, topic="T", queue_id=0, tags="A", body=b"x"):
    results = []
    for _ in range(n):
        r = store.put(Message(topic, body, tags=tags, queue_id=queue_id))
        assert r.status is PutStatus.PUT_OK
        results.append(r)
    return results


def put_batch_n(store, n, *, topic="T", queue_id=0, tags="A", body=b"x"):
    res = store.put_batch([Message(topic, body, tags=tags, queue_id=queue_id) for _ in range(n)])
    assert res.status is PutStatus.PUT_OK
    assert len(res) == n
    return res


def offsets(result):
    return [m.queue_offset for m in result.messages]


# -- behaviours 23-27: status by offset range --------------------------------------------

def test_b23_found_three_messages(make_store):
    store = make_store()
    puts = [store.put(Message("T", f"m{i}".encode(), tags="A", queue_id=0)) for i in range(3)]
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0, 1, 2]
    assert [m.body for m in r.messages] == [b"m0", b"m1", b"m2"]
    assert [m.phys_offset for m in r.messages] == [p.phys_offset for p in puts]
    assert r.next_begin_offset == 3
    assert r.min_offset == 0
    assert r.max_offset == 3
    assert r.suggest_pulling_from_slave is False
    assert r.filtered_count == 0


def test_b24_offset_equal_to_max_is_overflow_one(make_store):
    store = make_store()
    put_n(store, 3)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 3, 32)
    assert r.status is GetStatus.OFFSET_OVERFLOW_ONE
    assert r.next_begin_offset == 3
    assert r.messages == []
    assert (r.min_offset, r.max_offset) == (0, 3)
    assert r.suggest_pulling_from_slave is False


def test_b25_offset_past_max_is_overflow_badly_corrected_to_max(make_store):
    store = make_store()
    put_n(store, 3)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 10, 32)
    assert r.status is GetStatus.OFFSET_OVERFLOW_BADLY
    assert r.next_begin_offset == 3
    assert r.messages == []
    assert (r.min_offset, r.max_offset) == (0, 3)


def test_b25_slave_without_offset_check_keeps_the_requested_offset(make_store, store_dir):
    writer = make_store()
    put_n(writer, 3)
    writer.wait_dispatched()
    writer.close()

    slave = make_store({"store": {"role": "slave"}, "get": {"offset_check_in_slave": False}},
                       root=store_dir)
    assert slave.put(Message("T", b"y", tags="A", queue_id=0)).status \
        is PutStatus.SERVICE_NOT_AVAILABLE
    r = slave.get(GROUP, "T", 0, 10, 32)
    assert r.status is GetStatus.OFFSET_OVERFLOW_BADLY
    assert r.next_begin_offset == 10
    assert (r.min_offset, r.max_offset) == (0, 3)
    # NO_MESSAGE_IN_QUEUE would correct to 0 on a master; the slave keeps the offset too.
    r = slave.get(GROUP, "T", 7, 5, 32)
    assert r.status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert r.next_begin_offset == 5
    # Reads still work in slave role.
    r = slave.get(GROUP, "T", 0, 0, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0, 1, 2]
    assert r.next_begin_offset == 3


def test_b25_slave_with_offset_check_corrects_like_a_master(make_store, store_dir):
    writer = make_store()
    put_n(writer, 3)
    writer.wait_dispatched()
    writer.close()

    slave = make_store({"store": {"role": "slave"}, "get": {"offset_check_in_slave": True}},
                       root=store_dir)
    r = slave.get(GROUP, "T", 0, 10, 32)
    assert r.status is GetStatus.OFFSET_OVERFLOW_BADLY
    assert r.next_begin_offset == 3


def test_b26_never_written_queue_is_no_message_in_queue(make_store):
    store = make_store()
    put_n(store, 3)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 7, 5, 32)
    assert r.status is GetStatus.NO_MESSAGE_IN_QUEUE
    assert r.next_begin_offset == 0
    assert r.min_offset == 0
    assert r.max_offset == 0
    assert r.messages == []
    assert r.suggest_pulling_from_slave is False


def test_b27_max_msgs_limits_the_batch(make_store):
    store = make_store()
    put_n(store, 3)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 2)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0, 1]
    assert r.next_begin_offset == 2
    r = store.get(GROUP, "T", 0, 2, 2)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [2]
    assert r.next_begin_offset == 3


def test_max_msgs_zero_still_returns_the_first_message(make_store):
    store = make_store()
    put_n(store, 3)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 1, 0)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [1]
    assert r.next_begin_offset == 2


CLOSED_CALLS = {
    "put": lambda s: s.put(Message("T", b"x")),
    "put_batch": lambda s: s.put_batch([Message("T", b"x")]),
    "get": lambda s: s.get(GROUP, "T", 0, 0, 32),
    "message_at": lambda s: s.message_at(0),
    "message_by_id": lambda s: s.message_by_id("7F00000100002A9F0000000000000000"),
    "max_offset": lambda s: s.max_offset("T", 0),
    "min_offset": lambda s: s.min_offset("T", 0),
    "offset_by_time": lambda s: s.offset_by_time("T", 0, 0),
    "earliest_message_time": lambda s: s.earliest_message_time("T", 0),
    "topics": lambda s: s.topics(),
    "queue_ids": lambda s: s.queue_ids("T"),
    "query_by_key": lambda s: s.query_by_key("T", "k"),
    "query_by_unique_key": lambda s: s.query_by_unique_key("T", "k"),
    "wait_dispatched": lambda s: s.wait_dispatched(),
    "worker_status": lambda s: s.worker_status(),
    "flush_commit_log": lambda s: s.flush_commit_log(),
    "dispatch_behind_bytes": lambda s: s.dispatch_behind_bytes(),
    "delete_expired_segments": lambda s: s.delete_expired_segments(),
    "register_subscription": lambda s: s.register_subscription(GROUP, "T", "a = 1"),
    "unregister_subscription": lambda s: s.unregister_subscription(GROUP, "T"),
    "min_phys_offset": lambda s: s.min_phys_offset,
    "max_phys_offset": lambda s: s.max_phys_offset,
    "flushed_offset": lambda s: s.flushed_offset,
}


@pytest.mark.parametrize("read_only", [False, True])
@pytest.mark.parametrize("name", sorted(CLOSED_CALLS))
def test_every_call_on_a_closed_store_raises_store_closed_error(make_store, store_dir, name,
                                                                read_only):
    store = make_store()
    put_n(store, 1)
    store.wait_dispatched()
    if read_only:
        store.close()
        store = make_store(read_only=True)
    store.close()
    with pytest.raises(StoreClosedError, match=f"store '{store_dir}' is closed"):
        CLOSED_CALLS[name](store)
    store.close()  # a second close is harmless


# -- behaviours 28-29: tag filter --------------------------------------------------------

@pytest.fixture
def aba_store(make_store):
    store = make_store()
    for tag in ("A", "B", "A"):
        put_n(store, 1, tags=tag)
    store.wait_dispatched()
    return store


def test_b28_tag_subscription_selects_matching_offsets(aba_store):
    r = aba_store.get(GROUP, "T", 0, 0, 32, expression="A")
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0, 2]
    assert [m.tags for m in r.messages] == ["A", "A"]
    assert r.next_begin_offset == 3


def test_b28_or_expression_matches_every_listed_tag(aba_store):
    r = aba_store.get(GROUP, "T", 0, 0, 32, expression="A || B")
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0, 1, 2]
    assert r.next_begin_offset == 3


@pytest.mark.parametrize("expression", ["*", None])
def test_b28_star_and_none_match_all(aba_store, expression):
    r = aba_store.get(GROUP, "T", 0, 0, 32, expression=expression)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0, 1, 2]
    assert r.next_begin_offset == 3
    assert r.filtered_count == 0


def test_b28_unmatched_tag_is_no_matched_message(aba_store):
    r = aba_store.get(GROUP, "T", 0, 0, 32, expression="C")
    assert r.status is GetStatus.NO_MATCHED_MESSAGE
    assert r.next_begin_offset == 3
    assert r.messages == []
    assert (r.min_offset, r.max_offset) == (0, 3)


def test_expression_of_only_separators_matches_nothing(aba_store):
    r = aba_store.get(GROUP, "T", 0, 0, 32, expression=" || ")
    assert r.status is GetStatus.NO_MATCHED_MESSAGE
    assert r.next_begin_offset == 3
    assert r.messages == []


def test_unknown_expression_type_raises_naming_it(aba_store):
    with pytest.raises(PluginError, match="XPATH_FILTER"):
        aba_store.get(GROUP, "T", 0, 0, 32, expression="A", expression_type="XPATH_FILTER")


def test_b29_colliding_tag_hashes_are_confirmed_by_tag_string(make_store):
    # RocketMQ's store returns both messages for "Aa" (hash-only match); mqstore compares the
    # real TAGS string after the hash pre-check, so only the "Aa" message comes back.
    assert java_string_hash("Aa") == java_string_hash("BB") == 2112
    store = make_store()
    put_n(store, 1, tags="Aa")
    put_n(store, 1, tags="BB")
    store.wait_dispatched()

    r = store.get(GROUP, "T", 0, 0, 32, expression="Aa")
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0]
    assert [m.tags for m in r.messages] == ["Aa"]
    assert r.next_begin_offset == 2
    assert r.filtered_count == 1

    r = store.get(GROUP, "T", 0, 0, 32, expression="BB")
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [1]
    assert [m.tags for m in r.messages] == ["BB"]
    assert r.next_begin_offset == 2
    assert r.filtered_count == 1

    r = store.get(GROUP, "T", 0, 0, 1, expression="BB")
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [1]


# -- behaviours 30-33: batch limits ------------------------------------------------------

def test_b30_in_memory_pull_stops_at_32_messages(make_store):
    store = make_store()
    put_batch_n(store, 40)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 64)
    assert r.status is GetStatus.FOUND
    assert len(r.messages) == 32
    assert offsets(r) == list(range(32))
    assert r.next_begin_offset == 32
    assert r.suggest_pulling_from_slave is False


def test_b31_in_memory_pull_stops_before_256_kib(make_store):
    store = make_store()
    puts = put_n(store, 3, body=b"b" * 100_000)
    assert sum(p.size for p in puts[:2]) <= 256 * 1024 < sum(p.size for p in puts)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0, 1]
    assert r.next_begin_offset == 2
    assert r.buffer_total_size == puts[0].size + puts[1].size
    assert r.suggest_pulling_from_slave is False


def test_b32_first_message_is_always_accepted(make_store):
    store = make_store()
    (put,) = put_n(store, 1, body=b"z" * (300 * 1024))
    assert put.size > 256 * 1024
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0]
    assert len(r.messages[0].body) == 300 * 1024
    assert r.next_begin_offset == 1


def test_b33_on_disk_pull_stops_at_8_messages(make_store):
    store = make_store({"get": {"physical_memory_bytes": 0}})
    put_batch_n(store, 20)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == list(range(8))
    assert r.next_begin_offset == 8
    assert r.suggest_pulling_from_slave is True


def test_b33_on_disk_pull_stops_before_64_kib(make_store):
    store = make_store({"get": {"physical_memory_bytes": 0}})
    puts = put_n(store, 2, body=b"k" * (40 * 1024))
    assert puts[0].size + puts[1].size > 64 * 1024
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [0]
    assert r.next_begin_offset == 1
    assert r.suggest_pulling_from_slave is True


# -- behaviours 34-35: one consume-queue file, filter window -----------------------------

def test_b34_pull_never_crosses_a_consume_queue_file(make_store):
    store = make_store({"consume_queue": {"file_units": 10}})
    put_n(store, 15)
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 8, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [8, 9]
    assert r.next_begin_offset == 10
    assert (r.min_offset, r.max_offset) == (0, 15)
    r = store.get(GROUP, "T", 0, 10, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [10, 11, 12, 13, 14]
    assert r.next_begin_offset == 15


def test_filtered_pull_stops_at_the_consume_queue_file_end(make_store):
    store = make_store({"consume_queue": {"file_units": 10}})
    put_n(store, 10, tags="A")
    put_n(store, 5, tags="B")
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32, expression="B")
    assert r.status is GetStatus.NO_MATCHED_MESSAGE
    assert r.messages == []
    assert r.next_begin_offset == 10
    r = store.get(GROUP, "T", 0, r.next_begin_offset, 32, expression="B")
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [10, 11, 12, 13, 14]
    assert r.next_begin_offset == 15


def test_b35_unmatched_scan_stops_at_the_filter_window(make_store):
    store = make_store()
    put_batch_n(store, 1000, tags="A")
    store.wait_dispatched()
    r = store.get(GROUP, "T", 0, 0, 32, expression="B")
    assert r.status is GetStatus.NO_MATCHED_MESSAGE
    assert r.messages == []
    assert r.next_begin_offset == 800
    assert r.filtered_count == 0
    r = store.get(GROUP, "T", 0, 800, 32, expression="B")
    assert r.status is GetStatus.NO_MATCHED_MESSAGE
    assert r.next_begin_offset == 1000
    # max_msgs*20 widens the window past max_filter_bytes.
    r = store.get(GROUP, "T", 0, 0, 900, expression="B")
    assert r.status is GetStatus.NO_MATCHED_MESSAGE
    assert r.next_begin_offset == 900


# -- behaviours 36-37: removed commit-log segments ---------------------------------------

SMALL_LOG = {"commit_log": {"segment_bytes": 1024}}


@pytest.mark.loops("thread")
def test_b36_units_into_a_dropped_segment_are_message_was_removing(make_store):
    store = make_store({**SMALL_LOG, "consume_queue": {"file_units": 10}})
    puts = put_n(store, 25)
    assert [p.size for p in puts] == [100] * 25
    in_first = [p.queue_offset for p in puts if p.phys_offset < 1024]
    assert in_first == list(range(10))
    store.wait_dispatched()

    store.internals.commit_log.segments.drop_first(1)
    assert store.min_phys_offset == 1024
    assert store.min_offset("T", 0) == 0  # not corrected

    r = store.get(GROUP, "T", 0, 1, 32)
    assert r.status is GetStatus.MESSAGE_WAS_REMOVING
    assert r.messages == []
    assert r.next_begin_offset == 10
    assert (r.min_offset, r.max_offset) == (0, 25)

    r = store.get(GROUP, "T", 0, 10, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == list(range(10, 20))
    assert r.next_begin_offset == 20


@pytest.mark.loops("thread")
def test_removed_units_are_skipped_and_later_units_returned(make_store):
    store = make_store(SMALL_LOG)
    puts = put_n(store, 25)
    assert [p.queue_offset for p in puts if p.phys_offset < 1024] == list(range(10))
    store.wait_dispatched()
    store.internals.commit_log.segments.drop_first(1)

    r = store.get(GROUP, "T", 0, 1, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == list(range(10, 25))
    assert r.next_begin_offset == 25


@pytest.mark.loops("thread")
def test_units_rejected_by_tag_code_after_a_removed_segment_are_no_matched(make_store):
    # Spec 10.6 step f: a unit rejected by its tags code sets NO_MATCHED_MESSAGE while nothing
    # has been collected, even after an earlier unit reported MESSAGE_WAS_REMOVING.
    store = make_store(SMALL_LOG)
    puts = put_n(store, 10, tags="B") + put_n(store, 15, tags="A")
    assert [p.queue_offset for p in puts if p.phys_offset < 1024] == list(range(10))
    store.wait_dispatched()
    store.internals.commit_log.segments.drop_first(1)

    r = store.get(GROUP, "T", 0, 1, 32, expression="B")
    assert r.messages == []
    assert r.next_begin_offset == 25
    assert r.status is GetStatus.NO_MATCHED_MESSAGE


def _cleanup_store(make_store, clock=None):
    """T/0 offsets 0-4 and T/1 offsets 0-4 fill segment 0; T/0 offsets 5-9 go to segment 1."""
    store = make_store(SMALL_LOG) if clock is None else make_store(SMALL_LOG, clock=clock)
    puts = []
    for topic_queue in [0] * 5 + [1] * 5 + [0] * 5:
        if clock is not None:
            clock.advance(10)
        puts.append(put_n(store, 1, queue_id=topic_queue)[0])
    store.wait_dispatched()
    removed = store.delete_expired_segments(reserved_ms=0, force=True, max_segments=10)
    assert removed
    min_phys = store.min_phys_offset
    assert min_phys == 1024
    t0 = [p for p in puts if p.queue_id == 0]
    expected_min = next(p.queue_offset for p in t0 if p.phys_offset >= min_phys)
    assert expected_min == 5
    return store, puts


def test_b37_offset_below_corrected_min_is_too_small(make_store):
    store, _puts = _cleanup_store(make_store)
    assert store.min_offset("T", 0) == 5
    assert store.max_offset("T", 0) == 10
    r = store.get(GROUP, "T", 0, 2, 32)
    assert r.status is GetStatus.OFFSET_TOO_SMALL
    assert r.next_begin_offset == 5
    assert r.messages == []
    assert (r.min_offset, r.max_offset) == (5, 10)
    r = store.get(GROUP, "T", 0, 5, 32)
    assert r.status is GetStatus.FOUND
    assert offsets(r) == [5, 6, 7, 8, 9]
    assert r.next_begin_offset == 10


def test_queue_wholly_below_the_log_min_is_emptied(make_store):
    store, _puts = _cleanup_store(make_store)
    assert store.min_offset("T", 1) == 5
    assert store.max_offset("T", 1) == 5
    r = store.get(GROUP, "T", 1, 0, 32)
    assert r.status is GetStatus.OFFSET_TOO_SMALL
    assert r.next_begin_offset == 5
    r = store.get(GROUP, "T", 1, 5, 32)
    assert r.status is GetStatus.OFFSET_OVERFLOW_ONE
    assert r.next_begin_offset == 5
    assert store.earliest_message_time("T", 1) == -1


def test_earliest_message_time_follows_the_min_offset(make_store, manual_clock):
    store, puts = _cleanup_store(make_store, manual_clock)
    t0 = [p for p in puts if p.queue_id == 0]
    assert store.earliest_message_time("T", 0) == t0[5].store_timestamp
    assert t0[5].store_timestamp == 1_700_000_000_000 + 110


# -- other read APIs ---------------------------------------------------------------------

def test_earliest_message_time_of_empty_and_written_queues(make_store, manual_clock):
    store = make_store()
    assert store.earliest_message_time("T", 0) == -1
    manual_clock.now = 1_700_000_000_500
    put_n(store, 1)
    manual_clock.now = 1_700_000_000_900
    put_n(store, 1)
    store.wait_dispatched()
    assert store.earliest_message_time("T", 0) == 1_700_000_000_500
    assert store.earliest_message_time("T", 1) == -1
    assert store.earliest_message_time("nope", 0) == -1


def test_topics_and_queue_ids(make_store):
    store = make_store()
    assert store.topics() == []
    put_n(store, 1, topic="T", queue_id=3)
    put_n(store, 1, topic="T", queue_id=0)
    put_n(store, 1, topic="U", queue_id=1)
    store.wait_dispatched()
    assert store.topics() == ["T", "U"]
    assert store.queue_ids("T") == [0, 3]
    assert store.queue_ids("U") == [1]
    assert store.queue_ids("nope") == []


def test_message_by_id_round_trip(make_store, manual_clock):
    store = make_store()
    put_n(store, 2)
    r = store.put(Message("T", b"payload", tags="TagA", keys="k1", queue_id=2))
    assert r.status is PutStatus.PUT_OK
    store.wait_dispatched()
    msg = store.message_by_id(r.msg_id)
    assert msg is not None
    assert msg.msg_id == r.msg_id
    assert msg.phys_offset == r.phys_offset
    assert msg.size == r.size
    assert msg.topic == "T"
    assert msg.queue_id == 2
    assert msg.queue_offset == 0
    assert msg.body == b"payload"
    assert msg.tags == "TagA"
    assert msg.keys == ["k1"]
    assert msg.store_timestamp == manual_clock.now
    at = store.message_at(r.phys_offset)
    assert at is not None and at.raw == msg.raw
    assert store.message_at(r.phys_offset + 1) is None

"""Deleting a topic (RocketMQ's deleteTopic) and resetting a group's offsets.

A deleted topic loses its config, consume queues and every group's offsets and pop state; its
records stay in the commit log until cleanup, and nothing that dispatches them again (an
abnormal recovery walking the whole log, ``check --fix``) brings the queues back. A reset moves
committed offsets, by offset or by store time, and a consumer of the group resumes exactly
there.
"""

from __future__ import annotations

import os

import pytest

from mqstore import Message, MessageStore, PutStatus
from mqstore.errors import InUseError, TopicNotFoundError
from mqstore.ops.checking.checker import check_store
from mqstore.storage.deleted_topics import read_deleted

pytestmark = pytest.mark.usefixtures("no_plugin_env")


def fill(store, topic: str, n: int, **kw) -> list:
    results = [store.put(Message(topic, b"%s-%d" % (topic.encode(), i), **kw)) for i in range(n)]
    assert all(r.status is PutStatus.PUT_OK for r in results)
    return results


def force_full_recovery(root) -> None:
    """Leave the store as a crash would, with nothing to say where dispatch had got: the next
    open walks and re-dispatches the whole commit log."""
    for name in ("mqstore.clean", "mqstore.queued", "mqstore.indexed"):
        try:
            os.remove(root / name)
        except FileNotFoundError:
            pass
    (root / "abort").write_text("1")


@pytest.mark.loops("thread")
def test_delete_takes_config_queues_and_consumer_state_and_leaves_the_records(
        make_store, store_dir):
    store = make_store()
    store.create_topic("A", queues=2)
    put = fill(store, "A", 10)
    fill(store, "B", 3)
    store.wait_dispatched()
    with store.consumer("billing", "A", consume_from="first") as c:
        assert len(c.poll(4)) == 4
        c.commit()
    assert len(store.pop("popper", "A", 3, consume_from="first")) == 3
    store.register_subscription("filtered", "A", "n > 1")
    assert {t for t, _g in store.consumer_groups()} == {"A"}

    removal = store.delete_topic("A")
    assert (removal.topic, removal.queues, removal.groups) == ("A", [0, 1],
                                                               ["billing", "popper"])
    assert removal.config.write_queue_nums == 2
    assert removal.records_below == store.max_phys_offset
    assert store.topic_config("A") is None and store.topics() == ["B"]
    assert store.consume_queue("A", 0) is None
    assert not (store_dir / "consumequeue" / "A").exists()
    assert store.consumer_groups() == {}
    assert store.subscriptions.for_topic("A") == []
    assert read_deleted(str(store_dir)) == {"A": removal.records_below}
    # The records stay in the commit log until cleanup.
    assert store.message_at(put[3].phys_offset).body == b"A-3"
    assert sum(store.max_offset("B", q) for q in store.queue_ids("B")) == 3
    # The name is free: a put creates a new topic whose queues start at offset 0.
    again = store.put(Message("A", b"new"))
    assert again.status is PutStatus.PUT_OK and again.queue_offset == 0
    assert store.topic_config("A").write_queue_nums == 4


@pytest.mark.loops("thread")
def test_a_deleted_topic_stays_deleted_when_its_records_are_dispatched_again(
        make_store, store_dir):
    store = make_store()
    fill(store, "A", 10, queue_id=0)
    fill(store, "B", 5, queue_id=0)
    fill(store, "A", 4, queue_id=1)
    store.wait_dispatched()
    store.delete_topic("A")
    new = store.put(Message("A", b"after", queue_id=0))
    store.close()

    force_full_recovery(store_dir)
    store = make_store()
    assert store.recovery_report.redispatch_from == 0  # every old record of A walked again
    assert store.topics() == ["A", "B"]
    assert (store.max_offset("A", 0), store.max_offset("A", 1)) == (1, 0)
    (msg,) = store.get("g", "A", 0, 0, 10).messages
    assert (msg.body, msg.phys_offset) == (b"after", new.phys_offset)
    assert store.max_offset("B", 0) == 5
    store.close()

    report = check_store(str(store_dir), store.config)
    assert report.problems == [] and report.records == 20


def test_delete_needs_the_queues_written_in_its_process(make_store):
    store = make_store()  # dispatch in a worker process
    fill(store, "A", 2)
    with pytest.raises(PermissionError, match=r"dispatch\.worker: thread"):
        store.delete_topic("A")
    assert store.topics() == ["A"] or store.queue_ids("A") == []


@pytest.mark.loops("thread")
def test_delete_is_refused_while_a_consumer_reads_the_topic(make_store, store_dir):
    store = make_store()
    store.create_topic("A")
    fill(store, "A", 4)
    store.wait_dispatched()
    consumer = store.consumer("live", "A", consume_from="first")
    consumer.poll(1)
    with pytest.raises(InUseError, match=r"topic 'A' is being consumed: group 'live' has 1 "
                                         r"live instance\(s\); stop them before deleting it"):
        store.delete_topic("A")
    assert store.topic_config("A") is not None and len(store.queue_ids("A")) == 4
    consumer.close()
    assert store.delete_topic("A").queues == [0, 1, 2, 3]


@pytest.mark.loops("thread")
def test_delete_of_a_topic_the_store_never_had(make_store):
    store = make_store()
    fill(store, "B", 1)
    with pytest.raises(TopicNotFoundError, match="topic 'Nope' does not exist in"):
        store.delete_topic("Nope")
    with pytest.raises(ValueError, match="topic '../x' must match"):
        store.delete_topic("../x")
    assert read_deleted(str(store.root)) == {}


# -- reset offsets -------------------------------------------------------------------------
def two_batches(store, clock, topic="T"):
    """Four messages per queue stored at t0, then four more at t0 + 10 s; returns the second
    batch's start time and its first offset per queue."""
    store.create_topic(topic, queues=2)
    fill(store, topic, 8)
    clock.advance(10_000)
    t1 = clock()
    second = fill(store, topic, 8)
    store.wait_dispatched()
    first_of_second = {}
    for r in second:
        first_of_second.setdefault(r.queue_id, r.queue_offset)
    return t1, first_of_second


def test_reset_by_time_then_a_consumer_resumes_exactly_there(make_store, manual_clock):
    store = make_store()
    t1, starts = two_batches(store, manual_clock)
    assert starts == {0: 4, 1: 4}
    with store.consumer("g", "T", consume_from="first") as c:
        assert len(c.poll(100)) == 16
        c.commit()
    resets = store.reset_consumer_offsets("g", "T", timestamp_ms=t1)
    assert [(r.queue_id, r.before, r.after, r.min_offset, r.max_offset) for r in resets] == [
        (0, 8, 4, 0, 8), (1, 8, 4, 0, 8)]
    with store.consumer("g", "T") as c:
        got = c.poll(100)
        assert sorted((m.queue_id, m.queue_offset) for m in got) == [
            (q, o) for q in (0, 1) for o in range(4, 8)]
        assert all(m.store_timestamp >= t1 for m in got)
    # By offset, clamped to the queue; one queue only.
    (r,) = store.reset_consumer_offsets("g", "T", offset=99, queue_id=1)
    assert (r.queue_id, r.before, r.after) == (1, 4, 8)
    assert store.consumer_lag("g", "T")[1].committed_offset == 8


def test_reset_moves_a_pop_group_and_forgets_its_deliveries(make_store, manual_clock):
    store = make_store()
    t1, _starts = two_batches(store, manual_clock)
    popped = store.pop("p", "T", 32, consume_from="first")
    assert len(popped) == 16
    store.reset_consumer_offsets("p", "T", timestamp_ms=t1)
    again = store.pop("p", "T", 32)
    assert sorted((m.queue_id, m.queue_offset) for m in again) == [
        (q, o) for q in (0, 1) for o in range(4, 8)]
    assert {m.delivery_attempt for m in again} == {1}


def test_reset_is_refused_while_the_group_consumes(make_store, manual_clock):
    store = make_store()
    two_batches(store, manual_clock)
    live = store.consumer("g", "T", consume_from="first")
    live.poll(1)
    with pytest.raises(InUseError, match=r"group 'g' has live instances \(1 on 'T'\): they "
                                         r"would go on from the offsets they hold; stop them "
                                         r"before resetting its offsets"):
        store.reset_consumer_offsets("g", "T", offset=0)
    live.close()
    with pytest.raises(ValueError, match="give exactly one of offset and timestamp_ms"):
        store.reset_consumer_offsets("g", "T")
    with pytest.raises(ValueError, match="offset -1 must be an int"):
        store.reset_consumer_offsets("g", "T", offset=-1)
    with pytest.raises(TopicNotFoundError):
        store.reset_consumer_offsets("g", "Nothing", offset=0)


def test_reset_from_a_read_only_store_beside_the_writer(make_store, manual_clock, store_dir):
    writer = make_store()
    t1, _starts = two_batches(writer, manual_clock)
    reader = make_store(read_only=True)
    resets = reader.reset_consumer_offsets("side", "T", timestamp_ms=t1)
    assert [r.after for r in resets] == [4, 4]
    assert writer.consumer_groups()[("T", "side")] == {0: 4, 1: 4}
    assert isinstance(reader, MessageStore) and reader.read_only

"""The pop consumer (issue 14, RocketMQ 5's SimpleConsumer): pop, ack, redelivery with
delivery_attempt + 1 after the invisible time, change_invisible_duration handing out a new
handle, stale and unknown handles refused, pops spread over every queue, state that survives a
restart and a SIGKILL, and long polling."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from mqstore import Message, MessageStore
from mqstore.consumer import PoppedMessage, ReceiptHandleError, StaleReceiptHandleError
from mqstore.consumer import pop as pop_module
from mqstore.consumer.pop_journal import PopJournal
from mqstore.consumer.pop_state import POP_DIR, pop_state_path
from mqstore.testing import fill, patience

TOPIC = "T"
SLACK_S = 10.0  # how late a timed-out wait may return on a loaded machine


def state_of(store, group: str) -> dict:
    """The group's pop state as other processes see it (checkpoint plus journal)."""
    journal = PopJournal(store.root, TOPIC, group)
    try:
        state = journal.snapshot()
    finally:
        journal.close()
    return {str(q): {"offset": nxt, "inflight": {str(o): list(v) for o, v in
                                                 state.inflight.get(q, {}).items()}}
            for q, nxt in state.next.items()}


def pop_files(store) -> dict:
    folder = os.path.join(store.root, POP_DIR)
    out = {}
    for name in sorted(os.listdir(folder)):
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def put_all(store, per_queue: int, queues: int = 4, tags=None) -> None:
    fill(store, per_queue * queues, topic=TOPIC, queues=queues, body=lambda i: b"p%04d" % i,
         tags=tags)


def keys(popped) -> list[tuple[int, int, int]]:
    return sorted((m.queue_id, m.queue_offset, m.delivery_attempt) for m in popped)


def test_pop_then_ack_delivers_each_message_once(make_store):
    store = make_store()
    put_all(store, 3, queues=2)
    first = store.pop("g", TOPIC, 4, 30_000, consume_from="first")
    assert all(isinstance(m, PoppedMessage) for m in first)
    # As RocketMQ's broker pops: each queue in turn fills what room is left, and the next pop
    # starts at the next queue.
    assert keys(first) == [(0, 0, 1), (0, 1, 1), (0, 2, 1), (1, 0, 1)]
    assert [m.body for m in first if m.queue_id == 0] == [b"p0000", b"p0002", b"p0004"]
    rest = store.pop("g", TOPIC, 10, 30_000)
    assert keys(rest) == [(1, 1, 1), (1, 2, 1)]
    for m in first + rest:
        store.ack(m.receipt_handle)
    assert store.pop("g", TOPIC, 10, 30_000) == []
    assert state_of(store, "g") == {"0": {"offset": 3, "inflight": {}},
                                    "1": {"offset": 3, "inflight": {}}}
    assert store.consumer_groups()[(TOPIC, "g")] == {0: 3, 1: 3}
    assert [lag.lag for lag in store.consumer_lag("g", TOPIC)] == [0, 0]


def test_an_unacked_message_comes_back_with_the_next_attempt(make_store, manual_clock):
    store = make_store()
    put_all(store, 2, queues=2)
    popped = store.pop("g", TOPIC, 4, 10_000, consume_from="first")
    store.ack(popped[0].receipt_handle)
    assert {m.invisible_until_ms for m in popped} == {manual_clock.now + 10_000}
    manual_clock.advance(9_999)
    assert store.pop("g", TOPIC, 4, 10_000) == []  # still invisible
    manual_clock.advance(1)
    again = store.pop("g", TOPIC, 4, 10_000)
    assert keys(again) == sorted((m.queue_id, m.queue_offset, 2) for m in popped[1:])
    assert {m.body for m in again} == {m.body for m in popped[1:]}
    assert not {m.receipt_handle for m in again} & {m.receipt_handle for m in popped}
    with pytest.raises(StaleReceiptHandleError, match=r"was delivered again \(attempt 2\)"):
        store.ack(popped[1].receipt_handle)
    with pytest.raises(StaleReceiptHandleError, match=r"was acknowledged"):
        store.ack(popped[0].receipt_handle)
    manual_clock.advance(10_000)
    third = store.pop("g", TOPIC, 4, 10_000)
    assert {m.delivery_attempt for m in third} == {3}
    for m in third:
        store.ack(m.receipt_handle)
    manual_clock.advance(60_000)
    assert store.pop("g", TOPIC, 4, 10_000) == []


def test_changing_the_invisible_time_hands_out_a_new_handle(make_store, manual_clock):
    store = make_store()
    put_all(store, 1, queues=1)
    (m,) = store.pop("g", TOPIC, 1, 5_000, consume_from="first")
    manual_clock.advance(4_000)
    new = store.change_invisible_duration(m.receipt_handle, 20_000)
    assert new != m.receipt_handle
    with pytest.raises(StaleReceiptHandleError, match=r"got a new invisible time"):
        store.ack(m.receipt_handle)
    with pytest.raises(StaleReceiptHandleError):
        store.change_invisible_duration(m.receipt_handle, 1_000)
    manual_clock.advance(19_999)
    assert store.pop("g", TOPIC, 1, 5_000) == []  # 20 s from the change, not 5 s from the pop
    newer = store.change_invisible_duration(new, 0)
    (back,) = store.pop("g", TOPIC, 1, 5_000)
    assert (back.queue_offset, back.delivery_attempt) == (0, 2)
    with pytest.raises(StaleReceiptHandleError):
        store.ack(newer)
    store.ack(back.receipt_handle)


@pytest.mark.parametrize("handle, needle", [
    ("garbage", "receipt handle 'garbage' is not one this store hands out"),
    ("mq1:T:g:0:0:1", "is not one this store hands out"),
    ("mq2:T:g:0:0:1:1", "is not one this store hands out"),
    ("mq1:T:g:0:-1:1:1", "is not one this store hands out"),
    ("mq1:../x:g:0:0:1:1", "is not one this store hands out"),
    ("mq1:T:nobody:0:0:1:1", "group 'nobody' has popped nothing from topic 'T'"),
    ("mq1:T:g:0:7:1:1", "queue 0 offset 7 was never popped by this group"),
    ("mq1:T:g:5:0:1:1", "queue 5 offset 0 was never popped by this group"),
    (None, "receipt handle None is not one this store hands out"),
])
def test_unknown_handles_are_refused_and_change_nothing(make_store, handle, needle):
    store = make_store()
    put_all(store, 1, queues=1)
    store.pop("g", TOPIC, 1, 30_000, consume_from="first")
    before = pop_files(store)
    for call in (lambda: store.ack(handle),
                 lambda: store.change_invisible_duration(handle, 1_000)):
        with pytest.raises(ReceiptHandleError) as err:
            call()
        assert needle in str(err.value)
        assert not isinstance(err.value, StaleReceiptHandleError)
    assert pop_files(store) == before
    assert not os.path.exists(pop_state_path(store.root, TOPIC, "nobody"))


@pytest.mark.parametrize("kwargs, needle", [
    ({"max_msgs": 0}, "max_msgs 0 must be an int >= 1"),
    ({"invisible_ms": -1}, "invisible_ms -1 must be an int >= 0"),
    ({"wait_ms": -5}, "wait_ms -5 must be a number >= 0"),
    ({"group": "a:b"}, "group 'a:b' must match"),
    ({"consume_from": "timestamp"},
     "consume_from 'timestamp' must be one of 'first', 'last', 'max' for pops"),
    ({"expression": "a ||| ", "expression_type": "SQL92"}, "SQL92"),
])
def test_bad_pop_arguments_are_refused_before_any_state_is_written(make_store, kwargs, needle):
    store = make_store()
    put_all(store, 1, queues=1)
    args = {"group": "g", "topic": TOPIC, "max_msgs": 1, "invisible_ms": 1_000, **kwargs}
    with pytest.raises(ValueError) as err:
        store.pop(**args)
    assert needle in str(err.value)
    assert not os.path.exists(os.path.join(store.root, "consumer", "pop"))
    with pytest.raises(ValueError, match="invisible_ms -3 must be an int >= 0"):
        store.change_invisible_duration("mq1:T:g:0:0:1:1", -3)


def test_pops_take_every_queue_in_turn(make_store):
    store = make_store()
    put_all(store, 10, queues=4)
    # The first queue fills what it can (one read), the next queues what room is left.
    popped = store.pop("g", TOPIC, 12, 30_000, consume_from="first")
    assert [(m.queue_id, m.queue_offset) for m in popped] == (
        [(0, o) for o in range(10)] + [(1, 0), (1, 1)])
    store.ack([m.receipt_handle for m in popped])
    put_all(store, 10, queues=4)  # queue 0 has messages again
    # The first queue rotates from pop to pop, so every queue leads in turn.
    firsts = [store.pop("g", TOPIC, 1, 30_000)[0].queue_id for _ in range(4)]
    assert sorted(firsts) == [0, 1, 2, 3]
    # One queue runs dry: the others fill the batch.
    rest = store.pop("g", TOPIC, 100, 30_000)
    assert len(popped) + 4 + len(rest) == 80 and {m.queue_id for m in rest} == {0, 1, 2, 3}


def test_filters_apply_to_pops(make_store):
    store = make_store()
    put_all(store, 6, queues=2, tags=lambda i: "keep" if i % 3 == 0 else "skip")
    popped = store.pop("g", TOPIC, 32, 30_000, expression="keep", consume_from="first")
    assert sorted(m.body for m in popped) == [b"p%04d" % i for i in range(12) if i % 3 == 0]
    assert all(m.tags == "keep" for m in popped)


def test_pop_state_survives_a_restart(make_store, store_dir, manual_clock):
    store = make_store()
    put_all(store, 2, queues=2)
    popped = store.pop("g", TOPIC, 4, 10_000, consume_from="first")
    store.close()
    store = make_store()
    store.ack(popped[0].receipt_handle)  # handles outlive the process that handed them out
    assert store.pop("g", TOPIC, 4, 10_000) == []
    manual_clock.advance(10_000)
    assert keys(store.pop("g", TOPIC, 4, 10_000)) == sorted(
        (m.queue_id, m.queue_offset, 2) for m in popped[1:])


_POPPER = """
import sys
from mqstore import MessageStore, load_config
from mqstore.clock import _attach_clock
store = MessageStore.open(sys.argv[1], read_only=True, clock=_attach_clock(sys.argv[2]),
                          config=load_config(overrides={"plugins": {"load_entry_points": False}}))
while True:
    got = store.pop("g", "T", 3, 10_000, consume_from="first")
    for i, m in enumerate(got):
        print("popped", m.queue_id, m.queue_offset, m.receipt_handle, flush=True)
        if m.queue_offset % 2 == 0:
            store.ack(m.receipt_handle)
            print("acked", m.queue_id, m.queue_offset, flush=True)
    if not got:
        print("idle", flush=True)
        sys.stdin.readline()  # wait to be killed
"""


def test_pop_state_survives_a_sigkill(make_store, store_dir, manual_clock):
    store = make_store()
    put_all(store, 5, queues=2)
    child = subprocess.Popen([sys.executable, "-c", _POPPER, str(store_dir),
                              manual_clock._shm.name], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines = []
    try:
        for line in child.stdout:
            lines.append(line.split())
            if lines[-1][0] == "idle":
                break
    finally:
        child.kill()
        child.wait(30)
    popped = {(int(line[1]), int(line[2])) for line in lines if line[0] == "popped"}
    acked = {(int(line[1]), int(line[2])) for line in lines if line[0] == "acked"}
    assert popped == {(q, o) for q in range(2) for o in range(5)}, child.stderr.read()
    assert acked == {(q, o) for q, o in popped if o % 2 == 0}
    assert store.pop("g", TOPIC, 10, 10_000) == []  # all in flight
    manual_clock.advance(10_000)
    again = store.pop("g", TOPIC, 10, 10_000)
    assert keys(again) == sorted((q, o, 2) for q, o in popped - acked)


def test_a_waiting_pop_returns_when_a_message_arrives(make_store, monkeypatch, wakeup_watch):
    # No look before the wait's end but on a notification: a pop that returned before its
    # 20 s (it measures itself) was woken, however loaded the machine.
    monkeypatch.setattr(pop_module, "MAX_WAIT_SLICE_S", 3600.0)
    store = make_store()
    put_all(store, 1, queues=1)
    assert len(store.pop("g", TOPIC, 1, 60_000, consume_from="first")) == 1
    box = {}

    def wait() -> None:
        began = time.monotonic()
        box["got"] = store.pop("g", TOPIC, 1, 60_000, wait_ms=20_000)
        box["seconds"] = time.monotonic() - began
    t = threading.Thread(target=wait)
    mark = wakeup_watch.mark()
    t.start()
    wakeup_watch.asleep(mark)
    assert t.is_alive()
    store.put(Message(TOPIC, b"late", queue_id=0))
    t.join(20 + SLACK_S)
    assert box["seconds"] < 20
    assert [(m.queue_offset, m.body) for m in box["got"]] == [(1, b"late")]
    began = time.monotonic()
    assert store.pop("g", TOPIC, 1, 60_000, wait_ms=300) == []
    assert 0.3 <= time.monotonic() - began < 0.3 + patience(SLACK_S)


def test_a_new_pop_group_starts_at_the_end_of_every_queue_unless_told_first(make_store):
    store = make_store()
    put_all(store, 3, queues=3)
    assert store.pop("late", TOPIC, 10, 60_000) == []  # consume_from="last": the end of each
    assert {q: e["offset"] for q, e in state_of(store, "late").items()} == {
        "0": 3, "1": 3, "2": 3}
    store.put(Message(TOPIC, b"after", queue_id=1))
    store.put(Message(TOPIC, b"new queue", queue_id=5))  # new to the group: from its start
    store.wait_dispatched()
    assert sorted((m.queue_id, m.queue_offset, m.body) for m in store.pop(
        "late", TOPIC, 10, 60_000)) == [(1, 3, b"after"), (5, 0, b"new queue")]


def test_a_new_pop_group_in_max_mode_starts_where_rocketmq_5s_proxy_starts_it(make_store):
    """ConsumeInitMode.MAX with initPopOffsetByCheckMsgInMem: a queue still holding offset 0
    starts there; one whose first messages cleanup deleted starts at its last message."""
    store = make_store({"commit_log": {"segment_bytes": 4096}})
    for i in range(60):
        store.put(Message(TOPIC, b"old %02d" % i + b"x" * 200, queue_id=0))
    store.wait_dispatched()
    store.delete_expired_segments(force=True, max_segments=2)
    low, high = store.min_offset(TOPIC, 0), store.max_offset(TOPIC, 0)
    assert 0 < low < high - 1 == 59
    for i in range(3):
        store.put(Message(TOPIC, b"new %d" % i, queue_id=1))
    store.wait_dispatched()
    got = store.pop("proxy-like", TOPIC, 32, 60_000, consume_from="max")
    assert sorted((m.queue_id, m.queue_offset) for m in got) == [(0, 59), (1, 0), (1, 1), (1, 2)]
    assert store.pop("proxy-like", TOPIC, 32, 60_000, consume_from="max") == []


def test_a_waiting_first_pop_gets_what_arrives_in_a_new_queue(make_store, wakeup_watch):
    store = make_store()
    box = {}

    def wait() -> None:
        box["got"] = store.pop("early", TOPIC, 4, 60_000, wait_ms=20_000)
    t = threading.Thread(target=wait)
    mark = wakeup_watch.mark()
    t.start()
    wakeup_watch.asleep(mark)
    store.put(Message(TOPIC, b"first ever", queue_id=2))
    t.join(20 + SLACK_S)
    assert [(m.queue_id, m.queue_offset, m.body) for m in box["got"]] == [(2, 0, b"first ever")]


def test_forgetting_a_pop_group_removes_its_state(make_store):
    store = make_store()
    put_all(store, 1, queues=1)
    (m,) = store.pop("g", TOPIC, 1, 60_000, consume_from="first")
    assert store.delete_consumer_group("g") == [(TOPIC, "g")]
    assert not os.path.exists(pop_state_path(store.root, TOPIC, "g"))
    with pytest.raises(ReceiptHandleError, match="has popped nothing"):
        store.ack(m.receipt_handle)
    with MessageStore.open(store.root, read_only=True) as reader:
        assert reader.consumer_groups() == {}


def test_a_batch_ack_answers_every_handle_in_order(make_store, manual_clock):
    store = make_store()
    put_all(store, 3, queues=2)
    popped = store.pop("g", TOPIC, 6, 10_000, consume_from="first")
    (other,) = store.pop("h", TOPIC, 1, 10_000, consume_from="first")
    assert len(popped) == 6
    first, second = popped[:2]
    store.ack(first.receipt_handle)
    manual_clock.advance(10_000)
    again = {(m.queue_id, m.queue_offset): m for m in store.pop("g", TOPIC, 6, 10_000)}
    assert sorted(again) == sorted((m.queue_id, m.queue_offset) for m in popped[1:])
    b2, c2, d2, *rest2 = [again[m.queue_id, m.queue_offset] for m in popped[1:]]
    handles = [c2.receipt_handle, first.receipt_handle, "junk", second.receipt_handle,
               other.receipt_handle, c2.receipt_handle, "mq2:T:nobody:0:0:1:1:00000000",
               b2.receipt_handle]
    results = store.ack(handles)
    assert len(results) == len(handles)
    assert [type(r).__name__ for r in results] == [
        "NoneType", "StaleReceiptHandleError", "ReceiptHandleError", "StaleReceiptHandleError",
        "NoneType", "StaleReceiptHandleError", "ReceiptHandleError", "NoneType"]
    assert "was acknowledged" in str(results[1])
    assert "receipt handle 'junk' is not one this store hands out" in str(results[2])
    assert "was delivered again (attempt 2)" in str(results[3])
    assert "was acknowledged" in str(results[5])  # the same handle twice in one batch
    assert "is not one this store hands out" in str(results[6])  # its check does not match
    assert store.ack([]) == []
    assert store.ack((d2.receipt_handle,)) == [None]
    # What the batches acknowledged stays acknowledged: only the others come back.
    manual_clock.advance(10_000)
    assert keys(store.pop("g", TOPIC, 6, 10_000)) == sorted(
        (m.queue_id, m.queue_offset, 3) for m in rest2)
    rest_h = store.pop("h", TOPIC, 6, 10_000)  # its first message was acknowledged
    assert len(rest_h) == 5 and {m.delivery_attempt for m in rest_h} == {1}
    assert (other.queue_id, other.queue_offset) not in {(m.queue_id, m.queue_offset)
                                                         for m in rest_h}


def test_a_garbled_handle_is_refused_as_never_handed_out(make_store):
    store = make_store()
    put_all(store, 1, queues=1)
    (m,) = store.pop("g", TOPIC, 1, 30_000, consume_from="first")
    handle = m.receipt_handle
    assert handle.startswith("mq2:T:g:0:0:1:")
    text, _, check = handle.rpartition(":")
    delivery = text.rpartition(":")[2]
    bumped = text[:-len(delivery)] + format(int(delivery, 16) + 1, "x")
    for bad in (f"{bumped}:{check}",                      # another delivery, old check
                handle.replace(":0:0:1:", ":0:0:2:"),     # another attempt
                handle[:-1] + ("0" if handle[-1] != "0" else "1"),
                handle + ":1", handle[:-9]):
        with pytest.raises(ReceiptHandleError) as err:
            store.ack(bad)
        assert not isinstance(err.value, StaleReceiptHandleError)
        assert "is not one this store hands out" in str(err.value)
    store.ack(handle)


def test_handles_are_unique_per_delivery(make_store, manual_clock):
    store = make_store()
    put_all(store, 2, queues=2)
    seen = set()
    popped = store.pop("g", TOPIC, 4, 1_000, consume_from="first")
    seen |= {m.receipt_handle for m in popped}
    for _ in range(3):
        m = popped[0]
        popped[0].receipt_handle = store.change_invisible_duration(m.receipt_handle, 1_000)
        seen.add(popped[0].receipt_handle)
        manual_clock.advance(1_000)
        popped = store.pop("g", TOPIC, 4, 1_000)
        seen |= {m.receipt_handle for m in popped}
    assert len(seen) == 4 + 3 * 5


def _drop_first_segments(make_store, scheduler):
    store = make_store({"commit_log": {"segment_bytes": 4096},
                        "cleanup": {"interval_ms": 30, "file_reserved_hours": 0,
                                    "delete_when": ";".join(str(h) for h in range(24))}},
                       scheduler=scheduler)
    i = 0
    while len(store.internals.commit_log.segments.segments) < 4:
        store.put(Message(TOPIC, b"%05d" % i + b"x" * 300, queue_id=0))
        i += 1
    store.wait_dispatched()
    scheduler.run("cleanup")
    return store, i


def test_consume_from_max_starts_at_the_first_message_while_offset_0_is_stored(make_store):
    store = make_store()
    put_all(store, 3, queues=2)
    popped = store.pop("g", TOPIC, 10, 30_000, consume_from="max")
    assert keys(popped) == [(q, o, 1) for q in (0, 1) for o in range(3)]
    # An empty queue: from its start, so the first message put there is received.
    assert store.pop("e", "Empty", 10, 30_000, consume_from="max") == []
    store.put(Message("Empty", b"first", queue_id=0))
    store.wait_dispatched()
    assert [m.body for m in store.pop("e", "Empty", 10, 30_000, consume_from="max")] == [
        b"first"]


def test_consume_from_max_starts_at_the_last_message_once_offset_0_is_gone(make_store,
                                                                         manual_scheduler):
    store, count = _drop_first_segments(make_store, manual_scheduler)
    high = store.max_offset(TOPIC, 0)
    assert high == count and store.min_offset(TOPIC, 0) > 0
    (m,) = store.pop("g", TOPIC, 10, 30_000, consume_from="max")
    assert m.queue_offset == high - 1 and m.body.startswith(b"%05d" % (count - 1))
    assert store.pop("late", TOPIC, 10, 30_000) == []  # "last" still starts past the end
    assert [m.queue_offset for m in store.pop("all", TOPIC, 1, 30_000, consume_from="first")
            ] == [store.min_offset(TOPIC, 0)]


def test_a_version_1_state_file_and_its_handles_are_read(make_store, store_dir, manual_clock):
    store = make_store()
    put_all(store, 3, queues=1)
    store.close()
    until = manual_clock.now + 10_000
    os.makedirs(store_dir / "consumer" / "pop")
    with open(pop_state_path(str(store_dir), TOPIC, "g"), "w") as f:
        json.dump({"version": 1, "delivery": 7, "rotate": 1, "queues": {
            "0": {"offset": 2, "inflight": {"0": [1, until, 6], "1": [2, until, 7]}}}}, f)
    store = make_store()
    store.ack("mq1:T:g:0:0:1:6")
    with pytest.raises(StaleReceiptHandleError, match="got a new invisible time"):
        store.ack("mq1:T:g:0:1:2:5")
    assert keys(store.pop("g", TOPIC, 10, 10_000)) == [(0, 2, 1)]
    manual_clock.advance(10_000)
    assert keys(store.pop("g", TOPIC, 10, 10_000)) == [(0, 1, 3), (0, 2, 2)]
    assert store.consumer_groups()[(TOPIC, "g")] == {0: 1}


def test_threads_of_one_process_never_pop_a_message_twice(make_store):
    store = make_store()
    put_all(store, 50, queues=4)
    got: list = []

    def popper() -> None:
        while True:
            popped = store.pop("g", TOPIC, 3, 60_000, consume_from="first")
            if not popped:
                return
            got.extend((m.queue_id, m.queue_offset) for m in popped)
            assert store.ack([m.receipt_handle for m in popped[::2]]) == [None] * len(
                popped[::2])
    threads = [threading.Thread(target=popper) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert len(got) == len(set(got)) == 200


def test_a_store_not_readable_for_a_moment_loses_no_redelivery(make_store, manual_clock,
                                                                monkeypatch):
    """``read`` answers None while the store is not readable: messages due again wait for the
    next pop (before the journal they were dropped from the state, never delivered again)."""
    store = make_store()
    put_all(store, 1, queues=2)
    popped = store.pop("g", TOPIC, 2, 1_000, consume_from="first")
    manual_clock.advance(1_000)
    with monkeypatch.context() as patch:
        # What the consumers read of the store (consumer.store_side) answers None.
        patch.setattr(store._consumers.store, "read", lambda *args, **kwargs: None)
        assert store.pop("g", TOPIC, 2, 1_000) == []
    assert keys(store.pop("g", TOPIC, 2, 1_000)) == sorted(
        (m.queue_id, m.queue_offset, 2) for m in popped)


def test_a_pop_takes_no_more_bytes_than_max_bytes(make_store, manual_clock):
    """``max_bytes``: new messages and redeliveries alike stop before the record that would
    pass it, the first whatever its size; what is left waits for the next pop, in order."""
    store = make_store()
    store.put_batch([Message(TOPIC, b"%d" % i + b"x" * 999, queue_id=0) for i in range(6)])
    store.wait_dispatched()
    size = int(store.read(TOPIC, 0, 0, 1).sizes[0])
    first = store.pop("g", TOPIC, 32, 10_000, consume_from="first", max_bytes=int(2.5 * size))
    assert [m.queue_offset for m in first] == [0, 1]
    assert [m.queue_offset for m in store.pop("g", TOPIC, 32, 10_000, max_bytes=1)] == [2]
    with pytest.raises(ValueError, match="max_bytes 0 must be an int >= 1"):
        store.pop("g", TOPIC, 32, 10_000, max_bytes=0)
    manual_clock.advance(10_000)  # the three come back, two of them first
    again = store.pop("g", TOPIC, 32, 10_000, max_bytes=2 * size)
    assert [(m.queue_offset, m.delivery_attempt) for m in again] == [(0, 2), (1, 2)]
    rest = store.pop("g", TOPIC, 32, 10_000)
    assert sorted((m.queue_offset, m.delivery_attempt) for m in rest) == [
        (2, 2), (3, 1), (4, 1), (5, 1)]

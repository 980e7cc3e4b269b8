"""FIFO consumer groups (``consumeMessageOrderly``) through the embedding API: a queue with a
message in flight hands out nothing newer; redelivery in queue order with attempt + 1; an
older message given more time holds the newer ones back; max attempts, the DLQ, then the
next; two stores of one group never hold one queue at once; SIGKILL mid-sequence keeps the
order. A normal group's pops are unchanged."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from mqstore import Message
from mqstore.testing import wait_for

TOPIC = "T"


def put(store, queue_id, *bodies):
    for body in bodies:
        result = store.put(Message(topic=TOPIC, body=body, queue_id=queue_id))
        assert result.status.stored
    wait_for(lambda: store.max_offset(TOPIC, queue_id) >= result.queue_offset + 1)


def seen(msgs):
    return [(m.queue_id, m.queue_offset, m.delivery_attempt) for m in msgs]


@pytest.fixture
def fifo_store(make_store):
    store = make_store()
    store.set_group_config("G", consume_message_orderly=True)
    assert store.group_config("G").orderly
    return store


def test_a_queue_in_flight_hands_out_nothing_newer(fifo_store):
    store = fifo_store
    put(store, 0, b"a0", b"a1", b"a2")
    put(store, 1, b"b0", b"b1")
    first = store.pop("G", TOPIC, 1, 60_000, consume_from="first")
    second = store.pop("G", TOPIC, 1, 60_000, consume_from="first")
    # each pop takes the oldest of a queue not in flight: the other queue, not offset 1
    assert sorted(seen(first + second)) == [(0, 0, 1), (1, 0, 1)]
    assert store.pop("G", TOPIC, 32, 60_000) == []
    store.ack([m.receipt_handle for m in first + second])
    again = store.pop("G", TOPIC, 32, 60_000)
    assert seen(again) == [(0, 1, 1), (0, 2, 1), (1, 1, 1)] or seen(again) == [
        (1, 1, 1), (0, 1, 1), (0, 2, 1)]
    assert store.pop("G", TOPIC, 32, 60_000) == []


def test_a_normal_group_is_unchanged(make_store):
    store = make_store()
    put(store, 0, b"a0", b"a1")
    first = store.pop("G", TOPIC, 1, 60_000, consume_from="first")
    second = store.pop("G", TOPIC, 1, 60_000, consume_from="first")
    assert seen(first + second) == [(0, 0, 1), (0, 1, 1)]


def test_redelivery_in_order_before_anything_newer(fifo_store, manual_clock):
    store = fifo_store
    put(store, 0, b"m0", b"m1")
    got = store.pop("G", TOPIC, 2, 1000, consume_from="first")
    assert seen(got) == [(0, 0, 1), (0, 1, 1)]
    put(store, 0, b"m2")
    assert store.pop("G", TOPIC, 32, 1000) == []  # m2 waits while m0, m1 are in flight
    manual_clock.advance(1001)
    again = store.pop("G", TOPIC, 32, 1000)
    assert seen(again) == [(0, 0, 2), (0, 1, 2)]
    assert [m.body for m in again] == [b"m0", b"m1"]
    store.ack([m.receipt_handle for m in again[:1]])
    assert store.pop("G", TOPIC, 32, 1000) == []  # m1 still in flight: m2 waits
    store.ack(again[1].receipt_handle)
    assert seen(store.pop("G", TOPIC, 32, 1000)) == [(0, 2, 1)]


def test_an_older_message_given_more_time_holds_the_newer_back(fifo_store, manual_clock):
    store = fifo_store
    put(store, 0, b"m0", b"m1", b"m2")
    m0, m1, m2 = store.pop("G", TOPIC, 3, 1000, consume_from="first")
    store.ack(m2.receipt_handle)  # acknowledged out of order: it stays done
    longer = store.change_invisible_duration(m0.receipt_handle, 10_000)
    manual_clock.advance(1001)
    assert store.pop("G", TOPIC, 32, 1000) == []  # m1 is due, but m0 is still in flight
    store.ack(longer)
    assert seen(store.pop("G", TOPIC, 32, 1000)) == [(0, 1, 2)]


def test_max_attempts_then_the_dlq_then_the_next(fifo_store, manual_clock):
    store = fifo_store
    store.set_group_config("G", retry_max_times=1)
    put(store, 0, b"m0")
    assert seen(store.pop("G", TOPIC, 8, 1000, consume_from="first")) == [(0, 0, 1)]
    put(store, 0, b"m1")
    manual_clock.advance(1001)
    assert seen(store.pop("G", TOPIC, 8, 1000)) == [(0, 0, 2)]  # m1 waits
    manual_clock.advance(1001)
    assert seen(store.pop("G", TOPIC, 8, 1000)) == [(0, 1, 1)]  # m0 dead-lettered
    store.wait_dispatched(30.0)
    dead = store.read("%DLQ%G", 0, 0, 10)
    assert len(dead) == 1 and dead.message(0).body == b"m0"
    assert dead.message(0).properties["DLQ_ORIGIN_TOPIC"] == TOPIC


def test_two_stores_of_one_group_never_hold_one_queue_at_once(fifo_store, make_store):
    store = fifo_store
    put(store, 0, b"m0", b"m1")
    reader = make_store(root=store.root, read_only=True)
    (m0,) = store.pop("G", TOPIC, 1, 60_000, consume_from="first")
    assert reader.pop("G", TOPIC, 32, 60_000) == []
    store.ack(m0.receipt_handle)
    assert seen(reader.pop("G", TOPIC, 32, 60_000)) == [(0, 1, 1)]
    assert store.pop("G", TOPIC, 32, 60_000) == []


_CHILD = textwrap.dedent("""
    import os, signal, sys
    from mqstore import MessageStore
    from mqstore.clock import ManualClock
    from mqstore.consumer import pop_journal
    root, now = sys.argv[1], int(sys.argv[2])
    append = pop_journal.PopJournal.append
    def append_then_die(self, rows, *args):
        append(self, rows, *args)
        os.kill(os.getpid(), signal.SIGKILL)
    pop_journal.PopJournal.append = append_then_die
    store = MessageStore.open(root, clock=ManualClock(now))
    got = store.pop("G", "T", 2, 1000, consume_from="first")
    store.ack([m.receipt_handle for m in got[:1]])  # the first record kills it: never acked
    print("not killed")
""")


def test_a_sigkill_mid_sequence_keeps_the_order(fifo_store, make_store, manual_clock):
    store = fifo_store
    put(store, 0, b"m0", b"m1", b"m2")
    root = store.root
    store.close()
    child = subprocess.run([sys.executable, "-c", _CHILD, str(root), str(manual_clock())],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    again = make_store(root=root)
    assert again.pop("G", TOPIC, 32, 1000) == []  # m0, m1 in flight: m2 waits
    manual_clock.advance(1001)
    redelivered = again.pop("G", TOPIC, 32, 1000)
    assert seen(redelivered) == [(0, 0, 2), (0, 1, 2)]
    again.ack([m.receipt_handle for m in redelivered])
    assert seen(again.pop("G", TOPIC, 32, 1000)) == [(0, 2, 1)]

"""Long polling (issue 14): a waiting poll is woken by the dispatch loop's notification
(NOTE [ Long polling ] in mqstore.runtime.workers.wakeup), in this process and in a read-only store of
another process, with the loops as worker processes or as threads; it sleeps instead of
polling while nothing comes. Wake-up latency is measured in benchmarks/bench_consumer.py."""

from __future__ import annotations

import os
import threading
import time

import pytest

from mqstore import Message
from mqstore.runtime.workers import wakeup as wakeup_module
from mqstore.runtime.workers.wakeup import Wakeup, wakeup_path
from mqstore.testing import consumer_proc, patience

TOPIC = "T"
LONG_MS = 20_000  # far longer than any wake-up may take: a poll returning early was woken
# No look before the timeout but on a notification: a poll that returned before LONG_MS
# (it measures itself) was woken, however loaded the machine.
NO_LOOKS = {"consumer": {"rebalance_interval_ms": 3_600_000}}
SLACK_S = 10.0  # how late a timed-out wait may return on a loaded machine


def _poll_in_thread(consumer, timeout_ms):
    box = {}

    def run():
        began = time.monotonic()
        box["polled"] = consumer.poll(8, timeout_ms)
        box["seconds"] = time.monotonic() - began
    t = threading.Thread(target=run)
    t.start()
    return t, box


def _woken_by_a_put(store, poller, watch) -> tuple[list, float]:
    """What ``poller`` returns when, already waiting, it is woken by a put to queue 0, and
    how long its poll took."""
    mark = watch.mark()
    t, box = _poll_in_thread(poller, LONG_MS)
    watch.asleep(mark)
    assert t.is_alive()  # nothing yet: still waiting
    store.put(Message(TOPIC, b"new", queue_id=0))
    t.join(LONG_MS / 1000 + SLACK_S)
    return box["polled"], box["seconds"]


@pytest.mark.parametrize("loops", ["process", "thread"])
def test_a_waiting_poll_returns_when_a_message_is_dispatched(make_store, loops, wakeup_watch):
    store = make_store({"dispatch": {"worker": loops}, "flush": {"worker": loops}, **NO_LOOKS})
    store.put(Message(TOPIC, b"old", queue_id=0))
    store.wait_dispatched()
    with store.consumer("lp", TOPIC) as c:  # from the end: "old" is not for it
        polled, took = _woken_by_a_put(store, c, wakeup_watch)
    assert [(m.queue_id, m.queue_offset, m.body) for m in polled] == [(0, 1, b"new")]
    assert took < LONG_MS / 1000


def test_a_consumer_of_a_topic_with_no_queues_yet_gets_the_first_message(make_store,
                                                                         wakeup_watch):
    store = make_store(NO_LOOKS)
    with store.consumer("early", TOPIC) as c:  # consume_from="last", and nothing exists yet
        assert c.assignment == []
        mark = wakeup_watch.mark()
        t, box = _poll_in_thread(c, LONG_MS)
        wakeup_watch.asleep(mark)
        store.put(Message(TOPIC, b"first ever", queue_id=3))
        t.join(LONG_MS / 1000 + SLACK_S)
        assert box["seconds"] < LONG_MS / 1000
        assert [(m.queue_id, m.queue_offset, m.body) for m in box["polled"]] == [
            (3, 0, b"first ever")]
        assert c.assignment == [3]


@pytest.mark.parametrize("loops", ["process", "thread"])
def test_a_read_only_consumer_in_another_process_is_woken(make_store, store_dir, loops):
    store = make_store({"dispatch": {"worker": loops}, "flush": {"worker": loops}})
    store.put(Message(TOPIC, b"seed", queue_id=0))
    store.wait_dispatched()
    # The child's polls wait far longer than the test waits for each message: one that
    # arrives in time came by the notification.
    child = consumer_proc.ConsumerProcess(store_dir, "remote", TOPIC, "--timeout-ms",
                                          str(10 * LONG_MS), "--consume-from", "last",
                                          "--rebalance-ms", "3600000")
    try:
        assert child.wait_for(lambda p: p.assignment == [0]), (child.lines, child.errors())
        for i in range(3):
            assert child.wait_for(lambda p: p.asleep(), timeout=LONG_MS / 1000), child.lines
            store.put(Message(TOPIC, b"msg-%d" % i, queue_id=0))
            assert child.wait_for(lambda p: len(p.polled()) > i, timeout=LONG_MS / 1000)
        assert [(q, f, last, b) for q, f, last, b in child.polled()] == [
            (0, 1, 1, ["msg-0"]), (0, 2, 2, ["msg-1"]), (0, 3, 3, ["msg-2"])]
    finally:
        assert child.stop() == 0, child.errors()


def test_an_idle_poll_sleeps_instead_of_looping(make_store, monkeypatch):
    store = make_store({"consumer": {"rebalance_interval_ms": 10_000}})
    store.put(Message(TOPIC, b"x", queue_id=0))
    store.wait_dispatched()
    waits = []
    real_wait = Wakeup.wait

    def counted(self, seen, timeout_s):
        waits.append(timeout_s)
        return real_wait(self, seen, timeout_s)
    monkeypatch.setattr(Wakeup, "wait", counted)
    with store.consumer("idle", TOPIC) as c:
        began = time.monotonic()
        assert len(c.poll(1, 600)) == 0
        took = time.monotonic() - began
    assert 0.6 <= took < 0.6 + patience(SLACK_S)
    assert len(waits) <= 2 and waits[0] > 0.5  # one sleep for the whole timeout


def test_the_notification_reaches_every_waiter_and_timeouts_hold(tmp_path, wakeup_watch):
    root = str(tmp_path)
    waiters = [Wakeup(root) for _ in range(3)]
    results = []

    def wait(w, seen):
        results.append(w.wait(seen, 10.0))
    # Each sequence is read before the notification, however late a thread starts.
    threads = [threading.Thread(target=wait, args=(w, w.sequence())) for w in waiters]
    mark = wakeup_watch.mark()
    for t in threads:
        t.start()
    wakeup_watch.asleep(mark, waiters=3)
    notifier = Wakeup(root)
    notifier.notify()
    for t in threads:
        t.join(5)
    assert results == [True, True, True]
    began = time.monotonic()
    assert notifier.wait(notifier.sequence(), 0.2) is False
    assert 0.19 <= time.monotonic() - began < 0.2 + patience(SLACK_S)
    assert notifier.wait(notifier.sequence() - 1, 5.0) is True  # already moved on: no sleep
    for w in (*waiters, notifier):
        w.close()
    assert wakeup_module._futex is not None  # Linux: a real futex, no sleep slices


def test_a_peek_waits_on_the_notification_and_takes_up_new_queues(make_store, wakeup_watch):
    store = make_store(NO_LOOKS)
    store.put(Message(TOPIC, b"old", queue_id=0))
    store.wait_dispatched()
    with store.peek("lp", TOPIC) as peek:  # a group with no offsets, from the end
        polled, took = _woken_by_a_put(store, peek, wakeup_watch)
        assert took < LONG_MS / 1000
        assert [(m.queue_id, m.queue_offset, m.body) for m in polled] == [(0, 1, b"new")]
        mark = wakeup_watch.mark()
        t, box = _poll_in_thread(peek, LONG_MS)
        wakeup_watch.asleep(mark)
        store.put(Message(TOPIC, b"q4-first", queue_id=4))  # a queue made while it waits
        t.join(LONG_MS / 1000 + SLACK_S)
        assert box["seconds"] < LONG_MS / 1000
        assert [(m.queue_id, m.queue_offset, m.body) for m in box["polled"]] == [
            (4, 0, b"q4-first")]
    assert not os.path.exists(os.path.join(store.root, "consumer", "groups"))


def test_a_peek_does_not_make_the_wakeup_file(make_store, store_dir):
    """A store no writer has dispatched in since the file went (a broker's directory): the
    peek writes nothing, so it looks again every rebalance interval instead."""
    writer = make_store()
    writer.put(Message(TOPIC, b"x", queue_id=0))
    writer.wait_dispatched()
    writer.close()
    os.unlink(wakeup_path(store_dir))
    reader = make_store({"consumer": {"rebalance_interval_ms": 50}}, read_only=True)
    with reader.peek("g", TOPIC, consume_from="first") as peek:
        assert [m.body for m in peek.poll(8)] == [b"x"]
        began = time.monotonic()
        assert len(peek.poll(8, 300)) == 0
        assert 0.29 <= time.monotonic() - began < 0.3 + patience(SLACK_S)
    assert not os.path.exists(wakeup_path(store_dir))

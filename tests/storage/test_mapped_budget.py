"""NOTE [ Mapped budget ]: a process keeps at most ``consume_queue.max_mapped_files`` consume-queue
files mapped (two descriptors each), however many queues it writes or reads: the store process
following the dispatch worker's queues, the worker writing them, and a store whose loops run in
its own process. Parking changes descriptors only: every read sees what it saw, across reopens,
and a queue parked while a read holds its units keeps them readable."""

from __future__ import annotations

import errno
import os

import pytest

from mqstore import Message
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR
from mqstore.storage.mapped_budget import MappedBudget

TOPICS = 60
LIMIT = 4


def queue_descriptors(root, pid="self") -> int:
    """Descriptors of process ``pid`` open on consume-queue files of the store in ``root``."""
    folder = os.path.join(str(root), CONSUME_QUEUE_DIR) + os.sep
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(folder):
                count += 1
        except OSError:  # closed since the listing
            pass
    return count


def fill_topics(store) -> None:
    for i in range(TOPICS):
        store.put_batch([Message(f"t{i}", b"t%d-%d" % (i, j), queue_id=j % 2)
                         for j in range(4)])
    store.wait_dispatched(30)


def read_back(store, topic: str) -> list[bytes]:
    got = []
    for q in store.queue_ids(topic):
        batch = store.read(topic, q, 0, 10)
        got += [bytes(batch.body(k)) for k in range(len(batch))]
    return sorted(got)


def check_all(store) -> None:
    for i in range(TOPICS):
        assert read_back(store, f"t{i}") == [b"t%d-%d" % (i, j) for j in range(4)]
        assert queue_descriptors(store.root) <= 2 * LIMIT + 2  # + the one read right now


@pytest.mark.parametrize("loops", ["process", "thread"])
def test_mapped_consume_queue_files_are_bounded(make_store, loops):
    store = make_store({"consume_queue": {"max_mapped_files": LIMIT},
                        "dispatch": {"worker": loops}})
    fill_topics(store)
    check_all(store)
    assert store.view.mapped.parked > 0
    if loops == "process":
        worker = store.worker_status()["pid"]
        assert queue_descriptors(store.root, worker) <= 2 * LIMIT + 2
    store.close()
    # The open maps what recovery checks, then keeps the budget.
    store = make_store({"consume_queue": {"max_mapped_files": LIMIT},
                        "dispatch": {"worker": loops}})
    assert queue_descriptors(store.root) <= 2 * LIMIT + 2
    check_all(store)
    store.put(Message("t0", b"t0-4", queue_id=0))
    store.wait_dispatched(30)
    assert read_back(store, "t0") == [b"t0-%d" % j for j in range(5)]


def test_a_parked_queue_keeps_the_units_a_read_holds(make_store):
    store = make_store({"consume_queue": {"max_mapped_files": 1}, "dispatch": {"worker": "thread"}})
    store.put_batch([Message("A", b"a"), Message("B", b"b")])
    store.wait_dispatched(30)
    queue = store.view.consume_queue("A", store.queue_ids("A")[0])
    seg = queue.segments.segments[0]
    units = queue.units_of(seg)  # held past the bracket: it pins the map
    before = units.copy()
    read_back(store, "B")  # B maps its file: A is over the budget
    queue.park()
    assert seg.mapped and (units == before).all()  # the held array stays readable
    del units
    queue.park()
    assert not seg.mapped
    assert read_back(store, "A") == [b"a"]  # mapped again when used


def test_the_budget_parks_the_least_recently_used_queue_not_in_use():
    class Queue:
        def __init__(self, files):
            self.files, self.parked = files, False

        def mapped_files(self):
            return 0 if self.parked else self.files

        def park(self):
            self.parked = True

        def unpark(self):
            self.parked = False

    budget = MappedBudget(3)
    a, b, c = Queue(1), Queue(1), Queue(2)
    budget.enter(a)  # a in use
    budget.enter(b)
    budget.leave(b)
    budget.enter(c)
    budget.leave(c)  # 4 > 3: b goes (a is in use, c the most recent)
    assert (a.parked, b.parked, c.parked) == (False, True, False)
    budget.leave(a)  # used until now: c is the least recent
    budget.enter(b)  # b again: mapped
    budget.leave(b)
    assert (a.parked, b.parked, c.parked) == (False, False, True)
    assert budget.mapped_files == 2


@pytest.mark.loops("thread")
def test_a_queue_parked_with_units_not_yet_forced_is_forced_later(make_store, monkeypatch,
                                                                  manual_scheduler):
    """Parking unmaps without forcing (no fsync per queue let go); the next flush forces the
    parked file through a descriptor of its own."""
    store = make_store({"consume_queue": {"max_mapped_files": 1},
                        "dispatch": {"worker": "thread"}, "flush": {"worker": "thread"}},
                       scheduler=manual_scheduler)
    synced = []
    real = os.fdatasync
    monkeypatch.setattr(os, "fdatasync", lambda fd: (synced.append(os.readlink(
        f"/proc/self/fd/{fd}")), real(fd))[1])
    store.put(Message("A", b"a", queue_id=0))
    store.wait_dispatched(30)
    queue = store.view.consume_queue("A", 0)
    seg = queue.segments.segments[0]
    store.put(Message("B", b"b", queue_id=0))
    store.wait_dispatched(30)  # B's file mapped: A's parked
    assert seg.parked and seg.flushed < seg.wrote
    synced.clear()
    store.view.flush_queues()
    assert seg.flushed == seg.wrote and seg.path in synced
    assert seg.parked  # forced without being mapped again


def test_out_of_descriptors_parks_every_idle_queue_and_goes_through(make_store, monkeypatch):
    store = make_store({"consume_queue": {"max_mapped_files": 64}})
    fill_topics(store)
    for i in range(10):
        read_back(store, f"t{i}")
    held = queue_descriptors(store.root)
    assert held >= 2 * 10
    real_open, failures = os.open, []

    def open_(path, flags, *args):
        if CONSUME_QUEUE_DIR in str(path) and not failures:
            failures.append(path)
            raise OSError(errno.EMFILE, "Too many open files")
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", open_)
    assert read_back(store, "t59") == [b"t59-%d" % j for j in range(4)]
    assert len(failures) == 1
    assert queue_descriptors(store.root) <= 2 * 2  # the others let go; t59's queues mapped

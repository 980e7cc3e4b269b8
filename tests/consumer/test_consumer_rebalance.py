"""Rebalancing (issue 14): instances of one group in three processes split the queues, and
split them again within seconds when one joins, leaves or is SIGKILLed; once settled no queue
is consumed by two live instances, and nothing is lost (NOTE [ Group membership ]).
Allocation strategies are plugins (register_allocation_strategies)."""

from __future__ import annotations

import os
import sys
import threading
import time

import pytest

from mqstore import Message, hookimpl
from mqstore.consumer import membership
from mqstore.errors import PluginError
from mqstore.plugins.allocate_average import AverageAllocation
from mqstore.plugins.allocate_average_by_circle import CircleAllocation
from mqstore.testing import consumer_proc, patience

TOPIC = "T"
QUEUES = 6
SETTLE_S = 10.0  # "within seconds": a rebalance must settle well inside this


# -- the strategies ---------------------------------------------------------------------------

@pytest.mark.parametrize("queues, members, expected", [
    (8, 3, [[0, 1, 2], [3, 4, 5], [6, 7]]),
    (6, 3, [[0, 1], [2, 3], [4, 5]]),
    (2, 3, [[0], [1], []]),
    (5, 1, [[0, 1, 2, 3, 4]]),
    (0, 2, [[], []]),
])
def test_average_allocation_is_rocketmqs(queues, members, expected):
    cids = [f"c{i}" for i in range(members)]
    shares = [AverageAllocation().allocate("g", c, cids, list(range(queues))) for c in cids]
    assert shares == expected
    assert AverageAllocation().allocate("g", "stranger", cids, list(range(queues))) == []


def test_circle_allocation_deals_queues_out_like_cards():
    cids = ["a", "b", "c"]
    assert [CircleAllocation().allocate("g", c, cids, list(range(8))) for c in cids] == [
        [0, 3, 6], [1, 4, 7], [2, 5]]


class _EverythingToTheFirst:
    def allocate(self, group, member, members, queue_ids):
        return list(queue_ids) if member == members[0] else []


class _Broken:
    def allocate(self, group, member, members, queue_ids):
        return [99]


class AllocationPlugin:
    @hookimpl
    def register_allocation_strategies(self, registry):
        registry.add("first_takes_all", _EverythingToTheFirst)
        registry.add("broken", _Broken)


@pytest.mark.loops("thread")  # the plugin module exists in this process only
def test_strategies_are_plugins_picked_by_config_or_per_consumer(make_store, monkeypatch):
    monkeypatch.setitem(sys.modules, "my_allocation", AllocationPlugin())
    store = make_store({"plugins": {"modules": ["my_allocation"]},
                        "consumer": {"allocation": "first_takes_all"}})
    for i in range(4):
        store.put(Message(TOPIC, b"x", queue_id=i))
    store.wait_dispatched()
    assert store.internals.hooks.allocation_strategies.owner("average") == "mqstore.plugins.allocate_average"
    with store.consumer("g", TOPIC) as a, store.consumer("g", TOPIC) as b:
        first, second = sorted([a, b], key=lambda c: c.member_id)
        deadline = time.monotonic() + SETTLE_S
        while first.assignment != [0, 1, 2, 3] and time.monotonic() < deadline:
            a.poll(1, 10)
            b.poll(1, 10)
        assert (first.assignment, second.assignment) == ([0, 1, 2, 3], [])
    with pytest.raises(PluginError, match=r"allocation strategy 'broken' returned \[99\] for "
                                          r"queues \[0, 1, 2, 3\]"):
        store.consumer("g", TOPIC, allocation="broken")


def test_two_instances_in_one_process_split_and_merge(make_store):
    store = make_store({"consumer": {"rebalance_interval_ms": 50}})
    for i in range(40):
        store.put(Message(TOPIC, b"%d" % i, queue_id=i % 4))
    store.wait_dispatched()
    got = []
    a = store.consumer("g", TOPIC, consume_from="first")
    assert a.assignment == [0, 1, 2, 3]
    b = store.consumer("g", TOPIC, consume_from="first")
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and (len(a.assignment) != 2 or len(b.assignment) != 2):
        for c in (a, b):
            got += [(m.queue_id, m.queue_offset) for m in c.poll(3, 20)]
            c.commit()
    assert sorted(a.assignment + b.assignment) == [0, 1, 2, 3]
    b.close()
    deadline = time.monotonic() + SETTLE_S
    while time.monotonic() < deadline and a.assignment != [0, 1, 2, 3]:
        got += [(m.queue_id, m.queue_offset) for m in a.poll(3, 20)]
        a.commit()
    while True:
        polled = a.poll(50)
        if not polled:
            break
        got += [(m.queue_id, m.queue_offset) for m in polled]
    a.close()
    assert sorted(got) == [(q, o) for q in range(4) for o in range(10)]  # each exactly once


# -- removing a group's files under a joining instance -------------------------------------------

def test_a_queue_lock_unlinked_as_it_is_taken_is_not_held(tmp_path, monkeypatch):
    """remove_group_files unlinks a queue's lock file under its own lock; an instance that
    opened the file just before gets the lock of a file no longer in queues/, which would
    exclude nobody: it must not count it."""
    m = membership.Membership(str(tmp_path), "g", TOPIC, 0)
    real = membership._try_flock

    def unlinked_first(fd, how):
        monkeypatch.setattr(membership, "_try_flock", real)
        os.unlink(os.path.join(m.queues_dir, "0.lock"))
        return real(fd, how)
    monkeypatch.setattr(membership, "_try_flock", unlinked_first)
    assert not m.try_take(0)
    assert m.try_take(0) and m.held() == [0]  # the next look takes the file now there
    other = membership.Membership(str(tmp_path), "g", TOPIC, 0)
    assert not other.try_take(0)
    for x in (m, other):
        x.leave()


def test_a_join_whose_files_are_removed_under_it_makes_them_again(tmp_path, monkeypatch):
    root = str(tmp_path)
    real = membership.Membership._make_dirs
    removed = []

    def made_then_removed(self):
        real(self)
        if not removed:  # the group's files go between making them and taking the seat
            removed.append(membership.remove_group_files(root, "g"))
    monkeypatch.setattr(membership.Membership, "_make_dirs", made_then_removed)
    m = membership.Membership(root, "g", TOPIC, 0)
    assert removed == [[TOPIC]]
    assert os.listdir(m.members_dir) == [m.member_id] and m.members() == [m.member_id]
    assert m.try_take(1)
    assert membership.remove_group_files(root, "g") == []  # a live instance: left alone
    assert sorted(os.listdir(m.queues_dir)) == ["1.lock"]
    m.leave()
    assert membership.remove_group_files(root, "g") == [TOPIC]
    assert not os.path.exists(os.path.join(root, "consumer", "groups", "g"))


# -- three processes ----------------------------------------------------------------------------

class Trickle:
    """Puts a message every few milliseconds, round robin over the queues, until stopped."""

    def __init__(self, store) -> None:
        self.store = store
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.004):
            q = self.sent % QUEUES
            assert self.store.put(Message(TOPIC, b"t%06d" % self.sent,
                                          queue_id=q)).status.name == "PUT_OK"
            self.sent += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _settled(live) -> bool:
    """Every live instance's latest assignment is its average share, given the live members."""
    ids = sorted(p.member_id for p in live)
    expected = {m: AverageAllocation().allocate("g", m, ids, list(range(QUEUES))) for m in ids}
    return all(p.assignment == expected[p.member_id] for p in live)


def _wait_settled(live) -> float:
    began = time.monotonic()
    while not _settled(live):
        assert time.monotonic() - began < patience(SETTLE_S), [(p.member_id, p.assignment) for p in live]
        time.sleep(0.02)
    shares = [set(p.assignment) for p in live]
    assert set().union(*shares) == set(range(QUEUES))
    assert sum(len(s) for s in shares) == QUEUES  # disjoint: no queue in two live instances
    return time.monotonic() - began


class _Child(consumer_proc.ConsumerProcess):
    @property
    def member_id(self) -> str:
        return next(rest for kind, rest in list(self.lines) if kind == "ready")


@pytest.mark.slow
def test_three_processes_rebalance_on_join_leave_and_sigkill(make_store, store_dir):
    store = make_store()
    for i in range(QUEUES * 50):
        store.put(Message(TOPIC, b"b%06d" % i, queue_id=i % QUEUES))
    store.wait_dispatched()
    trickle = Trickle(store)

    def start() -> _Child:
        child = _Child(store_dir, "g", TOPIC, "--max-msgs", "8", "--timeout-ms", "200",
                       "--rebalance-ms", "300")
        assert child.wait_for(lambda p: any(k == "ready" for k, _ in p.lines)), child.errors()
        return child

    children = []
    try:
        a = start()
        children.append(a)
        _wait_settled([a])
        b = start()
        children.append(b)
        _wait_settled([a, b])
        c = start()
        children.append(c)
        took_join = _wait_settled([a, b, c])
        assert c.stop() == 0  # leaves: commits, gives its queues up
        took_leave = _wait_settled([a, b])
        b.kill()  # no goodbye: found dead by a probe
        killed_at = time.monotonic()
        _wait_settled([a])
        took_kill = time.monotonic() - killed_at
        trickle.stop()
        store.wait_dispatched()
        ends = {q: store.max_offset(TOPIC, q) for q in range(QUEUES)}
        assert a.wait_for(lambda p: all(p.committed().get(q) == ends[q] for q in range(QUEUES)),
                          timeout=30), (a.committed(), ends)
        assert a.stop() == 0
    finally:
        trickle.stop()
        for child in children:
            if child.proc.poll() is None:
                child.kill()
    assert max(took_join, took_leave, took_kill) < patience(SETTLE_S)
    # Every message reached some instance; a message reached two only when B polled it and
    # was killed before committing it.
    seen: dict[tuple[int, int], int] = {}
    for child in (a, b, c):
        for q, first, last, _bodies in child.polled():
            for o in range(first, last + 1):
                seen[(q, o)] = seen.get((q, o), 0) + 1
    assert set(seen) == {(q, o) for q in range(QUEUES) for o in range(ends[q])}
    b_committed = b.committed()
    twice = {key for key, n in seen.items() if n > 1}
    assert all(o >= b_committed.get(q, 0) for q, o in twice), sorted(twice)[:10]
    assert all(n <= 2 for n in seen.values())

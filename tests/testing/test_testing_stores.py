"""The shipped test helpers (mqstore.testing.stores): what fill puts, and what a StoreFactory
opens and closes."""

from __future__ import annotations

import random
import time

import pytest

from mqstore import GetStatus, Message, testing
from mqstore.clock import system_clock
from mqstore.errors import StoreClosedError
from mqstore.scheduler import system_scheduler
from mqstore.testing import (
    ManualClock, ManualScheduler, StoreFactory, fill, merged, suite_defaults, wait_for,
)
from mqstore.testing.faults import Ack


def _stored(store, topic: str, queues: int) -> list[tuple]:
    """(queue, queue offset, commit-log offset, body, tags, keys) of every stored message."""
    rows = []
    for q in range(queues):
        got = store.get("check", topic, q, 0, 1000)
        assert got.status in (GetStatus.FOUND, GetStatus.NO_MESSAGE_IN_QUEUE)
        rows += [(m.queue_id, m.queue_offset, m.phys_offset, m.body, m.tags, m.keys)
                 for m in got.messages]
    return sorted(rows, key=lambda r: r[2])


def test_fill_puts_numbered_messages_round_robin_and_says_where_each_went(make_store):
    store = make_store()
    acks = fill(store, 7, topic="F", queues=3, size=10, tags=("a", None), keys=True)
    assert [(a.index, a.queue_id, a.queue_offset) for a in acks] == [
        (0, 0, 0), (1, 1, 0), (2, 2, 0), (3, 0, 1), (4, 1, 1), (5, 2, 1), (6, 0, 2)]
    rows = _stored(store, "F", 3)  # dispatched: fill waited
    assert [(q, o, p) for q, o, p, *_ in rows] == [
        (a.queue_id, a.queue_offset, a.phys_offset) for a in acks]
    assert [(body, tags, keys) for *_, body, tags, keys in rows] == [
        (b"m%04dxxxxx" % i, "a" if i % 2 == 0 else None, [f"k{i}"]) for i in range(7)]


def test_fill_goes_on_from_the_acks_it_is_given(make_store):
    store = make_store({"commit_log": {"segment_bytes": 4096}})
    acks: list[Ack] = []
    first = fill(store, segments=2, body=b"y" * 300, tags=lambda i: f"t{i % 3}", acks=acks)
    assert len(store.internals.commit_log.segments.segments) == 2
    assert first[-1].phys_offset >= 4096 > first[-2].phys_offset  # stopped at the first put there
    more = fill(store, 2, acks=acks)
    assert acks == first + more and [a.index for a in more] == [len(first), len(first) + 1]
    assert [body for *_, body, _t, _k in _stored(store, "T", 1)][-2:] == [
        b"m%04d" % len(first), b"m%04d" % (len(first) + 1)]


def test_a_seed_gives_the_same_messages_one_by_one_or_in_batches(make_store, tmp_path):
    def fields(rng):
        return lambda i: {"flag": rng.randrange(3)}

    stores = []
    for name, batch in (("single", 0), ("batched", 16)):
        rng = random.Random(5)
        store = make_store(root=tmp_path / name)
        acks = fill(store, 50, queues=2, rng=rng, sizes=(0, 17, 700), tags=(None, "A"),
                    keys=True, fields=fields(rng), batch=batch)
        stores.append((store, acks))
    (one, one_acks), (other, other_acks) = stores
    assert one_acks == other_acks
    assert _stored(one, "T", 2) == _stored(other, "T", 2)
    assert {len(body) for *_, body, _t, _k in _stored(one, "T", 2)} == {0, 17, 700}
    assert {m.flag for m in one.get("g", "T", 0, 0, 100).messages} <= {0, 1, 2}


@pytest.mark.parametrize("kw, message", [
    ({}, "count None and segments None: give exactly one"),
    ({"count": 1, "segments": 2}, "count 1 and segments 2: give exactly one"),
    ({"count": 1, "rng": random.Random(1)}, "rng draws each body's size from sizes"),
])
def test_fill_refuses_what_it_cannot_do(make_store, kw, message):
    store = make_store()
    with pytest.raises(ValueError, match=message):
        fill(store, **kw)
    assert store.max_phys_offset == 0


def test_fill_stops_at_a_refused_put_naming_it(make_store):
    store = make_store({"commit_log": {"max_message_bytes": 1000}})
    with pytest.raises(AssertionError, match=r"message 2: MESSAGE_ILLEGAL"):
        fill(store, 3, body=lambda i: b"z" * (10 if i < 2 else 2000))


def test_a_factory_merges_over_its_defaults_and_closes_what_it_opened(tmp_path):
    clock, scheduler = ManualClock(123), ManualScheduler()
    with StoreFactory(tmp_path / "a", defaults=suite_defaults(loops="thread"), clock=clock,
                      scheduler=scheduler) as factory:
        store = factory({"commit_log": {"segment_bytes": 8192}})
        assert store.config.commit_log.segment_bytes == 8192
        assert store.config.index.max_hash_slots == 4096  # the defaults' own
        assert store.config.dispatch.worker == "thread" and store.config.store.hash == "java"
        assert store.clock is clock and store.scheduler is scheduler
        assert store.put(Message("T", b"x", queue_id=0)).store_timestamp == 123
        other = factory(root=tmp_path / "b", clock=None, scheduler=None)
        assert other.clock is system_clock and other.scheduler is system_scheduler
    for closed in (store, other):
        with pytest.raises(StoreClosedError):
            closed.put(Message("T", b"late", queue_id=0))
    with pytest.raises(ValueError, match="root is None and the factory has no root"):
        StoreFactory()()


def test_merged_overrides_win_at_every_depth():
    assert merged({"a": {"x": 1, "y": {"p": 1, "q": 2}}}, None, {"a": {"y": {"q": 3}}, "b": 4}) \
        == {"a": {"x": 1, "y": {"p": 1, "q": 3}}, "b": 4}


def test_wait_for_returns_the_answer_or_names_what_it_waited_for():
    answers = iter([0, [], "ready"])
    assert wait_for(lambda: next(answers), timeout=5, interval=0) == "ready"
    with pytest.raises(AssertionError, match=r"the mark not reached within [\d.]+ s; last: \[\]"):
        wait_for(lambda: [], timeout=0.05, what="the mark")


@pytest.mark.parametrize("load, stretched", [(0.5, 10.0), (2.0, 10.0), (12.0, 60.0),
                                             (100.0, 80.0)])
def test_patience_stretches_a_bound_by_the_load_per_cpu(monkeypatch, load, stretched):
    monkeypatch.setattr(testing.os, "getloadavg", lambda: (load, 0.0, 0.0))
    monkeypatch.setattr(testing.os, "cpu_count", lambda: 2)
    assert testing.patience(10.0) == stretched
    began = time.monotonic()
    with pytest.raises(AssertionError, match=f"within {stretched / 1000:.3g} s"):
        wait_for(lambda: None, timeout=0.01, interval=0.001)
    assert time.monotonic() - began >= stretched / 1000

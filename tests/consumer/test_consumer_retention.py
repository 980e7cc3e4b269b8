"""Retention that respects consumers (issue 14): the keep_unconsumed cleanup policy spares
segments holding messages a group has not consumed, both ways (spared while unconsumed, and
deleted once consumed or once the disk passes the forced-clean watermark); watermarks as byte
amounts; cleanup on the injected clock; and pulls racing a deletion answer RocketMQ's statuses
with the right bytes, never an exception."""

from __future__ import annotations

import threading
import time

import pytest

from mqstore import GetStatus, Message, load_config
from mqstore.runtime import cleanup
from mqstore.runtime.cleanup import DiskUsage, watermark_passed
from mqstore.errors import ConfigError
from mqstore.plugins.cleanup_keep_unconsumed import KeepUnconsumedCleanup
from mqstore.plugins.cleanup_rocketmq import RocketMQCleanup
from mqstore.testing import fill

SEG = 4096
TOPIC = "T"
ALL_HOURS = ";".join(str(h) for h in range(24))
GiB = 1 << 30


def _store(make_store, scheduler, **cleanup_keys):
    """A store whose cleanup runs when ``scheduler`` (a ManualScheduler) says so."""
    return make_store({"commit_log": {"segment_bytes": SEG},
                       "cleanup": {"policy": "keep_unconsumed", "interval_ms": 30,
                                   "delete_when": ALL_HOURS, "file_reserved_hours": 0,
                                   **cleanup_keys}}, scheduler=scheduler)


def _fill(store, segments: int, queues: int = 2, results: list | None = None) -> list:
    """Messages until the log has ``segments`` segments; returns where every one went
    (``results`` too, when given)."""
    results = [] if results is None else results
    fill(store, segments=segments, topic=TOPIC, queues=queues, size=305, acks=results)
    return results


def _segment_holding(store, phys: int) -> int:
    return next(s.start for s in store.internals.commit_log.segments.segments if s.start <= phys < s.end)


def test_segments_holding_unconsumed_messages_stay_until_they_are_consumed(make_store,
                                                                          manual_scheduler):
    store = _store(make_store, manual_scheduler)
    results = _fill(store, 1)
    with store.consumer("slow", TOPIC, consume_from="first"):
        pass  # registered before anything expires: it has offsets 0
    _fill(store, 6, results=results)
    with store.consumer("slow", TOPIC) as c:
        polled = list(c.poll(12)) + list(c.poll(12))  # twelve of each queue
        c.commit()
        first_left = {q: c.positions()[q] for q in (0, 1)}
    assert first_left == {0: 12, 1: 12} and len(polled) == 24
    unconsumed = min(r.phys_offset for r in results if r.queue_offset >= first_left[r.queue_id])
    keep_from = _segment_holding(store, unconsumed)
    assert keep_from > 0
    # Everything is expired and due, yet cleanup stops at the segment the group still needs.
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == keep_from
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == keep_from
    for q in (0, 1):
        got = store.get("check", TOPIC, q, first_left[q], 1)
        assert got.status is GetStatus.FOUND
    with store.consumer("slow", TOPIC) as c:
        while c.poll(100):
            pass
        c.commit()
    newest = store.internals.commit_log.segments.segments[-1].start
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == newest  # consumed: the rule applies again
    assert [lag.lag for lag in store.consumer_lag("slow", TOPIC)] == [0, 0]


def test_the_disk_wins_past_the_forced_clean_watermark(make_store, monkeypatch,
                                                       manual_scheduler):
    usage = {"now": DiskUsage(0.50, 100 * GiB, 50 * GiB)}
    monkeypatch.setattr(cleanup, "disk_used_ratio", lambda path: usage["now"])
    store = _store(make_store, manual_scheduler, file_reserved_hours=72, disk_forcibly_ratio="20GiB",
                   disk_warning_ratio="5GiB", max_segments_per_run=10)
    _fill(store, 5)
    with store.consumer("idle", TOPIC, consume_from="first"):
        pass  # registered at offset 0: it needs everything
    usage["now"] = DiskUsage(0.80, 100 * GiB, 20 * GiB + 1)  # 20 GiB free: not passed yet
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == 0
    usage["now"] = DiskUsage(0.85, 100 * GiB, 15 * GiB)  # under 20 GiB free: forced clean
    newest = store.internals.commit_log.segments.segments[-1].start
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == newest
    lags = store.consumer_lag("idle", TOPIC)
    assert all(lag.committed_offset == 0 and lag.min_offset > 0 for lag in lags)
    with store.consumer("idle", TOPIC) as c:  # told what is gone, given what is left
        got = c.poll(1000)
        assert {m.queue_id: m.queue_offset for m in reversed(list(got))} == {
            lag.queue_id: lag.min_offset for lag in lags if lag.max_offset > lag.min_offset}
        assert c.positions() == {lag.queue_id: lag.max_offset for lag in lags}


def test_messages_a_pop_group_has_not_acknowledged_are_spared(make_store, manual_scheduler):
    store = _store(make_store, manual_scheduler)
    store.put(Message(TOPIC, b"first", queue_id=0))
    popped = store.pop("popper", TOPIC, 1, 600_000, consume_from="first", wait_ms=5_000)
    results = _fill(store, 5, queues=1)
    popped += store.pop("popper", TOPIC, len(results), 600_000)
    assert len(popped) == len(results) + 1
    third = store.internals.commit_log.segments.segments[2].start
    held = [popped[0]] + [m for m in popped if m.phys_offset >= third][:1]
    for m in popped:
        if m not in held:
            store.ack(m.receipt_handle)
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == 0  # offset 0 is still in flight
    store.ack(held[0].receipt_handle)
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == third  # the next one in flight is there
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == third
    store.ack(held[1].receipt_handle)
    newest = store.internals.commit_log.segments.segments[-1].start
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == newest


def test_without_groups_the_policy_is_rocketmqs(make_store, manual_clock, manual_scheduler):
    store = _store(make_store, manual_scheduler, file_reserved_hours=1)
    _fill(store, 4)
    manual_clock.advance(59 * 60 * 1000)  # on the store clock, not the scheduler's
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == 0
    manual_clock.advance(60 * 1000)
    newest = store.internals.commit_log.segments.segments[-1].start
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == newest


def test_an_unbound_policy_decides_as_rocketmq():
    cfg = load_config(overrides={"cleanup": {"policy": "keep_unconsumed",
                                             "delete_when": ALL_HOURS}})
    now = 1_700_000_000_000
    assert KeepUnconsumedCleanup(cfg).decide(now, 0.5) == RocketMQCleanup(cfg).decide(now, 0.5)
    assert KeepUnconsumedCleanup(cfg).decide(now, 0.5).keep_from_phys == -1


# -- watermarks as byte amounts -----------------------------------------------------------------

@pytest.mark.parametrize("setting, usage, passed", [
    (85, DiskUsage(0.86, 100 * GiB, 14 * GiB), True),
    (85, DiskUsage(0.85, 100 * GiB, 15 * GiB), False),
    ("20GiB", DiskUsage(0.81, 100 * GiB, 20 * GiB - 1), True),   # bytes, not whole percents
    ("20GiB", DiskUsage(0.81, 100 * GiB, 20 * GiB), False),
    ("500MB", DiskUsage(0.6, 10**9, 4 * 10**8), True),
    ("20GiB", 0.99, False),  # a bare fraction: the disk's size is unknown
])
def test_watermarks_in_bytes_are_free_space(setting, usage, passed):
    assert watermark_passed(setting, usage) is passed


def test_rocketmq_policy_with_byte_watermarks():
    cfg = load_config(overrides={"cleanup": {"disk_max_used_ratio": "30GiB",
                                             "disk_forcibly_ratio": "20GiB",
                                             "disk_warning_ratio": "10GiB",
                                             "delete_when": "23"}})
    policy = RocketMQCleanup(cfg)
    now = int(time.mktime((2024, 6, 3, 5, 0, 0, 0, 0, -1)) * 1000)

    def decide(free_gib):
        d = policy.decide(now, DiskUsage(1 - free_gib / 100, 100 * GiB, int(free_gib * GiB)))
        return d.delete, d.reserved_ms == 0, d.disk_full
    assert decide(40) == (False, False, False)
    assert decide(25) == (True, False, False)   # under 30 GiB free: expired ones go
    assert decide(15) == (True, True, None)     # under 20 GiB: oldest go whatever their age
    assert decide(5) == (True, True, True)      # under 10 GiB: puts refused


@pytest.mark.parametrize("keys, needle", [
    ({"disk_forcibly_ratio": "20XB"}, "byte amount '20XB' must be a whole number > 0"),
    ({"disk_forcibly_ratio": "0GiB"}, "byte amount '0GiB' must be a whole number > 0"),
    ({"disk_max_used_ratio": 99}, "99 must be a percent from 10 to 95"),
    ({"disk_max_used_ratio": "10GiB", "disk_forcibly_ratio": "20GiB"},
     "cleanup.disk_max_used_ratio ('10GiB' free) must not be less free space than "
     "cleanup.disk_forcibly_ratio ('20GiB' free)"),
])
def test_bad_watermarks_are_refused_naming_the_key(keys, needle):
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"cleanup": keys})
    assert needle in str(err.value)


# -- pulls racing a deletion ----------------------------------------------------------------------

def test_pulls_racing_deletions_answer_statuses_with_the_right_bytes(make_store):
    store = make_store({"commit_log": {"segment_bytes": SEG}})
    expected = {}
    for i in range(400):
        r = store.put(Message(TOPIC, b"%05d" % i + b"y" * 200, queue_id=i % 2))
        expected[(r.queue_id, r.queue_offset)] = b"%05d" % i + b"y" * 200
    store.wait_dispatched()
    seen_status, problems, stop = set(), [], threading.Event()

    def reader(use_read: bool) -> None:
        while not stop.is_set():
            for q in (0, 1):
                try:
                    if use_read:
                        b = store.read(TOPIC, q, 0, 400)
                        rows = [(int(b.queue_offsets[i]), b.bodies[
                            b.body_offsets[i]:b.body_offsets[i + 1]].tobytes())
                            for i in range(len(b))]
                    else:
                        b = store.get("racer", TOPIC, q, 0, 32)
                        rows = [(m.queue_offset, m.body) for m in b.messages]
                    seen_status.add(b.status)
                    problems.extend((q, o) for o, body in rows if expected[(q, o)] != body)
                except Exception as exc:  # noqa: BLE001 - the test is that none escape
                    problems.append(repr(exc))
    threads = [threading.Thread(target=reader, args=(flag,)) for flag in (True, False)]
    for t in threads:
        t.start()
    try:
        while len(store.internals.commit_log.segments.segments) > 1:
            store.delete_expired_segments(force=True, max_segments=1)
            time.sleep(0.01)
    finally:
        stop.set()
        for t in threads:
            t.join(10)
    assert problems == []
    assert seen_status <= {GetStatus.FOUND, GetStatus.OFFSET_TOO_SMALL,
                           GetStatus.MESSAGE_WAS_REMOVING}
    assert GetStatus.OFFSET_TOO_SMALL in seen_status
    with store.consumer("after", TOPIC, consume_from="first") as c:
        got = c.poll(1000)
        assert [m.body for m in got] == [expected[(m.queue_id, m.queue_offset)] for m in got]
        assert {m.queue_id: m.queue_offset for m in reversed(list(got))} == {
            q: store.min_offset(TOPIC, q) for q in (0, 1)}

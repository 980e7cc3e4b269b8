"""The cleanup loop: which commit-log segments go and when the disk counts as full (spec 10.10)."""

from __future__ import annotations

import time

import pytest

from mqstore import GetStatus, Message, PutStatus, load_config
from mqstore.runtime import cleanup
from mqstore.errors import ConfigError
from mqstore.plugins.cleanup_rocketmq import RocketMQCleanup
from mqstore.store import DISK_FULL
from mqstore.testing import fill

SEG = 4096
ALL_HOURS = ";".join(str(h) for h in range(24))


def _cfg(**kw):
    return load_config(overrides={"cleanup": kw}).cleanup


def _decide(hour: int, used: float, **kw):
    """RocketMQ's policy at ``hour`` local time, as (delete, oldest at once, disk full)."""
    now_ms = int(time.mktime((2024, 6, 3, hour, 30, 0, 0, 0, -1)) * 1000)
    d = RocketMQCleanup(load_config(overrides={"cleanup": kw})).decide(now_ms, used)
    return d.delete, d.reserved_ms == 0, d.disk_full


@pytest.mark.parametrize("hour, used, expected", [
    (4, 0.50, (True, False, False)),    # deleteWhen hour: expired segments go
    (5, 0.50, (False, False, False)),   # another hour, disk fine: nothing
    (5, 0.76, (True, False, False)),    # over diskMaxUsedSpaceRatio: expired ones go any hour
    (5, 0.86, (True, True, None)),      # over the forcibly ratio: oldest go now, flag unchanged
    (5, 0.91, (True, True, True)),      # over the warning ratio: DISK_FULL
    (5, -1.0, (True, False, False)),    # unknown usage counts as over the limit
])
def test_decision_follows_rocketmq(hour, used, expected):
    assert _decide(hour, used) == expected


def test_no_forcible_cleaning_when_disabled():
    assert _decide(5, 0.95, clean_forcibly=False) == (True, False, True)


def test_hours_are_validated_naming_the_key():
    assert _cfg(delete_when="01;04;13").delete_when == "01;04;13"
    with pytest.raises(ConfigError, match=r"cleanup\.delete_when.*'25'"):
        _cfg(delete_when="04;25")


def _fill(store, segments: int) -> None:
    fill(store, segments=segments, queues=2, body=b"x" * 300, tags="a")


def test_expired_segments_go_at_the_delete_hour(make_store, manual_scheduler):
    store = make_store({"commit_log": {"segment_bytes": SEG},
                        "cleanup": {"interval_ms": 30, "delete_when": ALL_HOURS,
                                    "file_reserved_hours": 0}}, scheduler=manual_scheduler)
    _fill(store, 5)
    for q in (0, 1):  # both queues have messages in the newest segment
        store.put(Message("T", b"newest", queue_id=q))
    store.wait_dispatched()
    last = store.internals.commit_log.segments.segments[-1].start
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == last
    assert len(store.internals.commit_log.segments.segments) == 1  # the newest always stays
    for q in (0, 1):
        low = store.min_offset("T", q)
        assert low > 0
        got = store.get("g", "T", q, low, 4)
        assert got.status is GetStatus.FOUND and got.messages[0].phys_offset >= last


def test_unexpired_segments_stay_while_the_disk_has_room(make_store, monkeypatch,
                                                         manual_scheduler):
    monkeypatch.setattr(cleanup, "disk_used_ratio", lambda path: 0.80)  # over 75 %, under 85 %
    store = make_store({"commit_log": {"segment_bytes": SEG},
                        "cleanup": {"interval_ms": 30, "file_reserved_hours": 72}},
                       scheduler=manual_scheduler)
    _fill(store, 3)
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == 0
    assert store.put(Message("T", b"ok", queue_id=0)).status is PutStatus.PUT_OK


def test_a_full_disk_refuses_puts_and_deletes_oldest_first(make_store, monkeypatch,
                                                           manual_scheduler):
    usage = {"now": 0.50}
    monkeypatch.setattr(cleanup, "disk_used_ratio", lambda path: usage["now"])
    store = make_store({"commit_log": {"segment_bytes": SEG},
                        "cleanup": {"interval_ms": 30, "file_reserved_hours": 72,
                                    "max_segments_per_run": 2}}, scheduler=manual_scheduler)
    _fill(store, 6)
    first_segments = [s.start for s in store.internals.commit_log.segments.segments]
    usage["now"] = 0.95
    manual_scheduler.run("cleanup")
    assert store.running_flags & DISK_FULL
    refused = store.put(Message("T", b"no room", queue_id=0))
    assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
    assert "disk full" in refused.error and "cleanup.disk_warning_ratio" in refused.error
    # Unexpired, yet deleted oldest first, at most 2 per run (three runs for five), never
    # the newest.
    manual_scheduler.run("cleanup")
    manual_scheduler.run("cleanup")
    assert store.min_phys_offset == first_segments[-1]
    usage["now"] = 0.87  # below the warning ratio, above the forcibly one: still full
    manual_scheduler.run("cleanup")
    assert store.running_flags & DISK_FULL
    usage["now"] = 0.60
    manual_scheduler.run("cleanup")
    assert not store.running_flags & DISK_FULL
    assert store.put(Message("T", b"room again", queue_id=0)).status is PutStatus.PUT_OK

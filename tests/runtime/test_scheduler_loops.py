"""The loops take their intervals from the store's scheduler: under a ManualScheduler nothing
periodic runs until the test moves it, and ``run`` is a run of the named job, in the worker
processes (the default) as on threads."""

from __future__ import annotations

import math
import struct

import pytest

from mqstore import Message, PutStatus
from mqstore.scheduler import system_scheduler
from mqstore.storage.queue_progress import QUEUED_FILE, DispatchMark, read_queued
from mqstore.testing import wait_until

MODES = pytest.mark.parametrize("mode", ["process", "thread"])
NEVER = -math.inf


def _loops(mode: str) -> dict:
    return {"dispatch": {"worker": mode}, "flush": {"worker": mode}}


def _checkpoint_times(root) -> tuple[int, int]:
    """The checkpoint's physic and logics message times, as the file says."""
    physic, logics = struct.unpack(">qq", (root / "checkpoint").read_bytes()[:16])
    return physic, logics


@MODES
def test_periodic_jobs_run_when_the_scheduler_says_so(make_store, store_dir, manual_scheduler,
                                                      manual_clock, mode):
    store = make_store(_loops(mode), scheduler=manual_scheduler)
    assert store.scheduler is manual_scheduler
    before = _checkpoint_times(store_dir)
    manual_clock.advance(5_000)
    r = store.put(Message("T", b"x", queue_id=0))
    assert r.status is PutStatus.PUT_OK
    store.wait_dispatched()  # the dispatch loop is serving: its interval counts from before
    store.flush_commit_log(-1)  # so is the flush loop
    # Half a second on the scheduler's clock: the flush loop's interval (flush.interval_ms)
    # has passed, the derived files' and the metadata's second has not.
    moved_to = manual_scheduler.advance(0.6)
    assert wait_until(lambda: manual_scheduler.last_run("flush") >= moved_to, timeout=60)
    assert manual_scheduler.last_run("derived_flush") == NEVER
    assert manual_scheduler.last_run("metadata") == NEVER
    assert not (store_dir / QUEUED_FILE).exists()
    assert _checkpoint_times(store_dir) == before
    # A day on: a thorough flush pass forces the record; then the derived files record it.
    manual_scheduler.run("flush")
    manual_scheduler.run("derived_flush", "metadata")
    assert read_queued(str(store_dir)) == (DispatchMark(r.phys_offset, r.size,
                                                        r.store_timestamp), None)
    assert _checkpoint_times(store_dir) == (r.store_timestamp, r.store_timestamp)


@MODES
def test_cleanup_runs_at_its_interval_on_the_scheduler(make_store, manual_scheduler, mode):
    store = make_store({**_loops(mode), "commit_log": {"segment_bytes": 4096},
                        "cleanup": {"interval_ms": 60_000, "file_reserved_hours": 0,
                                    "delete_when": ";".join(map(str, range(24)))}},
                       scheduler=manual_scheduler)
    while len(store.internals.commit_log.segments.segments) < 3:
        assert store.put(Message("T", b"x" * 300, queue_id=0)).status is PutStatus.PUT_OK
    store.wait_dispatched()
    manual_scheduler.run("metadata", seconds=1.0)  # a tick that is not yet cleanup's
    assert manual_scheduler.last_run("cleanup") == NEVER
    assert store.min_phys_offset == 0
    manual_scheduler.run("cleanup", seconds=60.0)
    assert store.min_phys_offset == store.internals.commit_log.segments.segments[-1].start > 0


def test_a_store_keeps_the_system_scheduler_by_default(make_store):
    assert make_store().scheduler is system_scheduler

"""The loops' scheduler crosses process boundaries as the store clock does: a ManualScheduler
stays one clock in a spawned process, and the runs a worker records are the test's to see."""

from __future__ import annotations

import gc
import math
import multiprocessing as mp
import os
import pickle
import time

import pytest

from mqstore.scheduler import LOOK_S, SystemScheduler, system_scheduler
from mqstore.testing import JOBS, SCHEDULER_SEGMENT_PREFIX, ManualScheduler, attach_scheduler


def scheduler_segments() -> set[str]:
    """This process's scheduler segments in /dev/shm (other processes' runs are not ours)."""
    mine = f"{SCHEDULER_SEGMENT_PREFIX}{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)}


def _loop(scheduler, conn) -> None:
    """A loop with a one-second job, as the workers run theirs: report the clock at start,
    then run "flush" whenever the scheduler says it is due, until told to stop."""
    conn.send(scheduler.monotonic())
    next_run = scheduler.monotonic() + 1.0
    while not conn.poll(scheduler.wait_s(max(0.0, next_run - scheduler.monotonic()))):
        now = scheduler.monotonic()
        if now >= next_run:
            next_run = now + 1.0
            scheduler.ran("flush", now)
    conn.close()


def test_a_spawned_loop_runs_its_job_when_the_test_moves_the_clock():
    before = scheduler_segments()
    scheduler = ManualScheduler(start=100.0)
    mine = scheduler_segments() - before  # earlier tests' schedulers may be collected meanwhile
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_loop, args=(scheduler, child))
    proc.start()
    child.close()
    try:
        assert parent.poll(60), "the child did not start"
        assert parent.recv() == 100.0
        assert scheduler.last_run("flush") == -math.inf
        assert scheduler.run("flush", seconds=1.0) >= 101.0  # the child's run is seen here
        assert scheduler.last_run("flush") >= 101.0
        moved_to = scheduler.run("flush")
        assert scheduler.last_run("flush") >= moved_to >= 101.0 + 86_400
        with pytest.raises(TimeoutError, match=r"^cleanup did not run within 0.3 s of the "
                                               r"scheduler moving to "):
            scheduler.run("cleanup", timeout=0.3)  # no loop here runs it
        parent.send("stop")
        proc.join(60)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    assert mine <= scheduler_segments()
    del scheduler
    gc.collect()
    assert not mine & scheduler_segments()


def test_a_copy_or_an_attached_scheduler_is_the_same_clock():
    scheduler = ManualScheduler()
    for other in (pickle.loads(pickle.dumps(scheduler)), attach_scheduler(scheduler.name)):
        assert isinstance(other, ManualScheduler) and other is not scheduler
        before = scheduler.monotonic()
        assert other.advance(2.5) == before + 2.5 == scheduler.monotonic()
        other.ran("cleanup", other.monotonic())
        assert scheduler.last_run("cleanup") == scheduler.monotonic()


def test_the_creator_releases_the_segment_when_collected():
    before = scheduler_segments()
    scheduler = ManualScheduler()
    created = scheduler_segments() - before
    assert len(created) == 1
    attached = pickle.loads(pickle.dumps(scheduler))
    del attached  # an attached copy only detaches
    gc.collect()
    assert scheduler_segments() - before == created
    del scheduler
    gc.collect()
    assert not created & scheduler_segments()


def test_runs_are_kept_per_job_and_never_go_back():
    scheduler = ManualScheduler()
    assert [scheduler.last_run(job) for job in JOBS] == [-math.inf] * len(JOBS)
    scheduler.ran("commit", 5.0)
    scheduler.ran("commit", 3.0)  # a slower process reporting an older run
    assert scheduler.last_run("commit") == 5.0
    assert [scheduler.last_run(job) for job in JOBS if job != "commit"] == [-math.inf] * 4


def test_bad_requests_name_the_value_and_the_rule():
    scheduler = ManualScheduler()
    with pytest.raises(ValueError, match=r"job 'flsuh' is not one of the loops' jobs "
                                         r"\['metadata', 'cleanup', 'derived_flush', "
                                         r"'flush', 'commit'\]"):
        scheduler.run("flush", "flsuh")
    assert scheduler.monotonic() == 0.0  # refused before the clock moved
    with pytest.raises(ValueError, match=r"seconds -1 must be >= 0: the clock only moves ahead"):
        scheduler.advance(-1)


def test_a_loop_under_a_manual_scheduler_looks_at_it_often():
    assert ManualScheduler.wait_s(30.0) == LOOK_S
    assert ManualScheduler.wait_s(0.001) == 0.001


def test_the_system_scheduler_is_the_monotonic_clock_and_pickles_as_itself():
    assert pickle.loads(pickle.dumps(system_scheduler)) is system_scheduler
    assert isinstance(system_scheduler, SystemScheduler)
    assert system_scheduler.wait_s(30.0) == 30.0
    before = time.monotonic()
    assert before <= system_scheduler.monotonic() <= time.monotonic()
    assert system_scheduler.ran("flush", 1.0) is None

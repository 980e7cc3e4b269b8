"""The store's clocks cross process boundaries: a ManualClock stays one clock in a spawned
process, and the system clock pickles as the plain function it is."""

from __future__ import annotations

import copy
import gc
import multiprocessing as mp
import os
import pickle

from mqstore.clock import system_clock as _system_clock
from mqstore.testing import CLOCK_SEGMENT_PREFIX, ManualClock

START = 1_700_000_000_000


def clock_segments() -> set[str]:
    """This process's clock segments in /dev/shm (other processes' runs are not ours)."""
    mine = f"{CLOCK_SEGMENT_PREFIX}{os.getpid()}_"
    return {n for n in os.listdir("/dev/shm") if n.startswith(mine)}


def _child(clock, conn) -> None:
    """Report the time seen at start, wait for the parent's advance, report it, advance."""
    conn.send(clock())
    assert conn.recv() == "advanced"
    conn.send(clock.now)
    conn.send(clock.advance(7))
    conn.close()


def test_a_spawned_process_shares_the_clock_both_ways():
    before = clock_segments()
    clock = ManualClock()
    mine = clock_segments() - before  # earlier tests' clocks may be collected meanwhile
    ctx = mp.get_context("spawn")
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_child, args=(clock, child))
    proc.start()
    child.close()
    try:
        assert parent.poll(30), "the child did not start"
        assert parent.recv() == START
        assert clock.advance(1500) == START + 1500  # after the child attached
        parent.send("advanced")
        assert parent.recv() == START + 1500
        assert parent.recv() == START + 1507
        assert clock() == START + 1507 and clock.now == START + 1507
        proc.join(30)
        assert proc.exitcode == 0
    finally:
        if proc.is_alive():
            proc.kill()
            proc.join()
        parent.close()
    assert clock() == START + 1507  # the child's exit does not take the segment with it
    assert mine <= clock_segments()
    del clock
    gc.collect()
    assert not mine & clock_segments()


def test_pickle_round_trip_is_the_same_clock():
    clock = ManualClock(123)
    other = pickle.loads(pickle.dumps(clock))
    assert isinstance(other, ManualClock) and other is not clock
    assert other() == 123 and isinstance(other(), int)
    clock.now = 5_000
    assert other.now == 5_000
    assert other.advance(25) == 5_025
    assert clock() == 5_025
    assert copy.deepcopy(clock)() == 5_025


def test_public_api_unchanged():
    clock = ManualClock()
    assert clock() == START and clock.now == START
    assert type(clock()) is int and type(clock.now) is int
    assert clock.advance(10) == START + 10
    clock.now = 300
    assert clock() == 300
    assert clock.advance(-100) == 200


def test_the_creator_releases_the_segment_when_collected():
    before = clock_segments()
    clock = ManualClock()
    created = clock_segments() - before
    assert len(created) == 1
    attached = pickle.loads(pickle.dumps(clock))
    del attached  # an attached copy only detaches
    gc.collect()
    assert clock_segments() - before == created
    assert clock.advance(1) == START + 1
    del clock
    gc.collect()
    assert not created & clock_segments()


def test_an_attached_copy_outlives_the_creators_name():
    clock = ManualClock()
    attached = pickle.loads(pickle.dumps(clock))
    del clock
    gc.collect()
    assert attached.advance(1) == START + 1  # its mapping stays, only the name is gone


def test_system_clock_pickles_as_itself():
    assert pickle.loads(pickle.dumps(_system_clock)) is _system_clock

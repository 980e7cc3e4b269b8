"""The store's clocks cross process boundaries: a ManualClock stays one clock in a spawned
process, and the system clock pickles as the plain function it is; a clock that cannot reach
the worker processes is refused when the store opens, saying what a clock must be."""

from __future__ import annotations

import copy
import gc
import multiprocessing as mp
import os
import pickle
import subprocess
import sys

import pytest

from mqstore import GetStatus, Message, MessageStore, PutStatus, load_config
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


# -- what a store accepts as its clock -------------------------------------------------------
THREADS = {"dispatch": {"worker": "thread"}, "flush": {"worker": "thread"}}


def _local_clock():
    def clock() -> int:
        return START
    return clock


@pytest.mark.parametrize("clock", [lambda: START, _local_clock()], ids=["lambda", "local"])
def test_a_clock_the_workers_cannot_get_is_refused_at_open_with_the_rule(tmp_path, clock):
    root = tmp_path / "store"
    with pytest.raises(ValueError) as err:
        MessageStore.open(root, clock=clock)
    text = str(err.value)
    assert repr(clock) in text and "cannot be pickled" in text
    for needle in ("module level", "mqstore.testing.ManualClock",
                   "dispatch.worker: thread", "flush.worker: thread"):
        assert needle in text, text
    assert not root.exists()  # refused before the directory was made


MAIN_SCRIPT_CLOCK = r"""
import sys, time
from mqstore import MessageStore

def clock():
    return int(time.time() * 1000)

try:
    MessageStore.open(sys.argv[1], clock=clock)
except ValueError as exc:
    print(exc)
    sys.exit(3)
"""


def test_a_clock_of_the_main_script_is_refused_at_open(tmp_path):
    """Pickled by reference, it would be looked up in a __main__ the workers never import
    (before: each worker died at start and was restarted until the supervisor gave up)."""
    root = tmp_path / "store"
    proc = subprocess.run([sys.executable, "-c", MAIN_SCRIPT_CLOCK, str(root)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr[-3000:]
    assert "refers to clock of the main script" in proc.stdout, proc.stdout
    assert "dispatch.worker: thread" in proc.stdout
    assert not root.exists()


def test_a_lambda_clock_runs_with_the_loops_on_threads(tmp_path):
    """The remedy the refusal offers holds: nothing pickles the clock then."""
    store = MessageStore.open(tmp_path / "store", load_config(overrides=THREADS),
                              clock=lambda: START + 42)
    try:
        r = store.put(Message("T", b"on a lambda clock", queue_id=0))
        assert r.status is PutStatus.PUT_OK and r.store_timestamp == START + 42
        store.wait_dispatched(timeout=30)
        got = store.get("g", "T", 0, 0, 1)
        assert got.status is GetStatus.FOUND
        assert [(m.body, m.store_timestamp) for m in got.messages] == \
            [(b"on a lambda clock", START + 42)]
    finally:
        store.close()


def test_a_read_only_store_takes_any_callable_clock(tmp_path):
    MessageStore.open(tmp_path / "store", load_config(overrides=THREADS)).close()
    MessageStore.open(tmp_path / "store", read_only=True, clock=lambda: START).close()
    with pytest.raises(TypeError, match="clock must be a callable"):
        MessageStore.open(tmp_path / "store", read_only=True, clock=START)

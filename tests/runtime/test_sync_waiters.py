"""Sync-flush puts woken by the flush loop through per-slot pipes (workers.sync_waiters)."""

from __future__ import annotations

import gc
import multiprocessing as mp
import os
import threading
import time
from multiprocessing import forkserver, resource_tracker

import pytest

from mqstore import Message, MessageStore, PutStatus, load_config
from mqstore.runtime.workers import shm, sync_waiters
from mqstore.runtime.workers.supervisor import worker_context
from mqstore.runtime.workers.sync_waiters import SyncWaiters, Waker
from mqstore.testing import patience


@pytest.fixture
def pair(monkeypatch):
    # Only real wake-ups end a wait within these tests' joins, not the periodic re-check.
    monkeypatch.setattr(sync_waiters, "RECHECK_S", 30.0)
    channels = shm.Channels(shm.SharedPositions())
    waiters = SyncWaiters(channels, mp.get_context("spawn"))
    waker = Waker(channels, waiters.writers)
    yield channels, waiters, waker
    waker.close()
    waiters.close()
    channels.close()


def _flush_to(channels, waker, end):
    channels.flush.flushed = end
    waker.wake(end)


def _waiting(waiters, end, timeout_s=5.0, asks=None):
    out = {}

    def run():
        out["ok"] = waiters.wait(end, timeout_s, lambda: asks.append(end) if asks is not None else None)
        out["at"] = time.monotonic()

    t = threading.Thread(target=run)
    t.start()
    return t, out


def _until(cond, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def test_a_force_wakes_exactly_the_puts_it_covers(pair):
    positions, waiters, waker = pair
    asks = []
    threads = {end: _waiting(waiters, end, asks=asks) for end in (100, 200, 300)}
    _until(lambda: len(asks) == 3)
    assert sorted(positions.waiters[positions.waiters > 0].tolist()) == [100, 200, 300]
    _flush_to(positions, waker, 200)
    for end in (100, 200):
        threads[end][0].join(1.0)
        assert threads[end][1]["ok"] is True
    assert threads[300][0].is_alive()  # not covered: still asleep
    _flush_to(positions, waker, 300)
    threads[300][0].join(1.0)
    assert threads[300][1]["ok"] is True
    assert not positions.waiters.any()  # every slot handed back
    assert len(waiters._free) == shm.WAITER_SLOTS


def test_a_put_not_covered_in_time_answers_false_and_frees_its_slot(pair):
    positions, waiters, waker = pair
    began = time.monotonic()
    assert waiters.wait(500, 0.05, lambda: None) is False
    assert 0.05 <= time.monotonic() - began < patience(1.0)
    assert not positions.waiters.any() and len(waiters._free) == shm.WAITER_SLOTS


def test_an_already_flushed_end_returns_without_asking(pair):
    positions, waiters, _ = pair
    positions.flush.flushed = 1000
    asks = []
    assert waiters.wait(1000, 1.0, lambda: asks.append(1)) is True
    assert asks == []


def test_a_stale_wake_up_does_not_release_the_next_user_of_the_slot(pair):
    positions, waiters, waker = pair
    # A put that timed out leaves its slot; the wake-up meant for it arrives afterwards.
    assert waiters.wait(100, 0.01, lambda: None) is False
    slot = waiters._free[-1]
    os.write(waiters.writers[slot].fileno(), b"\0")
    t, out = _waiting(waiters, 200)
    time.sleep(0.05)
    assert t.is_alive()  # read the stale byte, saw FLUSHED < 200, went back to sleep
    _flush_to(positions, waker, 200)
    t.join(1.0)
    assert out["ok"] is True


def test_the_waker_writes_once_per_put_and_only_for_covered_ends(pair):
    positions, waiters, waker = pair

    def pending(slot):
        fd = waiters.readers[slot].fileno()
        os.set_blocking(fd, False)
        try:
            return len(os.read(fd, 64))
        except BlockingIOError:
            return 0

    positions.waiters[3] = 100
    positions.waiters[4] = 200
    waker.wake(100)
    waker.wake(150)
    assert (pending(3), pending(4)) == (1, 0)
    positions.waiters[3] = 120  # the slot's next put
    waker.wake(150)
    assert (pending(3), pending(4)) == (1, 0)
    waker.wake(200)
    assert (pending(3), pending(4)) == (0, 1)


def test_puts_beyond_the_slots_poll_and_still_complete(pair):
    positions, waiters, waker = pair
    asks = []
    n = shm.WAITER_SLOTS + 3
    threads = [_waiting(waiters, 10 + i, asks=asks) for i in range(n)]
    _until(lambda: len(asks) == n)
    assert not waiters._free
    _flush_to(positions, waker, 10 + n)
    for t, out in threads:
        t.join(1.0)
        assert out["ok"] is True


def test_cancel_sends_waiting_puts_back_at_once(pair):
    positions, waiters, _ = pair
    asks = []
    t, out = _waiting(waiters, 100, timeout_s=30.0, asks=asks)
    _until(lambda: asks)
    began = time.monotonic()
    waiters.cancel()
    t.join(1.0)
    assert out["ok"] is False and out["at"] - began < 0.5


def test_sync_puts_from_many_threads_are_all_durable_and_leave_no_descriptors(tmp_path,
                                                                            monkeypatch):
    # The flush worker process must do the waking: the periodic re-check would take 30 s.
    monkeypatch.setattr(sync_waiters, "RECHECK_S", 30.0)
    cfg = load_config(overrides={"flush": {"policy": "sync"}, "plugins": {"load_entry_points": False},
                                 "commit_log": {"segment_bytes": 1 << 20}})
    resource_tracker.ensure_running()  # its pipe lives as long as this process
    worker_context()
    forkserver.ensure_running()  # so does the connection to the workers' fork server
    gc.collect()  # what earlier tests left for the collector goes first
    fds_before = len(os.listdir("/proc/self/fd"))
    store = MessageStore.open(str(tmp_path / "s"), config=cfg)
    with store:
        results = [[] for _ in range(8)]

        def produce(i):
            for k in range(25):
                results[i].append(store.put(Message("T", b"%d-%d" % (i, k), queue_id=i % 2)))

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(8)]
        began = time.monotonic()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert time.monotonic() - began < patience(20.0)
        flat = [r for rs in results for r in rs]
        assert [r.status for r in flat] == [PutStatus.PUT_OK] * 200
        assert store.flushed_offset >= max(r.phys_offset + r.size for r in flat)
        assert store.internals.flush_client.status()["fsyncs"] < 200  # producers shared forces
    del store, t, threads
    gc.collect()  # worker process objects keep their sentinels until collected
    assert len(os.listdir("/proc/self/fd")) == fds_before

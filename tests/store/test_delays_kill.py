"""The schedule's writer process SIGKILLed right after it wrote delivered copies and before it
recorded them (``MQSTORE_FAULT_SIGKILL_AFTER_WRITES``), twice: every delayed message reaches
its topic exactly once and never before its time. Real processes, default configuration
(worker processes), one store clock shared with the test."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time

import pytest

from mqstore.format.delay_offsets import decode
from mqstore.testing import wait_for

from paths import SUPPORT

pytestmark = pytest.mark.slow
PROC = SUPPORT / "schedule_proc.py"
COUNT = 30  # ten at each of levels 1, 2, 3 (1 s, 5 s, 10 s)
DELAYS_MS = {1: 1_000, 2: 5_000, 3: 10_000}
FAULTS = {"plugins": {"modules": ["mqstore.testing.faults"]}, "writer": {"kind": "mmap_ctrl_c"}}
TIMEOUT_S = 120


class Scheduler:
    """``schedule_proc.py`` in a process group of its own."""

    def __init__(self, root, clock, kill_after_write: int | None = None,
                 kind: str = "levels") -> None:
        env = dict(os.environ)
        env.pop("MQSTORE_FAULT_SIGKILL_AFTER_WRITES", None)
        if kill_after_write is not None:
            env["MQSTORE_FAULT_SIGKILL_AFTER_WRITES"] = str(kill_after_write)
        self.err = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [sys.executable, str(PROC), str(root), clock._shm.name, str(COUNT),
             json.dumps(FAULTS), kind], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.err, env=env, start_new_session=True)
        line = self.proc.stdout.readline().decode()
        assert line.startswith("ready"), self.stderr()
        self.ready = json.loads(line.split(" ", 1)[1])

    def stderr(self) -> str:
        self.err.seek(0)
        return self.err.read().decode(errors="replace")[-4000:]

    def status(self) -> dict:
        self.proc.stdin.write(b"\n")
        self.proc.stdin.flush()
        return json.loads(self.proc.stdout.readline())

    def killed(self) -> None:
        """Wait for the fault to kill the group."""
        assert self.proc.wait(TIMEOUT_S) == -signal.SIGKILL, self.stderr()

    def close(self) -> None:
        self.proc.stdin.close()
        assert self.proc.wait(TIMEOUT_S) == 0, self.stderr()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def _timer_read_time(root) -> int:
    try:
        with open(root / "config" / "mqstore_timers.json", encoding="utf-8") as f:
            return json.load(f)["readTimeMs"]
    except FileNotFoundError:
        return 0


def _level_offsets(root) -> dict:
    try:
        with open(root / "config" / "delayOffset.json", encoding="utf-8") as f:
            return decode(f.read()).table
    except FileNotFoundError:
        return {}


def test_killed_between_delivering_and_recording_delivers_each_exactly_once(
        store_dir, manual_clock, make_store):
    start = manual_clock.now
    procs = []
    try:
        # Writes 1..30 are the puts; the 31st is the first delivery, level 1's ten copies.
        first = Scheduler(store_dir, manual_clock, kill_after_write=COUNT + 1)
        procs.append(first)
        manual_clock.now = start + DELAYS_MS[1]
        first.killed()
        assert 1 not in _level_offsets(store_dir)  # the copies are written, not recorded
        # The next start counts them; its own first write (level 2's copies) kills it again.
        second = Scheduler(store_dir, manual_clock, kill_after_write=1)
        procs.append(second)
        assert second.ready["recovered"] == 10 or wait_for(
            lambda: second.status()["recovered"] == 10, what="level 1 counted")
        manual_clock.now = start + DELAYS_MS[2]
        second.killed()
        assert _level_offsets(store_dir).get(2) is None
        third = Scheduler(store_dir, manual_clock)
        procs.append(third)
        status = wait_for(lambda: (s := third.status())["running"] and s,
                          what="the third start's schedule")
        assert status["offsets"] == {"1": 10, "2": 10} and status["recovered"] == 10
        manual_clock.now = start + DELAYS_MS[3] - 1
        assert wait_for(lambda: (s := third.status())["ticks"] > status["ticks"] + 1 and s)[
            "pending"] == {"3": 10}
        manual_clock.now = start + DELAYS_MS[3]
        wait_for(lambda: third.status()["pending"] == {}, what="level 3 delivered")
        third.close()
    finally:
        for proc in procs:
            proc.stop()
    store = make_store(root=store_dir)
    store.wait_dispatched()
    sources = {m.keys[0]: m for q in (0, 1, 2) for m in store.read("SCHEDULE_TOPIC_XXXX", q, 0)}
    copies = [m for q in (0, 1) for m in store.read("D", q, 0)]
    assert sorted(m.keys[0] for m in copies) == sorted(f"k{i}" for i in range(COUNT))
    for copy in copies:
        source = sources[copy.keys[0]]
        level = int(source.properties["DELAY"])
        assert copy.store_timestamp >= source.store_timestamp + DELAYS_MS[level]
        assert copy.properties_text == source.properties_text
    # The progress the schedule read at this open (its thread reads it at its first tick).
    status = wait_for(lambda: (s := store.schedule_status())["running"] and s,
                      what="the schedule of the last open")
    assert status["offsets"] == {1: 10, 2: 10, 3: 10}


def test_timers_killed_between_delivering_and_recording_deliver_each_exactly_once(
        store_dir, manual_clock, make_store):
    start = manual_clock.now
    procs = []
    try:
        # Due at the end of their second: start + 1 s, + 5 s, + 10 s (start is on a second).
        first = Scheduler(store_dir, manual_clock, kill_after_write=COUNT + 1, kind="timers")
        procs.append(first)
        manual_clock.now = start + DELAYS_MS[1]
        first.killed()
        assert _timer_read_time(store_dir) < start + DELAYS_MS[1]  # written, not recorded
        second = Scheduler(store_dir, manual_clock, kill_after_write=1, kind="timers")
        procs.append(second)
        status = wait_for(lambda: (s := second.status())["running"] and s,
                          what="the second start's schedule")
        assert status["recovered"] == 10 and status["timers_pending"] == 20
        manual_clock.now = start + DELAYS_MS[2]
        second.killed()
        third = Scheduler(store_dir, manual_clock, kind="timers")
        procs.append(third)
        status = wait_for(lambda: (s := third.status())["running"] and s,
                          what="the third start's schedule")
        # Nothing was recorded since the first put: both kills' copies are found past the
        # same bound, and each cancels the message it is a copy of.
        assert status["recovered"] == 20 and status["timers_pending"] == 10
        manual_clock.now = start + DELAYS_MS[3] - 1
        assert wait_for(lambda: (s := third.status())["ticks"] > status["ticks"] + 1 and s)[
            "timers_pending"] == 10
        manual_clock.now = start + DELAYS_MS[3]
        wait_for(lambda: third.status()["timers_pending"] == 0, what="the last ten delivered")
        third.close()
    finally:
        for proc in procs:
            proc.stop()
    store = make_store(root=store_dir)
    store.wait_dispatched()
    sources = {m.keys[0]: m for m in store.read("rmq_sys_wheel_timer", 0, 0)}
    copies = [m for q in (0, 1) for m in store.read("D", q, 0)]
    assert sorted(m.keys[0] for m in copies) == sorted(f"k{i}" for i in range(COUNT))
    for copy in copies:
        asked = int(sources[copy.keys[0]].properties["TIMER_DELIVER_MS"])
        assert asked <= copy.store_timestamp <= asked + 1_000


@pytest.mark.parametrize("kind", ["levels", "timers"])
def test_sigkills_at_random_moments_of_the_deliveries_lose_and_repeat_nothing(
        store_dir, manual_clock, make_store, kind):
    """The test kills the writer's process group itself, at random moments while the clock
    moves through the deliveries: wherever a kill lands, each message arrives once."""
    rng = random.Random(f"random-kills:{kind}")
    start = manual_clock.now
    kills = sorted(rng.sample(range(1, 40), 4))
    proc = Scheduler(store_dir, manual_clock, kind=kind)
    try:
        for step in range(1, 45):
            manual_clock.now = start + step * 250
            if step in kills:
                time.sleep(rng.random() * 0.15)  # somewhere in a tick's work, or between
                proc.stop()
                proc = Scheduler(store_dir, manual_clock, kind=kind)
        wait_for(lambda: (s := proc.status())["running"] and not s["pending"]
                 and not s["timers_pending"], what="every message delivered")
        proc.close()
    finally:
        proc.stop()
    store = make_store(root=store_dir)
    store.wait_dispatched()
    copies = [m for q in (0, 1) for m in store.read("D", q, 0)]
    assert sorted(m.keys[0] for m in copies) == sorted(f"k{i}" for i in range(COUNT))

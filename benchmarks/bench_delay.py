"""Scheduled messages: ``--count`` timed messages (RocketMQ 5's timers, ``TIMER_DELIVER_MS``)
spread evenly over an hour's window, delivered by the schedule thread of a store in this
process (worker processes, as by default).

The window runs on a scaled store clock: a ``ManualClock`` a driver thread moves to
``start + elapsed * --scale`` every 5 ms (``--scale 60``: the hour in a minute). What a message
waits for its step (up to ``store.timer_precision_ms`` of store time) does not scale; what the
schedule's tick and dispatch add is real time, so it shows ``--scale`` times larger in store
time: the lateness is printed in store ms and, for that part, in real ms (store ms / scale).

Printed:

    put            the timed messages, one ``put`` each (a batch may not hold them), msg/s,
                   against the same count of plain messages put the same way (the baseline:
                   what the rewrite to the timer topic costs)
    memory         the process's RSS before the puts, with every message pending, and after;
                   the timers' index (16 bytes a pending message)
    files          commit-log bytes, the timer queue's consume-queue bytes, the progress file
    restart        the store closed with half the messages pending and opened again: seconds
                   until its schedule runs (the index rebuilt from the timer queue)
    lateness       copy's store time - time asked, over every message: p50, p99, max (store
                   ms); every message delivered once, none before its time (checked)
    lag            copy's store time - the time it became due (the end of its step for a
                   timer, the deliver time for a level), in real ms (store ms / scale): what
                   the schedule's tick, dispatch and the put of the copies add

``--kind levels`` puts delay-level messages instead (levels 1..17: 1 s to 1 h), the hour
covered by the levels' delays.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import shutil
import tempfile
import threading
import time

import numpy as np

from benchlib import emit_json, load_config_compat
from mqstore import Message, MessageStore
from mqstore.format.schedule import timer_out_ms
from mqstore.testing import ManualClock

WINDOW_MS = 3_600_000
START_MS = 1_800_000_000_000  # on a second
TOPIC = "Scheduled"
QUEUES = 8
LEVELS_MS = [1_000, 5_000, 10_000, 30_000] + [m * 60_000 for m in range(1, 11)] + [
    1_200_000, 1_800_000, 3_600_000]


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


class ScaledClock:
    """Moves ``clock`` to ``base + elapsed * scale`` until stopped."""

    def __init__(self, clock: ManualClock, scale: float) -> None:
        self.clock, self.scale = clock, scale
        self.base, self.began = clock.now, time.perf_counter()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.005):
            self.clock.now = self.base + int((time.perf_counter() - self.began) * self.scale
                                             * 1000)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def config() -> object:
    return load_config_compat({"commit_log": {"segment_bytes": 256 << 20},
                               "plugins": {"load_entry_points": False}})


def dir_bytes(path: str) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        total += sum(os.path.getsize(os.path.join(dirpath, f)) for f in files)
    return total


def put_all(store, messages) -> float:
    began = time.perf_counter()
    for m in messages:
        r = store.put(m)
        assert r.status.value == "PUT_OK", r
    return time.perf_counter() - began


def messages(kind: str, count: int, rng: random.Random) -> tuple[list, dict]:
    """The messages, and each one's asked time by key (store ms)."""
    out, asked = [], {}
    for i in range(count):
        key = f"k{i}"
        if kind == "timers":
            when = START_MS + 10_000 + rng.randrange(WINDOW_MS - 10_000)
            props = {"TIMER_DELIVER_MS": str(when)}
        else:
            level = rng.randrange(1, 18)
            when = START_MS + LEVELS_MS[level - 1]
            props = {"DELAY": str(level)}
        asked[key] = when
        out.append(Message(TOPIC, b"x" * 64, keys=[key], queue_id=i % QUEUES,
                           properties=props))
    return out, asked


def wait_pending(store, below: int, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        s = store.schedule_status()
        pending = s["timers_pending"] + sum(s["pending"].values())
        if s["running"] and pending <= below:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"still {pending} pending after {timeout_s} s")
        time.sleep(0.05)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=100_000)
    ap.add_argument("--scale", type=float, default=60.0)
    ap.add_argument("--kind", choices=("timers", "levels"), default="timers")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rng = random.Random(7)
    work = tempfile.mkdtemp(prefix="bench-delay-")
    try:
        run(args, rng, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def run(args, rng, work: str) -> None:
    scheduled, asked = messages(args.kind, args.count, rng)
    plain = [Message(TOPIC, b"x" * 64, keys=[f"p{i}"], queue_id=i % QUEUES)
             for i in range(args.count)]
    clock = ManualClock(START_MS)
    with MessageStore.open(os.path.join(work, "plain"), config=config(), clock=clock) as s:
        base_s = put_all(s, plain)
    root = os.path.join(work, "store")
    store = MessageStore.open(root, config=config(), clock=clock)
    rss0 = rss_mb()
    put_s = put_all(store, scheduled)
    store.wait_dispatched(120)
    wait_pending(store, args.count, 120)  # the index holds them all
    rss1 = rss_mb()
    timers = store._parts.schedule.timers  # noqa: SLF001 - the index's own size
    index_bytes = timers.due.nbytes + timers.phys.nbytes
    timer_cq = dir_bytes(os.path.join(root, "consumequeue", "rmq_sys_wheel_timer"))
    schedule_cq = dir_bytes(os.path.join(root, "consumequeue", "SCHEDULE_TOPIC_XXXX"))
    log_bytes = store.max_phys_offset
    print(f"{args.count} {args.kind} over {WINDOW_MS // 60_000} min of store time, scale "
          f"{args.scale:g} (the window in {WINDOW_MS / 1000 / args.scale:.0f} s)")
    print(f"put        {args.count / put_s:10.0f} msg/s  (plain put {args.count / base_s:.0f} "
          f"msg/s, x base {base_s / put_s:.2f})")
    print(f"memory     RSS {rss0:.0f} MB before, {rss1:.0f} MB with all pending; timers' "
          f"index {index_bytes / 1e6:.2f} MB ({index_bytes / args.count:.0f} B a message)")
    print(f"files      commit log {log_bytes / 1e6:.1f} MB, timer queue {timer_cq / 1e6:.2f} MB"
          f", schedule queues {schedule_cq / 1e6:.2f} MB")

    scaled = ScaledClock(clock, args.scale)
    wait_pending(store, args.count // 2, WINDOW_MS / 1000 / args.scale + 120)
    scaled.stop()
    store.close()
    began = time.perf_counter()
    store = MessageStore.open(root, config=config(), clock=clock)
    while not store.schedule_status()["running"]:
        time.sleep(0.005)
    restart_s = time.perf_counter() - began
    pending = store.schedule_status()
    print(f"restart    {restart_s:.2f} s to a running schedule with "
          f"{pending['timers_pending'] + sum(pending['pending'].values())} pending "
          f"(open included)")
    scaled = ScaledClock(clock, args.scale)
    wait_pending(store, 0, WINDOW_MS / 1000 / args.scale + 120)
    scaled.stop()
    rss2 = rss_mb()
    store.wait_dispatched(120)
    late, lag = [], []
    for q in range(QUEUES):
        for m in store.read(TOPIC, q, 0, 1 << 20):
            when = asked.pop(m.keys[0])
            due = timer_out_ms(when, 1000) + 1000 if args.kind == "timers" else when
            late.append(m.store_timestamp - when)
            lag.append(m.store_timestamp - due)
    store.close()
    assert not asked, f"{len(asked)} never delivered"
    late = np.asarray(late)
    assert len(late) == args.count, f"{len(late)} copies for {args.count} messages"
    assert late.min() >= 0, f"delivered {-late.min()} ms early"
    p50, p99, worst = (float(np.percentile(late, 50)), float(np.percentile(late, 99)),
                       float(late.max()))
    print(f"lateness   store ms: p50 {p50:.0f}, p99 {p99:.0f}, max {worst:.0f}; every message "
          f"once, none early (RSS after {rss2:.0f} MB)")
    lag = np.asarray(lag) / args.scale
    print(f"lag        real ms after due: p50 {np.percentile(lag, 50):.0f}, p99 "
          f"{np.percentile(lag, 99):.0f}, max {lag.max():.0f}")
    if args.json:
        emit_json("delay", [("put_msgs_per_s", args.count / put_s, "msg/s", "higher"),
                            ("index_bytes_per_msg", index_bytes / args.count, "B", "lower"),
                            ("restart_s", restart_s, "s", "lower"),
                            ("lateness_p99_store_ms", p99, "ms", "lower")])


if __name__ == "__main__":
    main()

"""Search by store time (``offset_by_time``): the time-column search against the probing one.

One run writes N messages of 128 B (``--count``, default 1,000,000) to one queue, their store
times advancing 1 ms every ``--per-ms`` messages on a manual clock (so times repeat, as they do
under load), then asks ``--queries`` random timestamps (from before the first message to after
the last), half LOWER and half UPPER, each timed alone:

- ``api``: ``store.offset_by_time``, the public call (argument checks, queue lookup, search);
- ``search``: the search itself on the queue's objects;
- ``probing``: ``time_search.probing_offset_by_time``, the search as it was before the time
  column (one commit-log read per binary-search probe), on the same objects.

The three take turns over blocks of 500 queries, so the machine's load weighs on all alike.

Every answer of ``search`` is checked against ``probing``. It prints p50/p99 per row, the
ratios of ``probing`` to ``search`` and to ``api``, and how long the first search took
(it gathers the time column of the whole queue).
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

import numpy as np

from benchlib import emit_json
from mqstore import MessageBatch, MessageStore, load_config
from mqstore.clock import ManualClock
from mqstore.read.time_search import probing_offset_by_time as probing

TOPIC = "TimeBench"
BLOCK = 500


def write(root: str, count: int, per_ms: int, clock: ManualClock, dispatch: str) -> MessageStore:
    cfg = load_config(overrides={
        "commit_log": {"segment_bytes": 256 << 20},
        "plugins": {"load_entry_points": False},
        "dispatch": {"worker": dispatch},
    })
    store = MessageStore.open(root, config=cfg, clock=clock)
    body = b"b" * 128
    for start in range(0, count, per_ms):
        n = min(per_ms, count - start)
        r = store.put_batch(MessageBatch(topic=TOPIC, bodies=[body] * n, queue_ids=0))
        if r.status.name != "PUT_OK":
            raise RuntimeError(f"put_batch: {r.status} {r.error}")
        clock.now += 1
    store.wait_dispatched(timeout=3600)
    return store


def percentiles(samples: list[float]) -> tuple[float, float]:
    arr = np.array(samples) * 1e6
    return float(np.percentile(arr, 50)), float(np.percentile(arr, 99))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--per-ms", type=int, default=100, help="messages per store-time ms")
    ap.add_argument("--queries", type=int, default=20_000)
    ap.add_argument("--dispatch", choices=("thread", "process"), default="thread")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    from mqstore.read import time_search  # the revision's own search (this tree: the time column)

    root = tempfile.mkdtemp(prefix="mqstore-bench-time-")
    clock = ManualClock(1_700_000_000_000)
    t0 = clock.now
    try:
        began = time.perf_counter()
        store = write(root, args.count, args.per_ms, clock, args.dispatch)
        wrote_s = time.perf_counter() - began
        try:
            rng = random.Random(args.seed)
            span = clock.now - t0
            queries = [(rng.randint(t0 - 100, t0 + span + 100), rng.choice(("lower", "upper")))
                       for _ in range(args.queries)]
            began = time.perf_counter()
            store.offset_by_time(TOPIC, 0, t0, "lower")
            first_ms = (time.perf_counter() - began) * 1e3
            cl, cq = store.internals.commit_log, store.consume_queue(TOPIC, 0)
            calls = {
                "api": lambda ts, b: store.offset_by_time(TOPIC, 0, ts, b),
                "search": lambda ts, b: time_search.offset_by_time(cl, cq, ts, b),
                "probing": lambda ts, b: probing(cl, cq, ts, b),
            }
            samples = {name: [] for name in calls}
            answers = {name: [] for name in calls}
            order = list(calls)
            now = time.perf_counter
            # The paths take turns over blocks of queries (each block asked of all three, the
            # order rotating), so a change in the machine's load falls on all of them alike,
            # while within a block each runs as it would alone.
            for n, first in enumerate(range(0, len(queries), BLOCK)):
                block = queries[first:first + BLOCK]
                for name in order[n % 3:] + order[:n % 3]:
                    call, times, got = calls[name], samples[name], answers[name]
                    for ts, b in block:
                        began = now()
                        got.append(call(ts, b))
                        times.append(now() - began)
            rows = {name: percentiles(samples[name]) for name in calls}
        finally:
            store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    wrong = sum(a != b for a, b in zip(answers["search"], answers["probing"]))
    wrong += sum(a != b for a, b in zip(answers["api"], answers["probing"]))
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.count} messages "
          f"of 128 B in one queue ({wrote_s:.1f} s to write), {args.queries} queries, "
          f"dispatch {args.dispatch}")
    print(f"first search (gathers the time column): {first_ms:.1f} ms")
    for name, (p50, p99) in rows.items():
        print(f"{name:8s} p50 {p50:8.2f} us   p99 {p99:8.2f} us")
    ratio_search = rows["probing"][0] / rows["search"][0]
    ratio_api = rows["probing"][0] / rows["api"][0]
    print(f"p50 probing / search: {ratio_search:.1f}x   probing / api: {ratio_api:.1f}x")
    print(f"answers differing from probing: {wrong}")
    if args.json:
        emit_json("time_search", [
            ("api_p50_us", rows["api"][0], "us", "lower"),
            ("api_p99_us", rows["api"][1], "us", "lower"),
            ("search_p50_us", rows["search"][0], "us", "lower"),
            ("probing_p50_us", rows["probing"][0], "us", "lower"),
            ("first_search_ms", first_ms, "ms", "lower"),
        ], count=args.count)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

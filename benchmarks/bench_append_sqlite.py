"""Small-message appends, timed until readable: mqstore's put_batch against SQLite in WAL mode.

The same N messages (``--count``, default 200,000) at 128 B and at 1 KiB, spread round-robin
over 4 queues of one topic with one tag, are written three ways, each into a fresh directory:

1. ``sqlite``     -- stdlib ``sqlite3``, ``journal_mode=WAL``, ``synchronous=NORMAL`` (no fsync
                     per commit, as mqstore's default async flush), a table with a rowid key
                     and columns queue, offset, store time, tags, body, indexed on
                     (queue, offset) and on store time; ``executemany`` of ``--batch`` rows per
                     transaction. A row is readable once its transaction commits;
2. ``batch_cols`` -- ``put_batch(MessageBatch)`` of ``--batch`` messages (one body list, the
                     queue ids as an array, a shared topic and tag), timed until
                     ``wait_dispatched`` returns, i.e. until every message is readable through
                     its consume queue (dispatch runs in a worker process by default);
3. ``batch_msgs`` -- ``put_batch([Message, ...])`` of the same messages, timed the same way.

The queue offsets SQLite stores are computed before timing (mqstore assigns its own under
the put lock), which can only flatter SQLite. The store time is taken once per batch on both
sides. Before timing, each side writes one extra batch (not counted): SQLite's table and
indexes exist, the store's worker runs and its files are created. The store uses 256 MiB
commit-log segments, entry-point plugins off and otherwise the default configuration (the key
index included); ``--keys`` gives every message a distinct key (SQLite then stores it in a
``keys`` column with its own index).

The three run one after another ``--rounds`` times (default 3), each round starting with
another of them, with ``os.sync()`` before each (untimed); the table shows each one's median
msg/s and the ratio of the store's medians to SQLite's, next to the range of the per-round
ratios. Ratios measured in the same run are the figures to compare: absolute rates
on a shared machine move by tens of percent. Targets print PASS/MISS and never fail the run.
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from functools import partial

import numpy as np

from benchlib import emit_json, load_config_compat
from mqstore import Message, MessageBatch, MessageStore, PutStatus

SEGMENT_BYTES = 256 << 20
TOPIC = "BenchAppendTopic"
TAG = "TagA"
QUEUES = 4
SIZES = ((128, "128 B"), (1024, "1 KiB"))
DISTINCT_BODIES = 1024  # bodies cycle through this many distinct values (memory stays small)
WAIT_S = 300  # longest wait for dispatch to catch up: a store that never does fails the run
CFG = load_config_compat({"commit_log": {"segment_bytes": SEGMENT_BYTES},
                          "plugins": {"load_entry_points": False},
                          "dispatch": {"worker": "process"}})
TARGETS = (  # (label, head, base, goal): head / base >= goal
    ("128 B", "batch_cols", "sqlite", 1.0),
    ("1 KiB", "batch_cols", "sqlite", 2.0),
    ("128 B", "batch_msgs", "batch_cols", 0.8),
    ("1 KiB", "batch_msgs", "batch_cols", 0.8),
)


class Load:
    """The messages of one body size, as columns and as batches of each kind (built before
    timing). Batch 0 is the warm-up batch."""

    def __init__(self, count: int, batch: int, body_size: int, keys: bool) -> None:
        total = count + batch
        pool = [bytes((i * 7 + j) % 251 for j in range(body_size))
                for i in range(min(DISTINCT_BODIES, total))]
        self.count, self.batch = count, batch
        self.bodies = [pool[i % len(pool)] for i in range(total)]
        self.queue_ids = np.arange(total, dtype=np.int64) % QUEUES
        self.offsets = np.arange(total, dtype=np.int64) // QUEUES
        self.keys = [f"key-{i}" for i in range(total)] if keys else None
        self.spans = [(lo, min(lo + batch, total)) for lo in range(0, total, batch)]
        self.columns = [MessageBatch(topic=TOPIC, bodies=self.bodies[lo:hi],
                                     queue_ids=self.queue_ids[lo:hi], tags=TAG,
                                     keys=None if self.keys is None else
                                     [[k] for k in self.keys[lo:hi]])
                        for lo, hi in self.spans]
        qids = self.queue_ids.tolist()
        self.messages = [[Message(topic=TOPIC, body=self.bodies[i], tags=TAG,
                                  keys=None if self.keys is None else [self.keys[i]],
                                  queue_id=qids[i]) for i in range(lo, hi)]
                         for lo, hi in self.spans]


def phase_dir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="mqstore-bench-")


def bench_sqlite(load: Load) -> float:
    """Seconds to insert the timed batches, one transaction of executemany each."""
    keyed = load.keys is not None
    with phase_dir() as d:
        con = sqlite3.connect(os.path.join(d, "bench.db"), isolation_level=None)
        try:
            con.execute("PRAGMA journal_mode=WAL")
            con.execute("PRAGMA synchronous=NORMAL")
            con.execute("CREATE TABLE msg (id INTEGER PRIMARY KEY, queue INTEGER, offset INTEGER,"
                        " store_time INTEGER, tags TEXT, body BLOB"
                        + (", keys TEXT)" if keyed else ")"))
            con.execute("CREATE INDEX msg_queue_offset ON msg (queue, offset)")
            con.execute("CREATE INDEX msg_store_time ON msg (store_time)")
            if keyed:
                con.execute("CREATE INDEX msg_keys ON msg (keys)")
            sql = ("INSERT INTO msg (queue, offset, store_time, tags, body"
                   + (", keys) VALUES (?, ?, ?, ?, ?, ?)" if keyed else ") VALUES (?, ?, ?, ?, ?)"))
            queues, offsets, bodies = load.queue_ids.tolist(), load.offsets.tolist(), load.bodies
            keys = load.keys

            def insert(lo: int, hi: int) -> None:
                now = time.time_ns() // 1_000_000
                rows = zip(queues[lo:hi], offsets[lo:hi], [now] * (hi - lo), [TAG] * (hi - lo),
                           bodies[lo:hi], *([keys[lo:hi]] if keyed else []))
                con.execute("BEGIN")
                con.executemany(sql, rows)
                con.execute("COMMIT")

            insert(*load.spans[0])
            gc.collect()
            t0 = time.perf_counter()
            for lo, hi in load.spans[1:]:
                insert(lo, hi)
            elapsed = time.perf_counter() - t0
            found = con.execute("SELECT count(*) FROM msg").fetchone()[0]
        finally:
            con.close()
    if found != load.count + load.spans[0][1]:
        raise RuntimeError(f"sqlite holds {found} rows, wrote {load.count + load.spans[0][1]}")
    return elapsed


def bench_store(batches: list) -> float:
    """Seconds from the first timed put_batch until wait_dispatched returns after the last."""
    with phase_dir() as d, MessageStore.open(d, config=CFG) as s:
        def put(b) -> None:
            r = s.put_batch(b)
            if r.status is not PutStatus.PUT_OK:
                raise RuntimeError(f"put_batch: {r.status} {r.error}")

        put(batches[0])
        s.wait_dispatched(timeout=WAIT_S)
        gc.collect()
        t0 = time.perf_counter()
        for b in batches[1:]:
            put(b)
        s.wait_dispatched(timeout=WAIT_S)
        return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200_000, help="messages per body size")
    ap.add_argument("--batch", type=int, default=1000, help="messages per batch or transaction")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each writer per body size")
    ap.add_argument("--keys", action="store_true", help="a distinct key per message")
    ap.add_argument("--json", action="store_true", help="also print one BENCH-JSON line with "
                    "the figures (for benchmarks/compare.py)")
    args = ap.parse_args()
    if min(args.count, args.batch, args.rounds) < 1:
        ap.error("--count, --batch and --rounds must be >= 1")
    print(f"mqstore append vs SQLite WAL  python {platform.python_version()}  sqlite "
          f"{sqlite3.sqlite_version}  cpus={os.cpu_count()}  count={args.count}  "
          f"batch={args.batch}  rounds={args.rounds}  keys={'yes' if args.keys else 'no'}  "
          f"tmp={tempfile.gettempdir()}")
    head = (f"{'size':>5}  {'writer':<10} {'msg/s':>10} {'MB/s body':>9} {'x sqlite':>8} "
            f"{'round ratios':>13}")
    print(head)
    print("-" * len(head))
    medians: dict[tuple[str, str], float] = {}
    for size_no, (body_size, label) in enumerate(SIZES):
        load = Load(args.count, args.batch, body_size, args.keys)
        gc.freeze()  # the pre-built messages are the harness's, not garbage for the store
        runs: dict[str, list[float]] = {"sqlite": [], "batch_cols": [], "batch_msgs": []}
        writers = [("sqlite", partial(bench_sqlite, load)),
                   ("batch_cols", partial(bench_store, load.columns)),
                   ("batch_msgs", partial(bench_store, load.messages))]
        for r in range(args.rounds):
            # Each round (and size) starts with another writer, so none always follows the
            # same one; the page cache's dirty pages are written out between writers, outside
            # the timing, so none pays for its predecessor's.
            turn = (r + size_no) % len(writers)
            for name, run in writers[turn:] + writers[:turn]:
                os.sync()
                runs[name].append(args.count / run())
        del load, writers
        gc.unfreeze()
        for writer, rates in runs.items():
            medians[label, writer] = rate = statistics.median(rates)
            ratios = [r / s for r, s in zip(rates, runs["sqlite"])]
            spread = f"{min(ratios):.2f}-{max(ratios):.2f}" if writer != "sqlite" else ""
            print(f"{label:>5}  {writer:<10} {rate:>10,.0f} {rate * body_size / 1e6:>9.1f} "
                  f"{rate / medians[label, 'sqlite']:>8.2f} {spread:>13}")
        print("-" * len(head))
    print("targets:")
    for label, a, b, goal in TARGETS:
        value = medians[label, a] / medians[label, b]
        name = f"{label} {a} >= {goal:g}x {b}"
        print(f"  {'PASS' if value >= goal else 'MISS'}  {name:<36} measured {value:.2f}x")
    if args.json:
        # SQLite's rows run no mqstore code: their spread between runs is the machine's
        metrics = [(f"{label} {writer}" + (" (no mqstore)" if writer == "sqlite" else ""),
                    rate, "msg/s", "higher") for (label, writer), rate in medians.items()]
        metrics += [(f"{label} {w} / sqlite", medians[label, w] / medians[label, "sqlite"], "x",
                     "higher") for _s, label in SIZES for w in ("batch_cols", "batch_msgs")]
        emit_json("append_sqlite", metrics)


if __name__ == "__main__":
    sys.exit(main())

"""Reads against SQLite: four read figures of mqstore, each beside SQLite's for the same work.

The same N messages (``--count``, default 200,000, of ``--body-bytes``, default 128, round-robin
over 4 queues of one topic, one tag, message i carrying the key ``k<i>``) go into:

* mqstore: ``put_batch(MessageBatch)`` of 1,000 messages, 256 MiB commit-log segments,
  entry-point plugins off, otherwise the default configuration (dispatch in a worker process,
  key index on); then ``wait_dispatched``;
* SQLite (stdlib ``sqlite3``): ``journal_mode=WAL``, ``synchronous=NORMAL``, table
  ``t(id INTEGER PRIMARY KEY, queue, qoffset, store_ts, tags, key, body)`` indexed on
  (queue, qoffset), on store_ts and on key; ``executemany`` of 1,000 rows per transaction,
  with the queue offsets and store times the store assigned (so both hold the same rows and
  every answer can be checked against the other). Then ``ANALYZE`` (so the planner knows that
  ``queue`` has 4 values) and a WAL checkpoint (reads come from the main file).

Nothing of the writing is timed. Both live in the page cache (just written, and one untimed
pass of every figure before the timed ones); SQLite keeps its default page cache. The four
figures (``time.perf_counter``), each with SQLite's counterpart:

1. bulk read, msg/s: ``read(topic, q, offset, 1000)`` (bodies' CRCs checked, the default)
   following ``next_begin_offset`` through every queue until a batch is empty, touching
   ``len(batch)``, ``batch.bodies`` and ``batch.body_offsets`` (no per-row Python); SQLite
   ``SELECT qoffset, body FROM t WHERE queue=? ORDER BY qoffset`` with ``fetchmany(1000)`` and
   ``len(body)`` per row;
2. get(32), msg/s: ``get(group, topic, q, offset, 32)`` through every queue, ``len(m.body)``
   per message (get keeps RocketMQ's transfer limits: at most 32 messages per call from
   memory); against the same SQLite ordered read;
3. get(1), p50 us over ``--queries`` random (queue, offset): ``get(g, topic, q, offset, 1)``
   and ``len(body)``; SQLite ``SELECT body FROM t WHERE queue=? AND qoffset=?``;
4. time seek, p50 us over random timestamps within each queue's stored range:
   ``offset_by_time(topic, q, ts)`` (the first offset stored at or after ts); SQLite
   ``SELECT qoffset FROM t WHERE queue=? AND store_ts >= ? ORDER BY store_ts LIMIT 1``.
   A ``put_batch`` takes one store time, so each time repeats for 250 messages of a queue.

The ratio of each figure is mqstore's over SQLite's: for the rates (1, 2) a speed ratio, higher
is better; for the latencies (3, 4) a time ratio, lower is better. ``--repeats`` times (5) every
figure is measured anew with SQLite's beside it (ordered reads: the contenders take turns queue
by queue, the order rotating, and a ratio is taken per queue; latencies: each query is put to
each contender in turn, the order rotating, and the ratio of the p50s is taken per repeat); the
median of these ratios decides, their range is printed beside it. Every answer is checked
(count, body bytes, offsets, the time search against the store times the puts returned); a
wrong answer is reported and makes the exit status 1 after everything is printed. Targets
print PASS/MISS and never fail the run. Against a revision without ``MessageStore.read`` the
bulk read is skipped (noted).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import random
import sqlite3
import statistics
import sys
import tempfile
import time

import numpy as np

from benchlib import emit_json, load_config_compat
from mqstore import GetStatus, MessageBatch, MessageStore, PutStatus

SEGMENT_BYTES = 256 << 20
TOPIC = "BenchReadTopic"
GROUP = "bench"
TAG = "TagA"
QUEUES = 4
BATCH = 1000           # messages per put_batch / rows per SQLite transaction
READ_BATCH = 1000      # rows per store.read call and per fetchmany
GET_BATCH = 32         # messages per get call (RocketMQ's in-memory transfer limit)
DISTINCT_BODIES = 1024  # bodies cycle through this many distinct values (memory stays small)
CFG = load_config_compat({"commit_log": {"segment_bytes": SEGMENT_BYTES},
                          "plugins": {"load_entry_points": False},
                          "dispatch": {"worker": "process"}})

SQL_ORDERED = "SELECT qoffset, body FROM t WHERE queue=? ORDER BY qoffset"
SQL_ONE = "SELECT body FROM t WHERE queue=? AND qoffset=?"
SQL_TIME = "SELECT qoffset FROM t WHERE queue=? AND store_ts >= ? ORDER BY store_ts LIMIT 1"

HAS_READ = callable(getattr(MessageStore, "read", None))


class Figure:
    """One of the four figures: its name as compare.py knows it, how it is printed, its unit,
    which way is better and its target, a ratio to SQLite's figure."""

    def __init__(self, key: str, label: str, unit: str, better: str, sqlite_key: str,
                 target: float, target_text: str) -> None:
        self.key, self.label, self.unit, self.better = key, label, unit, better
        self.sqlite_key, self.target, self.target_text = sqlite_key, target, target_text

    def met(self, ratio: float) -> bool:
        return ratio >= self.target if self.better == "higher" else ratio <= self.target


FIGURES = (
    Figure("read verify", "bulk read(1000)", "msg/s", "higher", "sqlite ordered", 1.0,
           ">= 1.0x SQLite's ordered read (speed)"),
    Figure("get(32)", "get(32)", "msg/s", "higher", "sqlite ordered", 0.6,
           ">= 0.6x SQLite's ordered read (speed)"),
    Figure("get(1) p50", "get(1) p50", "us", "lower", "sqlite one row p50", 1.0,
           "<= 1.0x SQLite's one-row select (time)"),
    Figure("offset_by_time p50", "time seek offset_by_time p50", "us", "lower",
           "sqlite time seek p50", 1.0, "<= 1.0x SQLite's seek by time (time)"),
)


class Problems(list):
    """Wrong answers seen (the run goes on; the exit status says so at the end)."""

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.append(what)
            print(f"  WRONG  {what}", flush=True)


PROBLEMS = Problems()


class Loaded:
    """The messages (built before writing) and, once written, what the puts returned: in
    message order and, per queue, in queue-offset order (0..n-1)."""

    def __init__(self, count: int, body_size: int) -> None:
        self.count, self.body_size = count, body_size
        pool = [bytes((i * 7 + j) % 251 for j in range(body_size))
                for i in range(min(DISTINCT_BODIES, count))]
        self.bodies = [pool[i % len(pool)] for i in range(count)]
        self.queue_ids = np.arange(count, dtype=np.int64) % QUEUES
        self.keys = [f"k{i}" for i in range(count)]
        self.qoffsets = np.empty(count, dtype=np.int64)
        self.store_ts = np.empty(count, dtype=np.int64)
        self.per_queue_ts: dict[int, np.ndarray] = {}

    def queue_columns(self) -> None:
        for q in range(QUEUES):
            sel = self.queue_ids == q
            order = np.argsort(self.qoffsets[sel], kind="stable")
            qoff = self.qoffsets[sel][order]
            PROBLEMS.check(np.array_equal(qoff, np.arange(len(qoff))),
                           f"queue {q}: put results do not give offsets 0..{len(qoff) - 1}")
            self.per_queue_ts[q] = self.store_ts[sel][order]


def write_store(store: MessageStore, load: Loaded) -> None:
    for lo in range(0, load.count, BATCH):
        hi = min(lo + BATCH, load.count)
        r = store.put_batch(MessageBatch(topic=TOPIC, bodies=load.bodies[lo:hi],
                                         queue_ids=load.queue_ids[lo:hi], tags=TAG,
                                         keys=load.keys[lo:hi]))
        if r.status is not PutStatus.PUT_OK:
            raise RuntimeError(f"put_batch: {r.status} {r.error}")
        load.qoffsets[lo:hi] = r.queue_offsets
        load.store_ts[lo:hi] = r.store_timestamp
        if not np.array_equal(np.asarray(r.queue_ids), load.queue_ids[lo:hi]):
            raise RuntimeError("put_batch placed messages in other queues than asked")
    store.wait_dispatched(timeout=600)
    load.queue_columns()


def write_sqlite(path: str, load: Loaded) -> sqlite3.Connection:
    con = sqlite3.connect(path, isolation_level=None)
    con.execute("PRAGMA journal_mode=WAL")
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, queue INTEGER NOT NULL, "
                "qoffset INTEGER NOT NULL, store_ts INTEGER NOT NULL, tags TEXT, key TEXT, "
                "body BLOB)")
    con.execute("CREATE INDEX t_queue_qoffset ON t (queue, qoffset)")
    con.execute("CREATE INDEX t_store_ts ON t (store_ts)")
    con.execute("CREATE INDEX t_key ON t (key)")
    sql = "INSERT INTO t (queue, qoffset, store_ts, tags, key, body) VALUES (?, ?, ?, ?, ?, ?)"
    queues, qoffs, ts = load.queue_ids.tolist(), load.qoffsets.tolist(), load.store_ts.tolist()
    for lo in range(0, load.count, BATCH):
        hi = min(lo + BATCH, load.count)
        con.execute("BEGIN")
        con.executemany(sql, zip(queues[lo:hi], qoffs[lo:hi], ts[lo:hi], [TAG] * (hi - lo),
                                 load.keys[lo:hi], load.bodies[lo:hi]))
        con.execute("COMMIT")
    con.execute("ANALYZE")
    con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    return con


def query_plans(con: sqlite3.Connection) -> list[str]:
    out = []
    for name, sql, args in (("ordered", SQL_ORDERED, (0,)), ("one", SQL_ONE, (0, 0)),
                            ("time", SQL_TIME, (0, 0))):
        plan = "; ".join(row[-1] for row in con.execute("EXPLAIN QUERY PLAN " + sql, args))
        out.append(f"{name}: {plan}")
    return out


# -- ordered reads: bulk read, get(32) and SQLite's ordered read --------------------------------

def ordered_sqlite(con: sqlite3.Connection, _store, q: int) -> tuple[int, int]:
    n = nbytes = 0
    cur = con.execute(SQL_ORDERED, (q,))
    while True:
        rows = cur.fetchmany(READ_BATCH)
        if not rows:
            break
        for _off, body in rows:
            nbytes += len(body)
        n += len(rows)
    return n, nbytes


def ordered_read(_con, store: MessageStore, q: int) -> tuple[int, int]:
    read = store.read
    n = nbytes = ends = offset = 0
    while True:
        batch = read(TOPIC, q, offset, READ_BATCH)
        k = len(batch)
        if not k:
            break
        n += k
        nbytes += len(batch.bodies)
        ends += int(batch.body_offsets[k]) - int(batch.body_offsets[0])
        offset = batch.next_begin_offset
    if ends != nbytes:
        PROBLEMS.check(False, f"read: body_offsets span {ends} bytes, bodies {nbytes}")
    return n, nbytes


def ordered_get(_con, store: MessageStore, q: int) -> tuple[int, int]:
    get, found, end = store.get, GetStatus.FOUND, GetStatus.OFFSET_OVERFLOW_ONE
    n = nbytes = offset = 0
    while True:
        r = get(GROUP, TOPIC, q, offset, GET_BATCH)
        if r.status is not found:
            if r.status is not end:
                PROBLEMS.check(False, f"get {q}@{offset}: {r.status}")
            break
        for m in r.messages:
            nbytes += len(m.body)
        n += len(r.messages)
        offset = r.next_begin_offset
    return n, nbytes


ORDERED = {"sqlite ordered": ordered_sqlite, "get(32)": ordered_get}
if HAS_READ:
    ORDERED = {"read verify": ordered_read, **ORDERED}


def ordered_rates(con, store, load: Loaded, shift: int) -> dict:
    """Each ordered read through every queue, the contenders taking turns queue by queue
    (their order rotating), so that all of them read a queue within moments of each other:
    msg/s over all queues, and under "ratios" each read's rate over SQLite's, per queue."""
    names = list(ORDERED)
    secs = dict.fromkeys(names, 0.0)
    counts = {name: [0, 0] for name in names}
    per_queue = {name: [] for name in names}
    for q in range(QUEUES):
        k = (shift + q) % len(names)
        for name in names[k:] + names[:k]:
            gc.collect()
            t0 = time.perf_counter()
            n, nbytes = ORDERED[name](con, store, q)
            took = time.perf_counter() - t0
            secs[name] += took
            counts[name][0] += n
            counts[name][1] += nbytes
            per_queue[name].append(n / took)
    for name, (n, nbytes) in counts.items():
        PROBLEMS.check(n == load.count and nbytes == load.count * load.body_size,
                       f"{name}: read {n} messages / {nbytes} body bytes, wrote "
                       f"{load.count} / {load.count * load.body_size}")
    out: dict = {name: counts[name][0] / secs[name] for name in names}
    out["ratios"] = {name: [a / b for a, b in zip(per_queue[name], per_queue["sqlite ordered"])]
                     for name in names if name != "sqlite ordered"}
    return out


# -- one query at a time: get(1), time seek ------------------------------------------------------

def timed_rotating(calls: dict, args_list: list) -> tuple[dict[str, np.ndarray], dict]:
    """Each call on each argument tuple, contenders in rotating order; seconds and answers."""
    names = list(calls)
    secs = {name: np.empty(len(args_list)) for name in names}
    answers = {name: [None] * len(args_list) for name in names}
    now = time.perf_counter
    gc.collect()
    for i, a in enumerate(args_list):
        shift = i % len(names)
        for name in names[shift:] + names[:shift]:
            call = calls[name]
            t0 = now()
            got = call(*a)
            secs[name][i] = now() - t0
            answers[name][i] = got
    return secs, answers


def one_latency(con, store, load: Loaded, queries: int, rng: random.Random) -> dict[str, float]:
    """get(1) and SQLite's one-row select: p50 us."""
    per_q = load.count // QUEUES  # every queue holds at least this many
    points = [(rng.randrange(QUEUES), rng.randrange(per_q)) for _ in range(queries)]
    execute, get = con.execute, store.get

    def sqlite_one(q, off):
        return len(execute(SQL_ONE, (q, off)).fetchone()[0])

    def get_one(q, off):
        r = get(GROUP, TOPIC, q, off, 1)
        len(r.messages[0].body)
        return r

    secs, ans = timed_rotating({"sqlite one row p50": sqlite_one, "get(1) p50": get_one},
                               points)
    size = load.body_size
    bad = sum(n != size for n in ans["sqlite one row p50"])
    bad_get = sum(r.status is not GetStatus.FOUND or len(r.messages) != 1
                  or r.messages[0].queue_offset != off or r.messages[0].queue_id != q
                  or len(r.messages[0].body) != size
                  for r, (q, off) in zip(ans["get(1) p50"], points))
    PROBLEMS.check(not bad, f"sqlite one-row select: {bad} wrong bodies")
    PROBLEMS.check(not bad_get, f"get(1): {bad_get} wrong answers of {queries}")
    return {name: p50_us(s) for name, s in secs.items()}


def seek_latency(con, store, load: Loaded, queries: int, rng: random.Random) -> dict[str, float]:
    """offset_by_time and SQLite's seek by time: p50 us."""
    ts = load.per_queue_ts
    points = []
    for _ in range(queries):
        q = rng.randrange(QUEUES)
        points.append((q, rng.randint(int(ts[q][0]), int(ts[q][-1]))))
    execute, by_time = con.execute, store.offset_by_time

    def sqlite_time(q, t):
        return execute(SQL_TIME, (q, t)).fetchone()[0]

    def store_time(q, t):
        return by_time(TOPIC, q, t)

    secs, ans = timed_rotating({"sqlite time seek p50": sqlite_time,
                                "offset_by_time p50": store_time}, points)
    expect = [int(np.searchsorted(ts[q], t, side="left")) for q, t in points]
    bad = sum(a != e for a, e in zip(ans["offset_by_time p50"], expect))
    # SQLite's ORDER BY store_ts may pick any row of the first matching time: compare times.
    bad_sql = sum(ts[q][a] != ts[q][e]
                  for a, e, (q, _t) in zip(ans["sqlite time seek p50"], expect, points))
    PROBLEMS.check(not bad, f"offset_by_time: {bad} of {queries} answers are not the first "
                            f"offset stored at or after the time")
    PROBLEMS.check(not bad_sql, f"sqlite time seek: {bad_sql} wrong answers")
    return {name: p50_us(s) for name, s in secs.items()}


def p50_us(secs: np.ndarray) -> float:
    return float(np.percentile(secs, 50)) * 1e6


# -- driver -----------------------------------------------------------------------------------

def measure(con, store, load: Loaded, repeats: int, queries: int, seed: int) -> list[dict]:
    """Every figure and SQLite's, ``repeats`` times after one untimed round: per repeat
    {name: value}."""
    rng = random.Random(seed)
    warm = max(1, queries // 10)
    ordered_rates(con, store, load, 0)  # warms the page cache, statements and time columns
    one_latency(con, store, load, warm, rng)
    seek_latency(con, store, load, warm, rng)
    out = []
    for r in range(repeats):
        got = ordered_rates(con, store, load, r)
        got.update(one_latency(con, store, load, queries, rng))
        got.update(seek_latency(con, store, load, queries, rng))
        out.append(got)
    return out


def run(count: int, body_size: int, repeats: int, queries: int, seed: int) -> list[dict]:
    load = Loaded(count, body_size)
    gc.freeze()  # the pre-built bodies and keys are the harness's, not garbage to scan
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-read-") as d:
        t0 = time.perf_counter()
        store = MessageStore.open(os.path.join(d, "store"), config=CFG)
        con = None
        try:
            write_store(store, load)
            con = write_sqlite(os.path.join(d, "bench.db"), load)
            print(f"written in {time.perf_counter() - t0:.1f} s (untimed)")
            for line in query_plans(con):
                print(f"  sqlite plan  {line}")
            results = measure(con, store, load, repeats, queries, seed)
        finally:
            if con is not None:
                con.close()
            store.close()
    del load
    gc.unfreeze()
    return results


def summarize(results: list[dict]) -> list[tuple[Figure, float, float, float, float, float]]:
    """Per figure present: (figure, median mqstore, median SQLite, median ratio, lowest and
    highest ratio), the ratios taken within each repeat (for the ordered reads, within each
    queue's turn of each repeat)."""
    rows = []
    for fig in FIGURES:
        if fig.key not in results[0]:
            continue
        ratios = [x for r in results for x in r["ratios"].get(fig.key, ())] or \
            [r[fig.key] / r[fig.sqlite_key] for r in results]
        rows.append((fig, statistics.median(r[fig.key] for r in results),
                     statistics.median(r[fig.sqlite_key] for r in results),
                     statistics.median(ratios), min(ratios), max(ratios)))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, help="messages, over 4 queues (default 200000; "
                    "20000 with --quick)")
    ap.add_argument("--body-bytes", type=int, default=128, help="body size (default 128)")
    ap.add_argument("--queries", type=int, help="random queries per latency figure and repeat "
                    "(default 5000; 1000 with --quick)")
    ap.add_argument("--repeats", type=int, help="times every figure is measured with SQLite's "
                    "beside it, after one untimed round (default 5; 3 with --quick)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20000 messages, "
                    "1000 queries, 3 repeats")
    ap.add_argument("--seed", type=int, default=1, help="random positions and times")
    ap.add_argument("--json", action="store_true", help="also print one BENCH-JSON line with "
                    "the figures (for benchmarks/compare.py)")
    args = ap.parse_args()
    count = args.count or (20_000 if args.quick else 200_000)
    queries = args.queries or (1_000 if args.quick else 5_000)
    repeats = args.repeats or (3 if args.quick else 5)
    if count < QUEUES or queries < 1 or repeats < 1 or args.body_bytes < 1:
        ap.error(f"--count must be >= {QUEUES}, --queries, --repeats and --body-bytes >= 1")
    label = f"{args.body_bytes} B" if args.body_bytes % 1024 else f"{args.body_bytes >> 10} KiB"

    print(f"mqstore reads vs SQLite WAL  python {platform.python_version()}  sqlite "
          f"{sqlite3.sqlite_version}  cpus={os.cpu_count()}  count={count} x {label} over "
          f"{QUEUES} queues  queries={queries}  repeats={repeats}  "
          f"segment={SEGMENT_BYTES >> 20} MiB  tmp={tempfile.gettempdir()}  "
          f"load avg {os.getloadavg()[0]:.2f}")
    if not HAS_READ:
        print("note: this mqstore has no MessageStore.read: the bulk read is skipped")
    results = run(count, args.body_bytes, repeats, queries, args.seed)
    rows = summarize(results)
    head = (f"{'figure':<30} {'unit':<6} {'mqstore':>11} {'SQLite':>11} {'mq/SQLite':>9} "
            f"{'range':>11}  better")
    print(f"medians over {repeats} repeats; mq/SQLite: the median of the ratios measured "
          f"side by side (per queue for the rates), range: their lowest and highest")
    print(head)
    print("-" * len(head))
    for fig, mq, sq, ratio, lo, hi in rows:
        value = (f"{mq:>11,.0f} {sq:>11,.0f}" if fig.unit == "msg/s"
                 else f"{mq:>11.2f} {sq:>11.2f}")
        print(f"{fig.label:<30} {fig.unit:<6} {value} {ratio:>9.2f} {lo:>5.2f}-{hi:<5.2f}  "
              f"{fig.better} ({'speed' if fig.better == 'higher' else 'time'} ratio)")
    print("-" * len(head))
    print(f"load avg {os.getloadavg()[0]:.2f} at the end")
    print("targets (on the median ratio):")
    width = max(len(f.label) + len(f.target_text) for f in FIGURES) + 1
    for fig in FIGURES:
        row = next((r for r in rows if r[0] is fig), None)
        name = f"{fig.label} {fig.target_text}"
        if row is None:
            print(f"  SKIP  {name:<{width}}  no store.read in this revision")
        else:
            print(f"  {'PASS' if fig.met(row[3]) else 'MISS'}  {name:<{width}}  "
                  f"measured {row[3]:.2f}x")
    if PROBLEMS:
        print(f"WRONG ANSWERS ({len(PROBLEMS)}): the figures above time incorrect reads")
        for p in PROBLEMS:
            print(f"  {p}")
    if args.json:
        metrics = []
        for fig, mq, sq, ratio, _lo, _hi in rows:
            metrics += [(f"{label} {fig.key}", mq, fig.unit, fig.better),
                        (f"{label} {fig.key} / sqlite", ratio, "x", fig.better)]
        for key, unit, better in (("sqlite ordered", "msg/s", "higher"),
                                  ("sqlite one row p50", "us", "lower"),
                                  ("sqlite time seek p50", "us", "lower")):
            metrics.append((f"{label} {key} (no mqstore)",
                            statistics.median(r[key] for r in results), unit, better))
        emit_json("read_sqlite", metrics)
    return 1 if PROBLEMS else 0


if __name__ == "__main__":
    sys.exit(main())

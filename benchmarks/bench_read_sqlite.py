"""Reads against SQLite: the same messages read back from mqstore and from an SQLite WAL table.

From a warm page cache: mqstore's ``read``, ``get``, ``message_at``, ``offset_by_time`` and
``query_by_key`` against the equivalent indexed SQLite queries.

For each body size (128 B and 1 KiB) the same N messages (``--count``, default 200,000) go,
round-robin over 4 queues of one topic, one tag, message i carrying the key ``k<i>``, into:

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
pass over everything before the ordered reads); SQLite keeps its default page cache. Timed
with ``time.perf_counter``:

1. ordered read of everything, queue by queue (msg/s): SQLite ``SELECT qoffset, body FROM t
   WHERE queue=? ORDER BY qoffset`` with ``fetchmany(1000)``, ``len(body)`` per row; mqstore
   ``read(topic, q, offset, 1000)`` following ``next_begin_offset`` until a batch is empty,
   touching ``len(batch)``, ``batch.bodies`` and ``batch.body_offsets`` (no per-row Python),
   with ``verify=True`` (body CRCs checked, the default) and ``verify=False``; and
   ``get(group, topic, q, offset, 32)`` with ``len(m.body)`` per message (get keeps
   RocketMQ's transfer limits: at most 32 messages per call from memory). ``--rounds`` timed
   passes each, in rotating order; the median is shown;
2. one message by position (p50/p99 over ``--queries`` random (queue, offset)): SQLite
   ``SELECT body FROM t WHERE queue=? AND qoffset=?``; mqstore ``get(g, topic, q, offset, 1)``
   and ``message_at(phys_offset)`` (offsets from ``read(...).phys_offsets``);
3. seek by time (p50/p99 over random timestamps within each queue's stored range): SQLite
   ``SELECT qoffset FROM t WHERE queue=? AND store_ts >= ? ORDER BY store_ts LIMIT 1``;
   ``offset_by_time(topic, q, ts)`` (lower boundary: the first offset stored at or after ts).
   A ``put_batch`` takes one store time, so each time repeats for 250 messages of a queue;
4. ``query_by_key`` of a random ``k<i>`` (p50/p99): SQLite ``SELECT queue, qoffset, body FROM
   t WHERE key=?``.

In 2-4 every query is put to each contender in turn (the order rotating), so a change in the
machine's load weighs on all alike. Every answer is checked (count, body length, offsets,
the time search against the store times the puts returned); a wrong answer is reported and
makes the exit status 1 after everything is printed. The ratio column is mqstore / SQLite:
higher is better for rates, lower for latencies. Targets print PASS/MISS and never fail the
run. Against a revision without ``MessageStore.read`` the read rows are skipped (noted) and
the phys offsets come from the put results.
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
# get(32)'s bar of 1M msg/s at 128 B was set on a machine whose SQLite ordered read ran at
# 4.03M msg/s: as a ratio to SQLite measured in the same run it holds on any machine.
GET32_RATIO = 1_000_000 / 4_030_000
# offset_by_time's bar of 10 us was set where SQLite's seek by time took 3.9 us (p50).
TIME_RATIO = 10 / 3.9
SIZES = ((128, "128 B"), (1024, "1 KiB"))
DISTINCT_BODIES = 1024  # bodies cycle through this many distinct values (memory stays small)
CFG = load_config_compat({"commit_log": {"segment_bytes": SEGMENT_BYTES},
                          "plugins": {"load_entry_points": False},
                          "dispatch": {"worker": "process"}})

SQL_ORDERED = "SELECT qoffset, body FROM t WHERE queue=? ORDER BY qoffset"
SQL_ONE = "SELECT body FROM t WHERE queue=? AND qoffset=?"
SQL_TIME = "SELECT qoffset FROM t WHERE queue=? AND store_ts >= ? ORDER BY store_ts LIMIT 1"
SQL_KEY = "SELECT queue, qoffset, body FROM t WHERE key=?"

SQLITE_ROWS = {"one": "one row", "time": "time seek", "key": "key select"}
HAS_READ = callable(getattr(MessageStore, "read", None))
HAS_VERIFY = HAS_READ  # read(..., verify=) too; settled on the first store (has_verify)


class Problems(list):
    """Wrong answers seen (the run goes on; the exit status says so at the end)."""

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.append(what)
            print(f"  WRONG  {what}", flush=True)


PROBLEMS = Problems()


class Loaded:
    """The messages of one body size (built before writing) and, once written, what the puts
    returned: in message order and, per queue, in queue-offset order (0..n-1)."""

    def __init__(self, count: int, body_size: int) -> None:
        self.count, self.body_size = count, body_size
        pool = [bytes((i * 7 + j) % 251 for j in range(body_size))
                for i in range(min(DISTINCT_BODIES, count))]
        self.bodies = [pool[i % len(pool)] for i in range(count)]
        self.queue_ids = np.arange(count, dtype=np.int64) % QUEUES
        self.keys = [f"k{i}" for i in range(count)]
        # Filled by write_store: put results in message order.
        self.qoffsets = np.empty(count, dtype=np.int64)
        self.phys = np.empty(count, dtype=np.int64)
        self.store_ts = np.empty(count, dtype=np.int64)
        self.per_queue: dict[int, dict[str, np.ndarray]] = {}

    def queue_columns(self) -> None:
        for q in range(QUEUES):
            sel = self.queue_ids == q
            order = np.argsort(self.qoffsets[sel], kind="stable")
            qoff = self.qoffsets[sel][order]
            PROBLEMS.check(np.array_equal(qoff, np.arange(len(qoff))),
                           f"queue {q}: put results do not give offsets 0..{len(qoff) - 1}")
            self.per_queue[q] = {"phys": self.phys[sel][order], "ts": self.store_ts[sel][order]}


def write_store(store: MessageStore, load: Loaded) -> None:
    for lo in range(0, load.count, BATCH):
        hi = min(lo + BATCH, load.count)
        r = store.put_batch(MessageBatch(topic=TOPIC, bodies=load.bodies[lo:hi],
                                         queue_ids=load.queue_ids[lo:hi], tags=TAG,
                                         keys=load.keys[lo:hi]))
        if r.status is not PutStatus.PUT_OK:
            raise RuntimeError(f"put_batch: {r.status} {r.error}")
        load.qoffsets[lo:hi] = r.queue_offsets
        load.phys[lo:hi] = r.phys_offsets
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
                            ("time", SQL_TIME, (0, 0)), ("key", SQL_KEY, ("k0",))):
        plan = "; ".join(row[-1] for row in con.execute("EXPLAIN QUERY PLAN " + sql, args))
        out.append(f"{name}: {plan}")
    return out


# -- 1. ordered reads -------------------------------------------------------------------------

def ordered_sqlite(con: sqlite3.Connection, _store) -> tuple[int, int]:
    n = nbytes = 0
    for q in range(QUEUES):
        cur = con.execute(SQL_ORDERED, (q,))
        while True:
            rows = cur.fetchmany(READ_BATCH)
            if not rows:
                break
            for _off, body in rows:
                nbytes += len(body)
            n += len(rows)
    return n, nbytes


def has_verify(store: MessageStore) -> bool:
    """Whether this revision's ``read`` takes ``verify`` (a read of 0 messages tells)."""
    try:
        store.read(TOPIC, 0, 0, 0, verify=False)
    except TypeError:
        return False
    return True


def ordered_read(verify: bool):
    def run(_con, store: MessageStore) -> tuple[int, int]:
        read = store.read
        kw = {"verify": verify} if HAS_VERIFY else {}
        n = nbytes = ends = 0
        for q in range(QUEUES):
            offset = 0
            while True:
                batch = read(TOPIC, q, offset, READ_BATCH, **kw)
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
    return run


def ordered_get(_con, store: MessageStore) -> tuple[int, int]:
    get, found, end = store.get, GetStatus.FOUND, GetStatus.OFFSET_OVERFLOW_ONE
    n = nbytes = 0
    for q in range(QUEUES):
        offset = 0
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


def bench_ordered(con, store, load: Loaded, rounds: int) -> dict[str, list[float]]:
    ways = {"sqlite": ordered_sqlite}
    if HAS_READ:
        ways["read verify"] = ordered_read(True)
    if HAS_VERIFY:
        ways["read noverify"] = ordered_read(False)
    ways["get(32)"] = ordered_get
    rates: dict[str, list[float]] = {name: [] for name in ways}
    names = list(ways)
    for rnd in range(rounds + 1):  # round 0 warms up (page cache, time columns, statements)
        shift = rnd % len(names)
        for name in names[shift:] + names[:shift]:
            gc.collect()
            t0 = time.perf_counter()
            n, nbytes = ways[name](con, store)
            secs = time.perf_counter() - t0
            PROBLEMS.check(n == load.count and nbytes == load.count * load.body_size,
                           f"{name}: read {n} messages / {nbytes} body bytes, wrote "
                           f"{load.count} / {load.count * load.body_size}")
            if rnd:
                rates[name].append(n / secs)
    return rates


def phys_from_read(store: MessageStore, load: Loaded) -> dict[int, np.ndarray]:
    """Each queue's phys offsets as ``read`` reports them (checked against the put results);
    the put results' on a revision without ``read``."""
    out = {}
    for q in range(QUEUES):
        if not HAS_READ:
            out[q] = load.per_queue[q]["phys"]
            continue
        parts, ts, offset = [], [], 0
        while True:
            batch = store.read(TOPIC, q, offset, READ_BATCH)
            if not len(batch):
                break
            parts.append(np.asarray(batch.phys_offsets))
            ts.append(np.asarray(batch.store_timestamps))
            offset = batch.next_begin_offset
        phys = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
        PROBLEMS.check(np.array_equal(phys, load.per_queue[q]["phys"]),
                       f"read: queue {q} phys_offsets differ from the put results")
        PROBLEMS.check(np.array_equal(np.concatenate(ts) if ts else phys,
                                      load.per_queue[q]["ts"]),
                       f"read: queue {q} store_timestamps differ from the put results")
        out[q] = phys
    return out


# -- 2-4. one query at a time -------------------------------------------------------------------

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


def bench_one(con, store, load: Loaded, phys: dict, queries: int, rng: random.Random):
    per_q = load.count // QUEUES  # every queue holds at least this many
    points = [(q, off, int(phys[q][off]))
              for q, off in ((rng.randrange(QUEUES), rng.randrange(per_q))
                             for _ in range(queries))]
    execute, get, message_at = con.execute, store.get, store.message_at

    def sqlite_one(q, off, _ph):
        body = execute(SQL_ONE, (q, off)).fetchone()[0]
        return len(body)

    def get_one(q, off, _ph):
        r = get(GROUP, TOPIC, q, off, 1)
        len(r.messages[0].body)
        return r

    def at_one(_q, _off, ph):
        m = message_at(ph)
        len(m.body)
        return m

    secs, ans = timed_rotating({"sqlite": sqlite_one, "get(1)": get_one,
                                "message_at": at_one}, points)
    size = load.body_size
    bad = sum(n != size for n in ans["sqlite"])
    bad_get = sum(r.status is not GetStatus.FOUND or len(r.messages) != 1
                  or r.messages[0].queue_offset != off or r.messages[0].queue_id != q
                  or len(r.messages[0].body) != size
                  for r, (q, off, _p) in zip(ans["get(1)"], points))
    bad_at = sum(m is None or m.queue_offset != off or m.queue_id != q or len(m.body) != size
                 for m, (q, off, _p) in zip(ans["message_at"], points))
    PROBLEMS.check(not bad, f"sqlite one-row select: {bad} wrong bodies")
    PROBLEMS.check(not bad_get, f"get(1): {bad_get} wrong answers of {queries}")
    PROBLEMS.check(not bad_at, f"message_at: {bad_at} wrong answers of {queries}")
    return secs


def bench_time(con, store, load: Loaded, queries: int, rng: random.Random):
    ts = {q: load.per_queue[q]["ts"] for q in range(QUEUES)}
    points = []
    for _ in range(queries):
        q = rng.randrange(QUEUES)
        points.append((q, rng.randint(int(ts[q][0]), int(ts[q][-1]))))
    execute, by_time = con.execute, store.offset_by_time
    first_ms = []
    for q in range(QUEUES):  # the first search of a queue may gather its time column
        t0 = time.perf_counter()
        by_time(TOPIC, q, int(ts[q][0]))
        first_ms.append((time.perf_counter() - t0) * 1e3)
        execute(SQL_TIME, (q, int(ts[q][0]))).fetchone()

    def sqlite_time(q, t):
        return execute(SQL_TIME, (q, t)).fetchone()[0]

    def store_time(q, t):
        return by_time(TOPIC, q, t)

    secs, ans = timed_rotating({"sqlite": sqlite_time, "offset_by_time": store_time}, points)
    expect = [int(np.searchsorted(ts[q], t, side="left")) for q, t in points]
    bad = sum(a != e for a, e in zip(ans["offset_by_time"], expect))
    # SQLite's ORDER BY store_ts may pick any row of the first matching time: compare times.
    bad_sql = sum(ts[q][a] != ts[q][e] for a, e, (q, _t) in zip(ans["sqlite"], expect, points))
    PROBLEMS.check(not bad, f"offset_by_time: {bad} of {queries} answers are not the first "
                            f"offset stored at or after the time")
    PROBLEMS.check(not bad_sql, f"sqlite time seek: {bad_sql} wrong answers")
    return secs, max(first_ms)


def bench_key(con, store, load: Loaded, queries: int, rng: random.Random):
    points = [(i,) for i in (rng.randrange(load.count) for _ in range(queries))]
    execute, by_key, keys = con.execute, store.query_by_key, load.keys

    def sqlite_key(i):
        rows = execute(SQL_KEY, (keys[i],)).fetchall()
        for row in rows:
            len(row[2])
        return rows

    def store_key(i):
        found = by_key(TOPIC, keys[i])
        for m in found:
            len(m.body)
        return found

    secs, ans = timed_rotating({"sqlite": sqlite_key, "query_by_key": store_key}, points)
    qids, qoffs = load.queue_ids, load.qoffsets
    bad = sum(len(rows) != 1 or rows[0][0] != qids[i] or rows[0][1] != qoffs[i]
              for rows, (i,) in zip(ans["sqlite"], points))
    bad_store = sum(len(ms) != 1 or ms[0].queue_id != qids[i] or ms[0].queue_offset != qoffs[i]
                    or len(ms[0].body) != load.body_size
                    for ms, (i,) in zip(ans["query_by_key"], points))
    PROBLEMS.check(not bad, f"sqlite key select: {bad} wrong answers")
    PROBLEMS.check(not bad_store, f"query_by_key: {bad_store} of {queries} wrong answers")
    return secs


# -- driver -----------------------------------------------------------------------------------

def pct(secs: np.ndarray) -> tuple[float, float]:
    us = secs * 1e6
    return float(np.percentile(us, 50)), float(np.percentile(us, 99))


def run_size(count: int, body_size: int, rounds: int, queries: int, seed: int,
             show_plans: bool) -> dict:
    """Every figure of one body size: {"rates": {...}, "lat": {...}, notes}."""
    global HAS_VERIFY
    load = Loaded(count, body_size)
    gc.freeze()  # the pre-built bodies and keys are the harness's, not garbage to scan
    rng = random.Random(seed)
    out: dict = {}
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-read-") as d:
        t0 = time.perf_counter()
        store = MessageStore.open(os.path.join(d, "store"), config=CFG)
        con = None
        try:
            write_store(store, load)
            con = write_sqlite(os.path.join(d, "bench.db"), load)
            out["write_s"] = time.perf_counter() - t0
            if show_plans:
                for line in query_plans(con):
                    print(f"  sqlite plan  {line}")
            HAS_VERIFY = HAS_READ and has_verify(store)
            phys = phys_from_read(store, load)
            out["rates"] = bench_ordered(con, store, load, rounds)
            lat = {}
            secs = bench_one(con, store, load, phys, queries, rng)
            lat["one"] = {name: pct(s) for name, s in secs.items()}
            secs, out["first_time_ms"] = bench_time(con, store, load, queries, rng)
            lat["time"] = {name: pct(s) for name, s in secs.items()}
            secs = bench_key(con, store, load, queries, rng)
            lat["key"] = {name: pct(s) for name, s in secs.items()}
            out["lat"] = lat
        finally:
            if con is not None:
                con.close()
            store.close()
    del load
    gc.unfreeze()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, help="messages per body size, over 4 queues "
                    "(default 200000; 20000 with --quick)")
    ap.add_argument("--queries", type=int, help="random queries per latency row "
                    "(default 20000; 5000 with --quick)")
    ap.add_argument("--rounds", type=int, default=3, help="timed ordered-read passes of each "
                    "contender (after one untimed pass; default 3)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 20000 messages, "
                    "5000 queries")
    ap.add_argument("--seed", type=int, default=1, help="random positions, times and keys")
    ap.add_argument("--json", action="store_true", help="also print one BENCH-JSON line with "
                    "the figures (for benchmarks/compare.py)")
    args = ap.parse_args()
    count = args.count or (20_000 if args.quick else 200_000)
    queries = args.queries or (5_000 if args.quick else 20_000)
    if count < QUEUES or queries < 1 or args.rounds < 1:
        ap.error(f"--count must be >= {QUEUES}, --queries and --rounds >= 1")
    per_q = count // QUEUES

    print(f"mqstore reads vs SQLite WAL  python {platform.python_version()}  sqlite "
          f"{sqlite3.sqlite_version}  cpus={os.cpu_count()}  count={count} over {QUEUES} queues "
          f"(~{per_q} each)  queries={queries}  rounds={args.rounds}  "
          f"segment={SEGMENT_BYTES >> 20} MiB  tmp={tempfile.gettempdir()}  "
          f"load avg {os.getloadavg()[0]:.2f}")
    if not HAS_READ:
        print("note: this mqstore has no MessageStore.read: the read rows are skipped and "
              "message_at uses the phys offsets the puts returned")
    head = (f"{'size':>5}  {'row':<32} {'unit':<6} {'mqstore':>11} {'SQLite':>11} "
            f"{'mq/SQLite':>9}  better")
    figures: dict[tuple[str, str], tuple[float, float, str, str]] = {}
    sqlite_figures: dict[tuple[str, str], tuple[float, str, str]] = {}
    results = {}
    for i, (body_size, label) in enumerate(SIZES):
        res = run_size(count, body_size, args.rounds, queries, args.seed + i, show_plans=i == 0)
        results[label] = res
        if i == 0:
            print(head)
            print("-" * len(head))
        rates = {name: statistics.median(v) for name, v in res["rates"].items()}
        base = rates["sqlite"]
        for name in ("read verify", "read noverify", "get(32)"):
            row = {"read verify": "ordered read(1000) verify=True",
                   "read noverify": "ordered read(1000) verify=False",
                   "get(32)": "ordered get(32)"}[name]
            if name not in rates:
                why = "no store.read" if not HAS_READ else "read has no verify="
                print(f"{label:>5}  {row:<32} {'msg/s':<6} skipped: {why} in this revision")
                continue
            figures[label, name] = (rates[name], base, "msg/s", "higher")
            print(f"{label:>5}  {row:<32} {'msg/s':<6} {rates[name]:>11,.0f} {base:>11,.0f} "
                  f"{rates[name] / base:>9.2f}  higher")
        figures[label, "sqlite ordered"] = (base, base, "msg/s", "higher")
        lat = res["lat"]
        for group, name, row in (("one", "get(1)", "one message get(1)"),
                                 ("one", "message_at", "one message message_at"),
                                 ("time", "offset_by_time", "seek by time offset_by_time"),
                                 ("key", "query_by_key", "query_by_key")):
            sq = lat[group]["sqlite"]
            mq = lat[group][name]
            for j, p in enumerate(("p50", "p99")):
                sqlite_figures[label, f"{SQLITE_ROWS[group]} {p}"] = (sq[j], "us", "lower")
            for j, p in enumerate(("p50", "p99")):
                figures[label, f"{name} {p}"] = (mq[j], sq[j], "us", "lower")
                print(f"{label:>5}  {row if j == 0 else '':<32} {p + ' us':<6} {mq[j]:>11.2f} "
                      f"{sq[j]:>11.2f} {mq[j] / sq[j]:>9.2f}  lower")
        print(f"{label:>5}  (written in {res['write_s']:.1f} s, untimed; first offset_by_time "
              f"of a queue {res['first_time_ms']:.2f} ms at most)")
        print("-" * len(head))

    print("targets:")
    checks = []
    for _b, label in SIZES:
        for name, what in (("read noverify", "read verify=False"), ("read verify",
                                                                     "read verify=True")):
            if (label, name) in figures:
                mq, sq, _u, _b2 = figures[label, name]
                checks.append((f"{label} {what} >= 1.0x SQLite ordered read", mq / sq >= 1.0,
                               f"{mq / sq:.2f}x"))
            else:
                checks.append((f"{label} {what} >= 1.0x SQLite ordered read", None,
                               ("no store.read" if not HAS_READ else "read has no verify=")
                               + " in this revision"))
    mq, sq, _u, _b2 = figures["128 B", "get(32)"]
    checks.append(("128 B get(32) >= 1,000,000 msg/s (absolute, this machine)", mq >= 1e6,
                   f"{mq:,.0f} msg/s"))
    checks.append((f"128 B get(32) >= {GET32_RATIO:.3f}x SQLite ordered read (the same bar, "
                   f"as a ratio)", mq / sq >= GET32_RATIO, f"{mq / sq:.3f}x"))
    for _b, label in SIZES:
        mq, sq, _u, _b2 = figures[label, "get(1) p50"]
        checks.append((f"{label} get(1) p50 <= SQLite p50", mq <= sq,
                       f"{mq:.2f} us vs {sq:.2f} us"))
    for _b, label in SIZES:
        mq, sq, _u, _b2 = figures[label, "offset_by_time p50"]
        checks.append((f"{label} offset_by_time p50 <= 10 us (queues of ~{per_q:,})", mq <= 10,
                       f"{mq:.2f} us"))
        checks.append((f"{label} offset_by_time p50 <= {TIME_RATIO:.2f}x SQLite's (the same "
                       f"bar, as a ratio)", mq / sq <= TIME_RATIO, f"{mq / sq:.2f}x"))
    for _b, label in SIZES:
        mq = figures[label, "query_by_key p99"][0]
        checks.append((f"{label} query_by_key p99 < 1 ms", mq < 1000, f"{mq:.2f} us"))
    width = max(len(c[0]) for c in checks)
    for name, ok, measured in checks:
        verdict = "SKIP" if ok is None else ("PASS" if ok else "MISS")
        print(f"  {verdict}  {name:<{width}}  {'' if ok is None else 'measured '}{measured}")
    if PROBLEMS:
        print(f"WRONG ANSWERS ({len(PROBLEMS)}): the figures above time incorrect reads")
        for p in PROBLEMS:
            print(f"  {p}")
    if args.json:
        print_json(figures, sqlite_figures)
    return 1 if PROBLEMS else 0


def print_json(figures: dict, sqlite_figures: dict) -> None:
    """Every mqstore figure, its ratio to SQLite, and SQLite's own figures marked
    ``(no mqstore)``: their spread between runs is the machine's."""
    metrics = []
    for _b, size in SIZES:
        for (label, name), (mq, sq, unit, better) in figures.items():
            if label != size:
                continue
            if name == "sqlite ordered":
                metrics.append((f"{label} sqlite ordered (no mqstore)", sq, unit, better))
                continue
            metrics.append((f"{label} {name}", mq, unit, better))
            metrics.append((f"{label} {name} / sqlite", mq / sq, "x", better))
        for (label, name), (value, unit, better) in sqlite_figures.items():
            if label == size:
                metrics.append((f"{label} sqlite {name} (no mqstore)", value, unit, better))
    emit_json("read_sqlite", metrics)


if __name__ == "__main__":
    sys.exit(main())

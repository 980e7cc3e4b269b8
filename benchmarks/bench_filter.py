"""SQL92 filtered pulls with and without dispatch-time bitmaps, against filtering in Python.

Writes ``--count`` messages (default 1,000,000) whose property ``k`` cycles through 100 values,
registers the subscription ``k = '7'`` (1 % match) for one consumer group, then pulls the whole
queue three ways in the same run:

* bitmaps: the registered group; non-matching messages are rejected from their bloom bits in
  the consume-queue extension, without reading the commit log;
* no bitmaps: another group with the same expression; every message is read and evaluated;
* baseline: an unfiltered pull of every message, filtered in Python on its properties.

Each is timed as the better of two passes (the first pass over the queue also maps its files).
Target: the bitmap pull at least 10x the baseline.
"""

from __future__ import annotations

import argparse
import tempfile
import time

from benchlib import emit_json
from mqstore import GetStatus, MessageBatch, MessageStore, load_config

EXPR = "k = '7'"


def pull(store, group, expression, expression_type="SQL92", python_filter=None):
    found, offset = 0, 0
    t0 = time.perf_counter()
    while True:
        res = store.get(group, "FilterBench", 0, offset, 32, expression=expression,
                        expression_type=expression_type)
        if res.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            break
        if python_filter is None:
            found += len(res.messages)
        else:
            found += sum(1 for m in res.messages if python_filter(m))
        offset = res.next_begin_offset
    return found, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=1_000_000)
    ap.add_argument("--quick", action="store_true", help="100,000 messages")
    ap.add_argument("--json", action="store_true", help="also print one BENCH-JSON line with "
                    "the figures (for benchmarks/compare.py)")
    args = ap.parse_args()
    n = 100_000 if args.quick else args.count
    cfg = load_config(overrides={"commit_log": {"segment_bytes": 1 << 30},
                                 "plugins": {"load_entry_points": False}})
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-filter-") as d, \
            MessageStore.open(d, config=cfg) as store:
        store.register_subscription("with-bitmaps", "FilterBench", EXPR)
        time.sleep(0.002)  # stored after the registration's millisecond
        t0 = time.perf_counter()
        for start in range(0, n, 10_000):
            ids = range(start, min(n, start + 10_000))
            store.put_batch(MessageBatch(topic="FilterBench", bodies=[b"x" * 64] * len(ids),
                                         queue_ids=0, properties=[{"k": str(i % 100)} for i in ids]))
        store.wait_dispatched(timeout=3600)
        print(f"wrote and dispatched {n:,} messages in {time.perf_counter() - t0:.1f} s")
        # Best of two passes each: the first pass over a queue also maps and faults in its
        # consume-queue and extension files, which whichever method ran first would pay alone.
        runs = {
            "bitmaps": lambda: pull(store, "with-bitmaps", EXPR),
            "no bitmaps": lambda: pull(store, "without-bitmaps", EXPR),
            "baseline": lambda: pull(store, "everything", None,
                                     python_filter=lambda m: m.properties.get("k") == "7"),
        }
        rows = [(name, min((run() for _ in range(2)), key=lambda r: r[1]))
                for name, run in runs.items()]
        base = rows[-1][1][1]
        expected = sum(1 for i in range(n) if i % 100 == 7)
        for name, (found, secs) in rows:
            assert found == expected, (name, found, expected)
            print(f"{name:<11} {found:>8,} matches  {secs:7.3f} s  {n / secs:>12,.0f} msg/s scanned"
                  f"  {base / secs:6.1f}x baseline")
        ratio = base / rows[0][1][1]
        print(f"target: bitmaps >= 10x baseline: {'PASS' if ratio >= 10 else 'MISS'} ({ratio:.1f}x)")
        if args.json:
            emit_json("filter", [(f"{name} scan", n / secs, "msg/s", "higher")
                                 for name, (_found, secs) in rows]
                      + [("bitmaps / baseline", ratio, "x", "higher")])


if __name__ == "__main__":
    main()

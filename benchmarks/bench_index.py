"""Key-index cost: dispatch throughput with and without the index, and query latency.

One run writes N messages with one distinct key each (``--count``, default 10,000,000; index
files scaled to ``--entries`` entries each), then copies only the commit log into two fresh
directories and opens each: opening rebuilds the consume queues (and, when enabled, the index)
by dispatching every record, and the store reports how long that took. The ratio of the two
dispatch rates is the index's cost; the target is at least 0.7 (within 30%).

Then ``--queries`` random keys are looked up with ``query_by_key`` one by one (p50/p99/max
latency), against a Python dict lookup of the same keys measured in the same run.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import time

import numpy as np

from benchlib import emit_json
from mqstore import MessageBatch, MessageStore, load_config


def config(index: bool, entries: int):
    return load_config(overrides={
        "commit_log": {"segment_bytes": 1 << 30},
        "index": {"enabled": index, "max_hash_slots": max(1, entries // 4),
                  "max_index_entries": entries},
        "plugins": {"load_entry_points": False},
    })


def write(root: str, n: int, entries: int, chunk: int = 10_000) -> dict[str, int]:
    """N messages over 4 queues, message i carrying key "key-i"; returns key -> phys offset."""
    where = {}
    body = b"b" * 100
    with MessageStore.open(root, config=config(False, entries)) as s:
        for start in range(0, n, chunk):
            ids = range(start, min(n, start + chunk))
            keys = [[f"key-{i}"] for i in ids]
            r = s.put_batch(MessageBatch(topic="IndexBench", bodies=[body] * len(keys),
                                         queue_ids=np.arange(len(keys)) % 4, keys=keys))
            if r.status.name != "PUT_OK":
                raise RuntimeError(f"put_batch: {r.status} {r.error}")
            where.update(zip((k[0] for k in keys), r.phys_offsets.tolist()))
        s.wait_dispatched(timeout=3600)
    return where


def reopen_rate(src: str, index: bool, entries: int, n: int, keep: bool) -> tuple[float, str]:
    dst = tempfile.mkdtemp(prefix="mqstore-bench-index-")
    shutil.copytree(os.path.join(src, "commitlog"), os.path.join(dst, "commitlog"))
    shutil.copy(os.path.join(src, "mqstore.json"), dst)
    with MessageStore.open(dst, config=config(index, entries)) as s:
        rep = s.recovery_report
        rate = n / rep.redispatch_seconds
    if not keep:
        shutil.rmtree(dst)
    return rate, dst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=10_000_000)
    ap.add_argument("--entries", type=int, default=2_000_000, help="entries per index file")
    ap.add_argument("--queries", type=int, default=10_000)
    ap.add_argument("--quick", action="store_true", help="200,000 messages")
    ap.add_argument("--json", action="store_true", help="also print one BENCH-JSON line with "
                    "the figures (for benchmarks/compare.py)")
    args = ap.parse_args()
    n = 200_000 if args.quick else args.count
    src = tempfile.mkdtemp(prefix="mqstore-bench-index-src-")
    try:
        t0 = time.perf_counter()
        where = write(src, n, args.entries)
        print(f"wrote {n:,} messages with one key each in {time.perf_counter() - t0:.1f} s")
        plain, _ = reopen_rate(src, False, args.entries, n, keep=False)
        indexed, idx_dir = reopen_rate(src, True, args.entries, n, keep=True)
        ratio = indexed / plain
        print(f"dispatch without index: {plain:12,.0f} msg/s")
        print(f"dispatch with index:    {indexed:12,.0f} msg/s   ratio {ratio:.2f} "
              f"({'PASS' if ratio >= 0.7 else 'MISS'} target >= 0.70)")
        keys = random.Random(7).sample(sorted(where), min(args.queries, n))
        with MessageStore.open(idx_dir, config=config(True, args.entries), read_only=True) as s:
            lat = []
            for key in keys:
                q0 = time.perf_counter()
                got = s.query_by_key("IndexBench", key, 32)
                lat.append(time.perf_counter() - q0)
                if [m.phys_offset for m in got] != [where[key]]:
                    raise RuntimeError(f"query {key!r} returned {got}")
        d0 = time.perf_counter()
        for key in keys:
            where[key]
        dict_us = (time.perf_counter() - d0) / len(keys) * 1e6
        lat_us = np.array(lat) * 1e6
        p50, p99 = np.percentile(lat_us, [50, 99])
        print(f"query_by_key over {len(keys):,} keys: p50 {p50:.1f} us, p99 {p99:.1f} us, "
              f"max {lat_us.max():.1f} us ({'PASS' if p99 < 1000 else 'MISS'} target p99 < 1 ms)")
        print(f"dict lookup of the same keys: {dict_us:.3f} us each; query p50 is "
              f"{p50 / dict_us:,.0f}x a dict lookup")
        if args.json:
            emit_json("index", [("dispatch without index", plain, "msg/s", "higher"),
                                ("dispatch with index", indexed, "msg/s", "higher"),
                                ("with / without index", ratio, "x", "higher"),
                                ("query_by_key p50", p50, "us", "lower"),
                                ("query_by_key p99", p99, "us", "lower"),
                                ("dict lookup (no mqstore)", dict_us, "us", "lower")])
        shutil.rmtree(idx_dir)
    finally:
        shutil.rmtree(src, ignore_errors=True)


if __name__ == "__main__":
    main()

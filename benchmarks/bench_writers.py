"""Sustained append throughput of the two commit-log writers, mmap and transient_pool, in one run.

Both stores take the same columnar ``MessageBatch`` load (1 KiB bodies by default, 1000 per
call, 2 topics x 4 queues) with async flush and the flush loop in its own process. The load
runs through many segments (64 MiB each by default, about 25 per round), so the pool's buffers
are reused as in a store that has been running for a while; a single cold segment would
measure first-touch page faults rather than the writers. The clock runs from the first
put_batch until the last append is readable (for transient_pool: committed into the file by
the flush loop), so staging in the pool is not counted as done before the bytes are in the
segment file; it starts once both worker processes are up (the pool's buffers are mapped by
then, as RocketMQ's are allocated when the store starts). The writers alternate over
``--rounds``; the median round of each is compared, the best is printed too, as is the number
of segments the pool writer had to write through their maps because no buffer was free.
Target: median transient_pool / median mmap at least 1.0.
"""

from __future__ import annotations

import argparse
import gc
import tempfile
import time

import numpy as np

from mqstore import MessageBatch, MessageStore, PutStatus, load_config

TOPICS = ("BenchTopicA", "BenchTopicB")


def make_batches(n: int, body_bytes: int, batch: int) -> list[MessageBatch]:
    body = bytes(i % 251 for i in range(body_bytes))
    out = []
    for start in range(0, n, batch):
        k = min(batch, n - start)
        idx = np.arange(start, start + k)
        out.append(MessageBatch(topic=[TOPICS[i % 2] for i in idx.tolist()], bodies=[body] * k,
                                queue_ids=(idx // 2) % 4, tags="TagA"))
    return out


def wait_for_workers(store: MessageStore) -> None:
    """Start the clock once both worker processes sleep in their loops (spawned and ready)."""
    deadline = time.monotonic() + 30
    while not (store.internals.channels.flush.idle and store.internals.channels.dispatch.idle):
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start within 30 s")
        time.sleep(0.01)


def run(kind: str, batches: list[MessageBatch], segment_bytes: int) -> tuple[float, int, int]:
    cfg = load_config(overrides={"writer": {"kind": kind}, "plugins": {"load_entry_points": False},
                                 "commit_log": {"segment_bytes": segment_bytes}})
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-writers-") as d, \
            MessageStore.open(d, config=cfg) as store:
        gc.collect()
        wait_for_workers(store)
        t0 = time.perf_counter()
        for b in batches:
            if store.put_batch(b).status is not PutStatus.PUT_OK:
                raise RuntimeError(f"{kind}: put_batch refused")
        end = store.internals.commit_log.segments.write_end
        while store.max_phys_offset < end:  # the pool's bytes count once they are in the file
            store.internals.flush_client.wake()
            time.sleep(0.0005)
        elapsed = time.perf_counter() - t0
        return elapsed, end, getattr(store.internals.writer, "direct_segments", 0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--messages", type=int, default=1_500_000)
    ap.add_argument("--body-bytes", type=int, default=1024)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--segment-bytes", type=int, default=64 << 20)
    args = ap.parse_args()
    batches = make_batches(args.messages, args.body_bytes, args.batch)
    rounds: dict[str, list[float]] = {"mmap": [], "transient_pool": []}
    print(f"{args.messages:,} messages of {args.body_bytes} B, {args.batch} per put_batch, "
          f"{args.segment_bytes >> 20} MiB segments, {args.rounds} rounds")
    for r in range(args.rounds):
        for kind in ("mmap", "transient_pool"):
            elapsed, nbytes, direct = run(kind, batches, args.segment_bytes)
            rounds[kind].append(elapsed)
            note = f"  ({direct} of {nbytes // args.segment_bytes + 1} segments through the map)" \
                if kind == "transient_pool" else ""
            print(f"  round {r + 1} {kind:<15} {args.messages / elapsed:>10,.0f} msg/s "
                  f"{nbytes / elapsed / 1e6:>8,.0f} MB/s{note}")
    mm, tp = (args.messages / float(np.median(rounds[k])) for k in ("mmap", "transient_pool"))
    bm, bt = (args.messages / min(rounds[k]) for k in ("mmap", "transient_pool"))
    print(f"median: mmap {mm:,.0f} msg/s, transient_pool {tp:,.0f} msg/s, ratio {tp / mm:.2f}")
    print(f"best:   mmap {bm:,.0f} msg/s, transient_pool {bt:,.0f} msg/s, ratio {bt / bm:.2f}")
    print("target: transient_pool >= mmap:", "PASS" if tp >= mm else "MISS")


if __name__ == "__main__":
    main()

"""Sync-flush group commit: producers share fsyncs.

For 1, 4 and 16 producer threads putting 1 KiB messages with ``flush.mode: sync`` for
``--seconds`` each, prints acknowledged msg/s, flushes per second and messages per flush, and
the ratio of each run's msg/s to the single-producer run (target: 16 producers >= 10x).
Every message is acknowledged only after its bytes were forced to disk.
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

from mqstore import Message, MessageStore, PutStatus, load_config


def run(producers: int, seconds: float, writer: str) -> tuple[float, float]:
    cfg = load_config(overrides={"flush": {"mode": "sync"}, "plugins": {"load_entry_points": False},
                                 "commit_log": {"segment_bytes": 1 << 30},
                                 "writer": {"kind": writer}})
    body = b"s" * 1024
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-sync-") as d, \
            MessageStore.open(d, config=cfg) as store:
        fsyncs_before = store.flush_client.status()["fsyncs"]
        acked = [0] * producers
        stop = time.monotonic() + seconds

        def produce(i: int) -> None:
            msg = Message(topic="SyncBench", body=body, queue_id=i % 4)
            while time.monotonic() < stop:
                if store.put(msg).status is not PutStatus.PUT_OK:
                    raise RuntimeError("sync put not acknowledged")
                acked[i] += 1

        threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
        t0 = time.perf_counter()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        total = sum(acked)
        fsyncs = store.flush_client.status()["fsyncs"] - fsyncs_before
        return total / elapsed, total / max(fsyncs, 1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writer", default="mmap", choices=["mmap", "transient_pool"])
    args = ap.parse_args()
    base = None
    print(f"writer={args.writer}; the flush loop runs in its own process")
    print(f"{'producers':>9} {'msg/s':>10} {'msgs/flush':>11} {'x single':>9}")
    for producers in (1, 4, 16):
        rate, per_flush = run(producers, args.seconds, args.writer)
        base = base or rate
        print(f"{producers:>9} {rate:>10,.0f} {per_flush:>11.1f} {rate / base:>9.1f}")
    print("target: 16 producers >= 10x single:", "PASS" if rate / base >= 10 else "MISS")


if __name__ == "__main__":
    main()

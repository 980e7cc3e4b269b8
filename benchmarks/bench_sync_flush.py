"""Sync-flush group commit: producers share fsyncs.

For 1, 4 and 16 producer threads putting 1 KiB messages with ``flush.policy: sync`` for
``--seconds`` each, prints acknowledged msg/s, messages per flush and the ratio of each run's
msg/s to the single-producer run (target: 16 producers >= 10x). Every message is acknowledged
only after its bytes were forced to disk.

The same run measures a bare group commit as the baseline: the same threads append 1 KiB with
``pwrite`` under one lock and wait for a flusher thread whose ``fdatasync`` releases every
append it covers, with nothing else around it. Its ratios are what Python threads and this
disk allow at all, so the store's ratios can be read against them.
"""

from __future__ import annotations

import argparse
import heapq
import os
import tempfile
import threading
import time

from benchlib import emit_json, load_config_compat
from mqstore import Message, MessageStore, PutStatus


def fsync_count(store: MessageStore) -> int | None:
    """fdatasync calls so far, as the flush worker counts them; None when this revision's
    store does not report it (the count is outside the API the benchmarks rely on, so only the
    msgs/flush column depends on it)."""
    try:
        return int(store.internals.flush_client.status()["fsyncs"])
    except (AttributeError, KeyError, TypeError):
        return None


def run_store(producers: int, seconds: float, writer: str) -> tuple[float, float | None]:
    cfg = load_config_compat({"flush": {"policy": "sync"}, "plugins": {"load_entry_points": False},
                              "commit_log": {"segment_bytes": 64 << 20},
                              "writer": {"kind": writer}})
    body = b"s" * 1024
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-sync-") as d, \
            MessageStore.open(d, config=cfg) as store:
        fsyncs_before = fsync_count(store)
        acked = [0] * producers
        stop = time.monotonic() + seconds

        def produce(i: int) -> None:
            msg = Message(topic="SyncBench", body=body, queue_id=i % 4)
            while time.monotonic() < stop:
                if store.put(msg).status is not PutStatus.PUT_OK:
                    raise RuntimeError("sync put not acknowledged")
                acked[i] += 1

        elapsed = _run_threads(produce, producers)
        total = sum(acked)
        fsyncs_after = fsync_count(store)
        if fsyncs_before is None or fsyncs_after is None:
            return total / elapsed, None
        return total / elapsed, total / max(fsyncs_after - fsyncs_before, 1)


def run_bare(producers: int, seconds: float) -> tuple[float, float]:
    """Baseline: appends + one flusher thread forcing the file and releasing covered waiters."""
    body = b"s" * 1024
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-bare-") as d:
        fd = os.open(os.path.join(d, "log"), os.O_RDWR | os.O_CREAT)
        os.ftruncate(fd, 64 << 20)
        append_lock, waiters_lock, pending = threading.Lock(), threading.Lock(), threading.Event()
        state = {"written": 0, "fsyncs": 0, "done": False}
        waiters: list = []
        acked = [0] * producers
        stop = time.monotonic() + seconds

        def flusher() -> None:
            while not state["done"]:
                if not pending.wait(0.01):
                    continue
                pending.clear()
                end = state["written"]
                os.fdatasync(fd)
                state["fsyncs"] += 1
                with waiters_lock:
                    while waiters and waiters[0][0] <= end:
                        heapq.heappop(waiters)[2].release()

        def produce(i: int) -> None:
            while time.monotonic() < stop:
                with append_lock:
                    at = state["written"]
                    os.pwrite(fd, body, at % (64 << 20))
                    state["written"] = end = at + len(body)
                gate = threading.Lock()
                gate.acquire()
                with waiters_lock:
                    heapq.heappush(waiters, (end, id(gate), gate))
                pending.set()
                gate.acquire()
                acked[i] += 1

        flush_thread = threading.Thread(target=flusher)
        flush_thread.start()
        try:
            elapsed = _run_threads(produce, producers)
        finally:
            state["done"] = True
            flush_thread.join()
            os.close(fd)
        total = sum(acked)
        return total / elapsed, total / max(state["fsyncs"], 1)


def _run_threads(target, count: int) -> float:
    threads = [threading.Thread(target=target, args=(i,)) for i in range(count)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--writer", default="mmap", choices=["mmap", "transient_pool"])
    ap.add_argument("--json", action="store_true", help="also print one BENCH-JSON line with "
                    "the figures (for benchmarks/compare.py)")
    args = ap.parse_args()
    print(f"writer={args.writer}; the flush loop runs in its own process")
    print(f"{'producers':>9} {'msg/s':>10} {'msgs/flush':>11} {'x single':>9}   "
          f"{'bare msg/s':>10} {'msgs/flush':>11} {'x single':>9}")
    base = bare_base = None
    metrics = []
    for producers in (1, 4, 16):
        rate, per_flush = run_store(producers, args.seconds, args.writer)
        bare, bare_per_flush = run_bare(producers, args.seconds)
        base, bare_base = base or rate, bare_base or bare
        flushes = f"{per_flush:>11.1f}" if per_flush is not None else f"{'n/a':>11}"
        print(f"{producers:>9} {rate:>10,.0f} {flushes} {rate / base:>9.1f}   "
              f"{bare:>10,.0f} {bare_per_flush:>11.1f} {bare / bare_base:>9.1f}")
        metrics += [(f"{producers:>2} producers", rate, "msg/s", "higher"),
                    (f"{producers:>2} producers bare (no mqstore)", bare, "msg/s",
                     "higher")]
    print(f"store at 16 producers: {rate / base:.1f}x single; bare group commit: "
          f"{bare / bare_base:.1f}x")
    print("target: 16 producers >= 10x single:", "PASS" if rate / base >= 10 else "MISS")
    if args.json:
        metrics.append(("16 producers / single", rate / base, "x", "higher"))
        emit_json("sync_flush", metrics)


if __name__ == "__main__":
    main()

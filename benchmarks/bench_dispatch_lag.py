"""Dispatch lag under a full-speed producer: does the dispatch worker keep up?

One producer thread calls ``put_batch`` (columnar ``MessageBatch``, 1,000 messages of
``--body-bytes`` each, 4 topics x 4 queues, one unique key per message so the key index does
real work) as fast as it can for ``--seconds``, on a store with the default configuration:
dispatch in a worker process, 1 GiB commit-log segments, key index on. A sampler thread
records every 100 ms the lag = end of the commit log minus the worker's DISPATCHED position.

Printed: the producer's rate; the dispatch rate (bytes dispatched / time from the first
append until the consume queues cover the last one) and its ratio to the producer's; lag
percentiles in MB, in milliseconds of production (lag bytes / producer bytes per second) and
in messages; whether the lag stays bounded; and the time from the last append until dispatch
covers it (target <= 1 s). A MISS never fails the process.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time

import numpy as np

from mqstore import MessageBatch, MessageStore, PutStatus, load_config
from mqstore.workers import shm

TOPICS = ("LagTopicA", "LagTopicB", "LagTopicC", "LagTopicD")
QUEUES = 4
BATCH = 1000
SAMPLE_S = 0.1
CATCH_UP_GOAL_S = 1.0
# Both are the defaults today; pinned so the figures stay comparable if a default changes.
CFG = load_config(overrides={"dispatch": {"mode": "process"},
                             "commit_log": {"segment_bytes": 1 << 30}})


class Sampler(threading.Thread):
    """Records (time, lag bytes) every SAMPLE_S until ``done`` is set."""

    def __init__(self, store: MessageStore) -> None:
        super().__init__(name="lag-sampler", daemon=True)
        self.store = store
        self.samples: list[tuple[float, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        positions, commit_log = self.store.positions, self.store.commit_log
        while not self.done.wait(SAMPLE_S):
            # DISPATCHED first: the commit log only grows, so the lag is never under-reported.
            dispatched = positions[shm.DISPATCHED]
            self.samples.append((time.perf_counter(), commit_log.max_offset - dispatched))


def batches(body: bytes):
    """Endless MessageBatch objects; only the keys change, so building one costs ~1% of a put."""
    topics = [TOPICS[i % len(TOPICS)] for i in range(BATCH)]
    queue_ids = (np.arange(BATCH) // len(TOPICS)) % QUEUES
    bodies = [body] * BATCH
    n = 0
    while True:
        yield MessageBatch(topic=topics, bodies=bodies, queue_ids=queue_ids, tags="TagA",
                           keys=[f"order-{i}" for i in range(n, n + BATCH)])
        n += BATCH


def put(store: MessageStore, batch: MessageBatch) -> int:
    r = store.put_batch(batch)
    if r.status is not PutStatus.PUT_OK:
        raise RuntimeError(f"put_batch: {r.status} {r.error}")
    return int(r.sizes.sum())


def run(store: MessageStore, seconds: float, body_bytes: int) -> dict:
    source = batches(b"m" * body_bytes)
    # The worker process needs about a second to start; one batch dispatched before timing keeps
    # that start-up out of the lag figures.
    put(store, next(source))
    store.wait_dispatched(timeout=60)
    start_dispatched = store.positions[shm.DISPATCHED]

    sampler = Sampler(store)
    sampler.start()
    try:
        count = nbytes = 0
        t0 = time.perf_counter()
        stop = t0 + seconds
        while time.perf_counter() < stop:
            nbytes += put(store, next(source))
            count += BATCH
        t_end = time.perf_counter()
        target = store.commit_log.max_offset
        try:
            store.wait_dispatched(timeout=60)
        except TimeoutError:
            pass  # reported below as a miss, with how far dispatch got
        t_caught = time.perf_counter()
        reached = store.positions[shm.DISPATCHED]
    finally:
        sampler.done.set()
        sampler.join()
    lags = [(t - t0, lag) for t, lag in sampler.samples if t0 <= t <= t_end]
    return {"count": count, "bytes": nbytes, "put_s": t_end - t0, "lags": lags,
            "catch_up_s": t_caught - t_end, "caught_up": reached >= target,
            "dispatched": reached - start_dispatched, "dispatch_s": t_caught - t0}


def report(res: dict) -> None:
    put_bps = res["bytes"] / res["put_s"]
    record = res["bytes"] / res["count"]
    disp_bps = res["dispatched"] / res["dispatch_s"]
    print(f"producer   {res['count']:>10,} msgs in {res['put_s']:6.2f} s  "
          f"{res['count'] / res['put_s']:>10,.0f} msg/s  {put_bps / 1e6:8.1f} MB/s")
    print(f"dispatch   {res['dispatched'] / 1e6:>10,.1f} MB   in {res['dispatch_s']:6.2f} s  "
          f"{disp_bps / 1e6:>16.1f} MB/s  = {disp_bps / put_bps:.3f} x producer "
          f"(first append to consume queues covering the last)")

    if not res["lags"]:
        print("lag        no samples (run shorter than the sampling interval)")
        return report_catch_up(res)
    times = np.array([t for t, _ in res["lags"]])
    lags = np.array([lag for _, lag in res["lags"]], dtype=np.float64)
    p50, p99, top = np.percentile(lags, [50, 99, 100])
    print(f"lag        {len(lags)} samples every {SAMPLE_S * 1000:.0f} ms while producing "
          f"(commit-log end - DISPATCHED)")
    print(f"  {'':<22} {'p50':>10} {'p99':>10} {'max':>10}")
    for unit, scale, digits in (("MB", 1e6, 1), ("ms of production", put_bps / 1000, 1),
                                ("messages", record, 0)):
        print(f"  {unit:<22}" + "".join(f" {v / scale:>10,.{digits}f}" for v in (p50, p99, top)))

    # The first third is warm-up. A dispatch rate short of the producer's makes the lag grow
    # steadily, which moves the last third's p90 past the middle third's; a single stall moves
    # the max but not the p90, and is not growth.
    span = res["put_s"]
    middle = lags[(times >= span / 3) & (times < 2 * span / 3)]
    last = lags[times >= 2 * span / 3]
    if len(middle) and len(last):
        mid90, last90 = np.percentile(middle, 90), np.percentile(last, 90)
        rest = times >= span / 3
        slope = np.polyfit(times[rest], lags[rest], 1)[0] if rest.sum() > 1 else 0.0
        print(f"bounded    {'YES' if last90 <= 2 * mid90 else 'NO '}  p90 lag in last third "
              f"{last90 / 1e6:.1f} MB vs middle third {mid90 / 1e6:.1f} MB "
              f"(rule: last <= 2 x middle)")
        print(f"           max lag in last third {last.max() / 1e6:.1f} MB vs middle third "
              f"{middle.max() / 1e6:.1f} MB; trend over the last two thirds "
              f"{slope / 1e6:+.2f} MB/s ({slope / put_bps:+.2%} of the producer's rate)")
    else:
        print("bounded    n/a  (run too short for thirds of samples)")
    report_catch_up(res)


def report_catch_up(res: dict) -> None:
    verdict = "PASS" if res["caught_up"] and res["catch_up_s"] <= CATCH_UP_GOAL_S else "MISS"
    note = "" if res["caught_up"] else "  (timed out before covering the last append)"
    print(f"catch-up   {verdict}  {res['catch_up_s'] * 1000:.1f} ms from the last append until "
          f"DISPATCHED covers it (goal <= {CATCH_UP_GOAL_S:.0f} s){note}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the producer runs")
    ap.add_argument("--body-bytes", type=int, default=1024, help="message body size")
    args = ap.parse_args()
    if args.seconds <= 0 or args.body_bytes < 1:
        ap.error("--seconds must be > 0 and --body-bytes >= 1")

    print(f"mqstore dispatch-lag benchmark  python {platform.python_version()}  "
          f"cpus={os.cpu_count()}  seconds={args.seconds:g}  body={args.body_bytes} B  "
          f"batch={BATCH}  queues={len(TOPICS)}x{QUEUES}  "
          f"segment={CFG.commit_log.segment_bytes >> 20} MiB  dispatch={CFG.dispatch.mode}  "
          f"index={'on' if CFG.index.enabled else 'off'}  tmp={tempfile.gettempdir()}")
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-lag-") as d:
        store = MessageStore.open(d, config=CFG)
        try:
            res = run(store, args.seconds, args.body_bytes)
        finally:
            store.close()
    report(res)


if __name__ == "__main__":
    main()

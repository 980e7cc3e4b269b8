"""Dispatch lag under a full-speed producer: does the dispatch worker keep up?

One producer thread calls ``put_batch`` (columnar ``MessageBatch``, 1,000 messages of
``--body-bytes`` each, 4 topics x 4 queues, one unique key per message so the key index does
real work) as fast as it can for ``--seconds``, on a store with the default configuration:
dispatch in a worker process, 1 GiB commit-log segments, key index on. Every 100 ms a sampler
thread takes the newest completed append (the last message of the last ``put_batch``) and polls
``get`` for it every 0.5 ms until the consume queue serves it: the lag is the time from the
append's return until ``get`` finds it, and the bytes and messages the producer appended
meanwhile (about the commit-log end minus the dispatched position when dispatch covers it).
Only the public API is used (put_batch, get, wait_dispatched), so the script runs unchanged
against any revision of mqstore (see compare.py).

Printed: the producer's rate; the dispatch rate (bytes appended / time from the first
append until the consume queues cover the last one) and its ratio to the producer's; lag
percentiles in milliseconds, MB and messages; whether the lag stays bounded; and the time
from the last append until ``wait_dispatched`` returns (target <= 1 s). A MISS never fails
the process.
"""

from __future__ import annotations

import argparse
import os
import platform
import tempfile
import threading
import time

import numpy as np

from benchlib import emit_json, load_config_compat
from mqstore import GetStatus, MessageBatch, MessageStore, PutStatus

TOPICS = ("LagTopicA", "LagTopicB", "LagTopicC", "LagTopicD")
QUEUES = 4
BATCH = 1000
SAMPLE_S = 0.1
POLL_S = 0.0005
CATCH_UP_GOAL_S = 1.0
SEGMENT_BYTES = 1 << 30
# All are the defaults today; pinned so the figures stay comparable if a default changes.
CFG = load_config_compat({"dispatch": {"worker": "process"},
                          "commit_log": {"segment_bytes": SEGMENT_BYTES},
                          "index": {"enabled": True}})


class Sampler(threading.Thread):
    """Every SAMPLE_S until ``done`` is set: the newest completed append, polled with ``get``
    until dispatch has put it in its consume queue. Records (append time, seconds until
    visible, bytes and messages appended meanwhile)."""

    def __init__(self, store: MessageStore) -> None:
        super().__init__(name="lag-sampler", daemon=True)
        self.store = store
        # (time put_batch returned, messages, bytes, (topic, queue id, queue offset) of the
        # batch's last message); replaced as a whole by the producer after every put_batch.
        self.progress = None
        self.samples: list[tuple[float, float, int, int]] = []
        self.done = threading.Event()

    def run(self) -> None:
        get, found = self.store.get, GetStatus.FOUND
        while not self.done.wait(SAMPLE_S):
            snap = self.progress
            if snap is None:
                continue
            t_put, count, nbytes, (topic, queue_id, offset) = snap
            while True:
                r = get("lag-probe", topic, queue_id, offset, 1)
                if r is not None and r.status is found:
                    break
                if self.done.is_set():
                    return  # dispatch never got there; the catch-up line reports that
                time.sleep(POLL_S)
            t_seen = time.perf_counter()
            _, count_now, nbytes_now, _ = self.progress
            self.samples.append((t_put, t_seen - t_put, nbytes_now - nbytes, count_now - count))


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


LAST_TOPIC = TOPICS[(BATCH - 1) % len(TOPICS)]  # the topic of every batch's last message


def put(store: MessageStore, batch: MessageBatch):
    r = store.put_batch(batch)
    if r.status is not PutStatus.PUT_OK:
        raise RuntimeError(f"put_batch: {r.status} {r.error}")
    return r


def run(store: MessageStore, seconds: float, body_bytes: int) -> dict:
    source = batches(b"m" * body_bytes)
    # The worker process needs about a second to start; one batch dispatched before timing keeps
    # that start-up out of the lag figures.
    put(store, next(source))
    store.wait_dispatched(timeout=60)

    sampler = Sampler(store)
    sampler.start()
    caught_up = False
    try:
        count = nbytes = 0
        t0 = time.perf_counter()
        stop = t0 + seconds
        while time.perf_counter() < stop:
            r = put(store, next(source))
            nbytes += int(r.sizes.sum())
            count += BATCH
            sampler.progress = (time.perf_counter(), count, nbytes,
                                (LAST_TOPIC, int(r.queue_ids[-1]), int(r.queue_offsets[-1])))
        t_end = time.perf_counter()
        try:
            store.wait_dispatched(timeout=60)
            caught_up = True
        except TimeoutError:
            pass  # reported below as a miss
        t_caught = time.perf_counter()
    finally:
        sampler.done.set()
        sampler.join()
    lags = [(t - t0, *rest) for t, *rest in sampler.samples if t0 <= t <= t_end]
    return {"count": count, "bytes": nbytes, "put_s": t_end - t0, "lags": lags,
            "catch_up_s": t_caught - t_end, "caught_up": caught_up,
            "dispatch_s": t_caught - t0}


def report(res: dict) -> dict:
    """Prints the figures; returns the ones benchmarks/compare.py compares."""
    put_bps = res["bytes"] / res["put_s"]
    figures = {"producer": res["count"] / res["put_s"]}
    print(f"producer   {res['count']:>10,} msgs in {res['put_s']:6.2f} s  "
          f"{res['count'] / res['put_s']:>10,.0f} msg/s  {put_bps / 1e6:8.1f} MB/s")
    if res["caught_up"]:
        disp_bps = res["bytes"] / res["dispatch_s"]
        figures["dispatch / producer"] = disp_bps / put_bps
        print(f"dispatch   {res['bytes'] / 1e6:>10,.1f} MB   in {res['dispatch_s']:6.2f} s  "
              f"{disp_bps / 1e6:>16.1f} MB/s  = {disp_bps / put_bps:.3f} x producer "
              f"(first append to consume queues covering the last)")
    else:
        print("dispatch   did not cover the last append within 60 s")

    if not res["lags"]:
        print("lag        no samples (run shorter than the sampling interval)")
        report_catch_up(res, figures)
        return figures
    times = np.array([s[0] for s in res["lags"]])
    lag_s, lags, lag_msgs = (np.array([s[i] for s in res["lags"]], dtype=np.float64)
                             for i in (1, 2, 3))
    print(f"lag        {len(lags)} samples, one every {SAMPLE_S * 1000:.0f} ms while producing "
          f"(newest append until get serves it; appended meanwhile)")
    print(f"  {'':<22} {'p50':>10} {'p99':>10} {'max':>10}")
    for unit, values, scale, digits in (("ms", lag_s, 1e-3, 1), ("MB", lags, 1e6, 1),
                                        ("messages", lag_msgs, 1, 0)):
        row = np.percentile(values, [50, 99, 100])
        print(f"  {unit:<22}" + "".join(f" {v / scale:>10,.{digits}f}" for v in row))
        if unit == "ms":
            figures["lag p50"], figures["lag p99"] = row[0] * 1000, row[1] * 1000

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
    report_catch_up(res, figures)
    return figures


def report_catch_up(res: dict, figures: dict) -> None:
    verdict = "PASS" if res["caught_up"] and res["catch_up_s"] <= CATCH_UP_GOAL_S else "MISS"
    note = "" if res["caught_up"] else "  (timed out before covering the last append)"
    if res["caught_up"]:
        figures["catch-up"] = res["catch_up_s"] * 1000
    print(f"catch-up   {verdict}  {res['catch_up_s'] * 1000:.1f} ms from the last append until "
          f"wait_dispatched returns (goal <= {CATCH_UP_GOAL_S:.0f} s){note}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="how long the producer runs")
    ap.add_argument("--body-bytes", type=int, default=1024, help="message body size")
    ap.add_argument("--json", action="store_true", help="also print one BENCH-JSON line with "
                    "the figures (for benchmarks/compare.py)")
    args = ap.parse_args()
    if args.seconds <= 0 or args.body_bytes < 1:
        ap.error("--seconds must be > 0 and --body-bytes >= 1")

    print(f"mqstore dispatch-lag benchmark  python {platform.python_version()}  "
          f"cpus={os.cpu_count()}  seconds={args.seconds:g}  body={args.body_bytes} B  "
          f"batch={BATCH}  queues={len(TOPICS)}x{QUEUES}  "
          f"segment={SEGMENT_BYTES >> 20} MiB  dispatch=process  index=on  "
          f"tmp={tempfile.gettempdir()}")
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-lag-") as d:
        store = MessageStore.open(d, config=CFG)
        try:
            res = run(store, args.seconds, args.body_bytes)
        finally:
            store.close()
    figures = report(res)
    if args.json:
        # catch-up is left out: it is ~0 when the last batch was dispatched before the put loop
        # noticed the time was up and a batch's worth otherwise, so its ratio says nothing.
        figures.pop("catch-up", None)
        lower = ("lag p50", "lag p99")
        units = {"producer": "msg/s", "dispatch / producer": "x"}
        emit_json("dispatch_lag", [(k, v, units.get(k, "ms"),
                                    "lower" if k in lower else "higher")
                                   for k, v in figures.items()])


if __name__ == "__main__":
    main()

"""Consumers: a group's throughput beside the bare columnar read, and long-poll wake-up latency.

Throughput: one store holds ``--count`` messages of ``--body-bytes`` (default 1,000,000 x 128 B)
over 4 queues of one topic. In the same run, alternating ``--rounds`` times, two passes read
them all:

* ``read``: ``MessageStore.read(topic, q, offset, 1000)`` queue after queue, following
  ``next_begin_offset`` (the bare columnar path, no offsets kept anywhere);
* ``consumer``: a new group (``consume_from="first"``) calling ``poll(1000)`` and ``commit()``
  after every poll, i.e. a commit every 1,000 messages, taking the columns
  (``Polled.batches``), as a bulk consumer would.

The best pass of each is kept, by the wall clock and by this process's CPU time (the second
leaves out what other work on a shared machine takes); the ratio consumer / read is the
figure (target >= 0.8; on an idle machine the two agree). A
third row, ``consumer+objects``, also takes every message as an object and reads its body
(``for m in polled: m.body``), to show what per-message Python objects cost (no target).

Wake-up latency: a producer puts one message every ``--gap-ms`` (so the consumer is asleep
when it comes) while a consumer waits in ``poll(..., timeout_ms=30000)``: in this process
(a thread) and in another process (a read-only store). A plugin loaded into the dispatch
worker (``bench_consumer_probe``) notes the monotonic time of each batch it dispatched, just
before the store publishes it; the consumer notes when ``poll`` handed each message over. The
dispatch-to-consumer time is the figure (target p99 < 5 ms); put-to-consumer is shown beside it.
CLOCK_MONOTONIC is one clock for every process of the machine.

    .venv/bin/python benchmarks/bench_consumer.py            # full: 1M messages, 500 samples
    .venv/bin/python benchmarks/bench_consumer.py --quick    # 100k messages, 200 samples
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

from benchlib import emit_json, fill, load_config_compat
from mqstore import Message, MessageStore

TOPIC = "BenchTopic"
QUEUES = 4
CHUNK = 1000
PROBE_ENV = "MQSTORE_BENCH_DISPATCH_LOG"
HERE = os.path.dirname(os.path.abspath(__file__))


def _config(**extra):
    base = {"commit_log": {"segment_bytes": 256 << 20}, "index": {"enabled": False},
            "plugins": {"load_entry_points": False}}
    base.update(extra)
    return load_config_compat(base)


# -- throughput ---------------------------------------------------------------------------------

def _bare_read(store) -> int:
    n = 0
    for q in range(QUEUES):
        offset = 0
        while True:
            batch = store.read(TOPIC, q, offset, CHUNK)
            if not len(batch):
                break
            n += len(batch)
            offset = batch.next_begin_offset
    return n


def _consume(store, group: str, count: int, objects: bool) -> int:
    n = 0
    with store.consumer(group, TOPIC, consume_from="first") as consumer:
        while n < count:
            polled = consumer.poll(CHUNK)
            if objects:
                for m in polled:
                    m.body
            else:
                polled.batches
            n += len(polled)
            consumer.commit()
    return n


def throughput(args, tmp: str) -> tuple[dict, dict]:
    """Best msg/s of each pass, by the wall clock and by this process's CPU time (which
    leaves out the time other work on a shared machine takes from it)."""
    root = os.path.join(tmp, "throughput")
    best = {"read": 0.0, "consumer": 0.0, "consumer+objects": 0.0}
    best_cpu = dict(best)
    with MessageStore.open(root, config=_config()) as store:
        began = time.perf_counter()
        fill(store, TOPIC, args.count, args.body_bytes, CHUNK, QUEUES)
        print(f"filled {args.count:,} x {args.body_bytes} B in {time.perf_counter() - began:.1f} s")
        for r in range(args.rounds):
            for name, run in (("read", lambda: _bare_read(store)),
                              ("consumer", lambda: _consume(store, f"b{r}", args.count, False)),
                              ("consumer+objects",
                               lambda: _consume(store, f"o{r}", args.count, True))):
                t, c = time.perf_counter(), time.process_time()
                n = run()
                rate = n / (time.perf_counter() - t)
                cpu_rate = n / max(time.process_time() - c, 1e-9)
                assert n == args.count, (name, n)
                best[name] = max(best[name], rate)
                best_cpu[name] = max(best_cpu[name], cpu_rate)
    return best, best_cpu


# -- wake-up latency ----------------------------------------------------------------------------

def _child(root: str, out_path: str, samples: int) -> None:
    """A consumer in its own process (read-only store): notes when each message arrived."""
    seen = []
    with MessageStore.open(root, read_only=True, config=_config()) as store:
        with store.consumer("remote", TOPIC) as c:
            print("ready", flush=True)
            while len(seen) < samples:
                polled = c.poll(16, 30_000)
                now = time.monotonic_ns()
                seen += [(m.phys_offset, now) for m in polled]
    np.savetxt(out_path, np.array(seen, dtype=np.int64), fmt="%d")


def _local(store, samples: int, seen: list, ready: threading.Event) -> None:
    with store.consumer("local", TOPIC) as c:
        ready.set()
        while len(seen) < samples:
            polled = c.poll(16, 30_000)
            now = time.monotonic_ns()
            seen += [(m.phys_offset, now) for m in polled]


def latency(args, tmp: str) -> dict:
    root = os.path.join(tmp, "latency")
    probe_log = os.path.join(tmp, "dispatched.txt")
    os.environ[PROBE_ENV] = probe_log  # the dispatch worker takes this environment
    sys.path.insert(0, HERE)
    store = MessageStore.open(root, config=_config(
        plugins={"load_entry_points": False, "modules": ["bench_consumer_probe"]}))
    remote_out = os.path.join(tmp, "remote.txt")
    try:
        store.put(Message(TOPIC, b"warm-up", queue_id=0))
        store.wait_dispatched()
        child = subprocess.Popen([sys.executable, __file__, "--child", root, remote_out,
                                  str(args.samples)], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "ready"
        local_seen: list = []
        ready = threading.Event()
        local = threading.Thread(target=_local, args=(store, args.samples, local_seen, ready))
        local.start()
        ready.wait(30)
        time.sleep(0.5)
        put_at = {}
        for i in range(args.samples):
            t = time.monotonic_ns()
            r = store.put(Message(TOPIC, b"probe-%d" % i, queue_id=i % QUEUES))
            put_at[r.phys_offset] = t
            time.sleep(args.gap_ms / 1000)
        local.join(60)
        child.wait(60)
    finally:
        store.close()
        os.environ.pop(PROBE_ENV, None)
    batches = np.loadtxt(probe_log, dtype=np.int64, ndmin=2)  # (begin, end, ns) per batch
    out = {}
    for name, seen in (("this process", local_seen),
                       ("other process", [tuple(r) for r in np.loadtxt(remote_out, dtype=np.int64,
                                                                     ndmin=2)])):
        d, p = [], []
        for phys, at in seen:
            if phys not in put_at:
                continue
            row = np.flatnonzero((batches[:, 0] <= phys) & (phys < batches[:, 1]))
            d.append((at - batches[row[0], 2]) / 1e6)
            p.append((at - put_at[phys]) / 1e6)
        out[name] = (np.array(d), np.array(p))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, help="messages for the throughput runs (default 1M)")
    ap.add_argument("--body-bytes", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=3, help="alternating passes of each kind")
    ap.add_argument("--samples", type=int, help="wake-ups measured (default 500)")
    ap.add_argument("--gap-ms", type=float, default=10.0, help="pause between probe messages")
    ap.add_argument("--quick", action="store_true", help="100k messages, 200 samples")
    ap.add_argument("--json", action="store_true", help="also print a BENCH-JSON line")
    ap.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    args.count = args.count or (100_000 if args.quick else 1_000_000)
    args.samples = args.samples or (200 if args.quick else 500)
    tmp = tempfile.mkdtemp(prefix="mqstore-bench-consumer-")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, temp dir {tmp}")
    try:
        rates, cpu_rates = throughput(args, tmp)
        lat = latency(args, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"\n{'pass':<18}{'msg/s':>12}{'x read':>9}{'msg/CPU-s':>12}{'x read':>9}")
    for name, rate in rates.items():
        print(f"{name:<18}{rate:>12,.0f}{rate / rates['read']:>9.2f}"
              f"{cpu_rates[name]:>12,.0f}{cpu_rates[name] / cpu_rates['read']:>9.2f}")
    ratio = rates["consumer"] / rates["read"]
    cpu_ratio = cpu_rates["consumer"] / cpu_rates["read"]
    print(f"\n{'wake-up (ms)':<28}{'p50':>7}{'p99':>7}{'max':>7}{'n':>6}")
    metrics = [("consumer_msgs_per_s", rates["consumer"], "msg/s", "higher"),
               ("read_msgs_per_s", rates["read"], "msg/s", "higher"),
               ("consumer_over_read", ratio, "x", "higher"),
               ("consumer_over_read_cpu", cpu_ratio, "x", "higher")]
    worst_p99 = 0.0
    for name, (d, p) in lat.items():
        for label, values in (("dispatch -> consumer", d), ("put -> consumer", p)):
            p50, p99 = np.percentile(values, [50, 99])
            print(f"{label + ', ' + name:<28}{p50:>7.2f}{p99:>7.2f}{values.max():>7.2f}"
                  f"{len(values):>6}")
        worst_p99 = max(worst_p99, float(np.percentile(d, 99)))
        metrics.append((f"wakeup_p99_ms_{name.split()[0]}", float(np.percentile(d, 99)), "ms",
                        "lower"))
    print(f"\nconsumer >= 0.8 x read: {'PASS' if ratio >= 0.8 else 'MISS'} ({ratio:.2f} by the "
          f"wall clock, {cpu_ratio:.2f} by CPU time)")
    print(f"wake-up p99 < 5 ms: {'PASS' if worst_p99 < 5 else 'MISS'} ({worst_p99:.2f} ms)")
    if args.json:
        emit_json("consumer", metrics, count=args.count, body_bytes=args.body_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

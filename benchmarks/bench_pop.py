"""Pop consumer: pop plus batch ack beside group poll plus commit, in the same run.

One store holds ``--count`` messages of ``--body-bytes`` (default 200,000 x 128 B) over 4
queues of one topic. In the same run, alternating ``--rounds`` times, three passes consume
them all from a new group each time (``consume_from="first"``), in this process:

* ``pop+ack``: ``store.pop(group, topic, --batch, 60000)`` then one ``store.ack([...])`` of
  every handle it returned (on a revision whose ``ack`` takes one handle, one ``ack`` per
  message: the ``acks`` column says which ran);
* ``poll+commit``: a group consumer's ``poll(--batch)`` then ``commit()`` after every poll;
* ``poll(1000)+commit``: the same with 1,000 per poll (``benchmarks/bench_consumer.py``'s pass).

Every pass takes each message as an object and reads its body (a pop hands out objects, each
with its receipt handle; the group passes are made to do the same work per message). The best
pass of each is kept, by the wall clock and by this process's CPU time (the second leaves out
what other work on a shared machine takes); the figure is pop+ack / poll+commit at the same
batch size (target >= 0.3).

    .venv/bin/python benchmarks/bench_pop.py            # 200,000 messages, 3 rounds
    .venv/bin/python benchmarks/bench_pop.py --quick    # 50,000 messages, 2 rounds
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time

from benchlib import emit_json, fill, load_config_compat
from mqstore import MessageStore

TOPIC = "BenchTopic"
QUEUES = 4
CHUNK = 1000
TARGET = 0.3


def _config():
    return load_config_compat({"commit_log": {"segment_bytes": 256 << 20},
                               "index": {"enabled": False},
                               "plugins": {"load_entry_points": False}})


def _batch_ack(store) -> bool:
    """Whether this revision's ``ack`` takes a list of handles."""
    try:
        return store.ack([]) == []
    except ValueError:  # a ReceiptHandleError: the list is not a handle
        return False


def _pop_ack(store, group: str, count: int, batch: int, batched: bool) -> int:
    n = 0
    while n < count:
        popped = store.pop(group, TOPIC, batch, 60_000, consume_from="first")
        if not popped:
            break
        for m in popped:
            m.body
        if batched:
            results = store.ack([m.receipt_handle for m in popped])
            assert not any(results), results
        else:
            for m in popped:
                store.ack(m.receipt_handle)
        n += len(popped)
    return n


def _poll_commit(store, group: str, count: int, batch: int) -> int:
    n = 0
    with store.consumer(group, TOPIC, consume_from="first") as consumer:
        while n < count:
            polled = consumer.poll(batch)
            if not len(polled):
                break
            for m in polled:
                m.body
            consumer.commit()
            n += len(polled)
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, help="messages in the store (default 200,000)")
    ap.add_argument("--body-bytes", type=int, default=128)
    ap.add_argument("--batch", type=int, default=32, help="messages per pop and per poll")
    ap.add_argument("--rounds", type=int, help="alternating passes of each kind (default 3)")
    ap.add_argument("--quick", action="store_true", help="50,000 messages, 2 rounds")
    ap.add_argument("--json", action="store_true", help="also print a BENCH-JSON line")
    args = ap.parse_args()
    args.count = args.count or (50_000 if args.quick else 200_000)
    args.rounds = args.rounds or (2 if args.quick else 3)
    tmp = tempfile.mkdtemp(prefix="mqstore-bench-pop-")
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {args.count:,} x "
          f"{args.body_bytes} B over {QUEUES} queues, batch {args.batch}, temp dir {tmp}")
    names = ("pop+ack", "poll+commit", "poll(1000)+commit")
    best = dict.fromkeys(names, 0.0)
    best_cpu = dict.fromkeys(names, 0.0)
    try:
        with MessageStore.open(os.path.join(tmp, "store"), config=_config()) as store:
            fill(store, TOPIC, args.count, args.body_bytes, CHUNK, QUEUES)
            batched = _batch_ack(store)
            for r in range(args.rounds):
                passes = (("pop+ack", lambda: _pop_ack(store, f"p{r}", args.count, args.batch,
                                                       batched)),
                          ("poll+commit", lambda: _poll_commit(store, f"c{r}", args.count,
                                                               args.batch)),
                          ("poll(1000)+commit", lambda: _poll_commit(store, f"k{r}", args.count,
                                                                     1000)))
                for name, run in passes:
                    t, c = time.perf_counter(), time.process_time()
                    n = run()
                    wall, cpu = time.perf_counter() - t, time.process_time() - c
                    assert n == args.count, (name, n)
                    best[name] = max(best[name], n / wall)
                    best_cpu[name] = max(best_cpu[name], n / max(cpu, 1e-9))
                    print(f"round {r + 1} {name:<18}{n / wall:>12,.0f} msg/s")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    base, base_cpu = best["poll+commit"], best_cpu["poll+commit"]
    print(f"\n{'pass':<20}{'msg/s':>12}{'x poll':>9}{'msg/CPU-s':>12}{'x poll':>9}")
    for name in names:
        print(f"{name:<20}{best[name]:>12,.0f}{best[name] / base:>9.2f}"
              f"{best_cpu[name]:>12,.0f}{best_cpu[name] / base_cpu:>9.2f}")
    ratio, cpu_ratio = best["pop+ack"] / base, best_cpu["pop+ack"] / base_cpu
    print(f"\nacks: {'one ack([...]) per pop' if batched else 'one ack per message'}")
    print(f"pop+ack >= {TARGET} x poll+commit: {'PASS' if ratio >= TARGET else 'MISS'} "
          f"({ratio:.2f} by the wall clock, {cpu_ratio:.2f} by CPU time; "
          f"{best['pop+ack'] / best['poll(1000)+commit']:.2f} x poll(1000)+commit)")
    if args.json:
        emit_json("pop", [("pop_ack_msgs_per_s", best["pop+ack"], "msg/s", "higher"),
                          ("poll_commit_msgs_per_s", base, "msg/s", "higher"),
                          ("pop_ack_over_poll_commit", ratio, "x", "higher"),
                          ("pop_ack_over_poll_commit_cpu", cpu_ratio, "x", "higher")],
                  count=args.count, batch=args.batch, batched_ack=batched)
    return 0


if __name__ == "__main__":
    sys.exit(main())

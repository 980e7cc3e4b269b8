"""Transactions through the embedding API (docs/transactions.md), a store in this process with
the default worker processes.

Printed:

    put            ``--count`` plain messages, one ``put`` each: the baseline, msg/s
    commit         ``--count`` transactions, each a half ``put`` then ``end_transaction``
                   (commit: the real message and the op record in one put), tx/s and the
                   ratio to the baseline (a transaction is two puts and a read of its half)
    rollback       the same, rolled back (the op record only)
    open           ``--open`` halves left open: the writer's RSS growth per open transaction
                   once the checker holds them all
    restart        the store closed with them open and opened again: seconds from the open
                   until the checker holds every one again (read from the half queue)
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

from benchlib import emit_json, load_config_compat
from mqstore import Message, MessageStore

TOPIC = "Payments"
QUEUES = 8


def rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


def half(i: int) -> Message:
    return Message(TOPIC, b"payment %08d" % i, tags="pay", queue_id=i % QUEUES,
                   properties={"TRAN_MSG": "true", "PGROUP": "shop", "UNIQ_KEY": "TX%010d" % i})


def wait_running(store, count: int) -> float:
    began = time.perf_counter()
    while True:
        status = store.transaction_status()
        if status["running"] and status["open"] >= count:
            return time.perf_counter() - began
        time.sleep(0.01)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--open", type=int, default=50_000)
    args = ap.parse_args()
    root = tempfile.mkdtemp(prefix="bench-txn-")
    config = load_config_compat({"plugins": {"load_entry_points": False},
                                 "store": {"transaction_timeout_ms": 86_400_000}})
    try:
        store = MessageStore.open(os.path.join(root, "store"), config=config)
        began = time.perf_counter()
        for i in range(args.count):
            store.put(Message(TOPIC, b"payment %08d" % i, tags="pay", queue_id=i % QUEUES))
        put_s = time.perf_counter() - began
        rates = {}
        for name, commit in (("commit", True), ("rollback", False)):
            began = time.perf_counter()
            for i in range(args.count):
                r = store.put(half(i))
                store.end_transaction(r.phys_offset, commit)
            rates[name] = args.count / (time.perf_counter() - began)
        store.wait_dispatched()
        wait_running(store, 0)
        before = rss_mb()
        for i in range(args.count, args.count + args.open):
            store.put(half(i))
        store.wait_dispatched()
        wait_running(store, args.open)
        per_open = (rss_mb() - before) * 1024 * 1024 / args.open
        store.close()
        began = time.perf_counter()
        store = MessageStore.open(os.path.join(root, "store"), config=config)
        wait_running(store, args.open)
        restart_s = time.perf_counter() - began
        store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    baseline = args.count / put_s
    print(f"put       {baseline:10.0f} msg/s  (baseline: plain puts, one each)")
    for name, rate in rates.items():
        print(f"{name:9} {rate:10.0f} tx/s   ({rate / baseline:.2f} x the baseline)")
    print(f"open      {per_open:10.0f} bytes of RSS per open transaction ({args.open} open)")
    print(f"restart   {restart_s:10.2f} s until the checker holds the {args.open} again")
    emit_json("transactions", [("put_msgs_per_s", baseline, "msg/s", "higher"),
                               ("commit_tx_per_s", rates["commit"], "tx/s", "higher"),
                               ("rollback_tx_per_s", rates["rollback"], "tx/s", "higher"),
                               ("open_bytes_each", per_open, "B", "lower"),
                               ("restart_s", restart_s, "s", "lower")])


if __name__ == "__main__":
    main()

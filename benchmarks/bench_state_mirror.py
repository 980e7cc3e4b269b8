"""The state mirror: what shipping the pop state to a slave costs receives and acks.

A master (this process, worker processes as by default) holds ``--count`` messages of topic
``Orders`` (8 queues); one consumer pops ``--pop`` at a time and acknowledges them, in one
``ack`` call per pop (``--ack-each``: one call per message, as the official client acks),
until every message is acknowledged. The same run is timed against:

    no slave        async_master without ``server.ha_listen``: no shipper (the baseline)
    async + slave   async_master shipping to a slave (``mqstore serve``, ``store.role: slave``,
                    in a subprocess over 127.0.0.1): acks are shipped, not waited for
    sync + slave    sync_master: every ack returns once a slave holds its state records

Each setting runs ``--rounds`` times, interleaved with the others, and the median run is
printed: received+acked messages per second and the ratio to the baseline; for the
shipping ones, the state records' bytes per acked message (bodies, and whole commit-log records
with their headers) and how many records a pass carried.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

from benchlib import emit_json, ha_config, load_config_compat
from mqstore import MessageBatch, MessageStore

SEGMENT_BYTES = 64 << 20
START_TIMEOUT_S = 120.0


def config(role: str, **server) -> dict:
    return ha_config(role, SEGMENT_BYTES, **server)


class Slave:
    """``mqstore serve`` following ``master``."""

    def __init__(self, root: str, master: str) -> None:
        yaml = os.path.join(os.path.dirname(root), "slave.yaml")
        with open(yaml, "w") as f:
            json.dump(config("slave", ha_master=master), f)
        self.log = os.path.join(os.path.dirname(root), "slave.log")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mqstore.cli", "serve", "-c", yaml, "--root", root],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = re.search(r"serving metrics on (http://[\d.:]+)/metrics",
                              open(self.log).read())
            if found:
                self.url = found.group(1)
                return
            if self.proc.poll() is not None:
                raise RuntimeError(open(self.log).read())
            time.sleep(0.05)
        raise RuntimeError(f"the slave did not start:\n{open(self.log).read()}")

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


def run(setting: str, count: int, pop: int, ack_each: bool) -> dict:
    role = "sync_master" if setting == "sync" else "async_master"
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-mirror-") as d:
        server = {} if setting == "none" else {"ha_listen": "127.0.0.1:0"}
        master = MessageStore.open(os.path.join(d, "master"),
                                   config=load_config_compat(config(role, **server)))
        slave = None
        try:
            master.replication.start()
            if setting != "none":
                slave = Slave(os.path.join(d, "slave"), master.replication.address)
                while not master.replication.status()["slaves"]:
                    time.sleep(0.02)
            master.create_topic("Orders", queues=8)
            body = b"m" * 128
            for start in range(0, count, 1000):
                n = min(1000, count - start)
                r = master.put_batch(MessageBatch(topic="Orders", bodies=[body] * n,
                                                  queue_ids=[i % 8 for i in range(n)]))
                assert r.status.stored, r
            master.wait_dispatched()
            shipper = master.replication.shipper
            time.sleep(0.5)  # the start's snapshot shipped
            before = shipper.status() if shipper else None
            log_before = master.max_phys_offset
            acked = 0
            began = time.perf_counter()
            while acked < count:
                popped = master.pop("billing", "Orders", max_msgs=pop, invisible_ms=600_000,
                                    consume_from="first")
                if ack_each:
                    for p in popped:
                        assert master.ack(p.receipt_handle) is None
                else:
                    assert master.ack([p.receipt_handle for p in popped]) == [None] * len(popped)
                acked += len(popped)
            took = time.perf_counter() - began
            out = {"rate": acked / took, "acked": acked}
            if shipper is not None:
                if not shipper.ship_now(wait=True, timeout_s=30):
                    raise RuntimeError("the shipper did not catch up")
                after = shipper.status()
                out["body_bytes"] = (after["bytes"] - before["bytes"]) / acked
                out["log_bytes"] = (master.max_phys_offset - log_before) / acked
                out["records"] = after["records"] - before["records"]
        finally:
            master.close()
            if slave is not None:
                slave.stop()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=20_000)
    ap.add_argument("--pop", type=int, default=32)
    ap.add_argument("--ack-each", action="store_true",
                    help="one ack call per message (as the gRPC clients ack)")
    ap.add_argument("--rounds", type=int, default=3, help="runs of each setting (the median "
                    "is printed)")
    ap.add_argument("--quick", action="store_true", help="--count 5000")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.count = 5000
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.count} messages, "
          f"pops of {args.pop}, {'one ack per message' if args.ack_each else 'one ack per pop'}"
          f", median of {args.rounds} rounds")
    run("none", min(args.count, 2000), args.pop, args.ack_each)  # warm up: imports, caches
    rounds: dict[str, list[dict]] = {"none": [], "async": [], "sync": []}
    for _ in range(args.rounds):  # interleaved, so a busy spell of the machine hits all three
        for setting, out in rounds.items():
            out.append(run(setting, args.count, args.pop, args.ack_each))
    results = {s: sorted(rs, key=lambda r: r["rate"])[len(rs) // 2] for s, rs in rounds.items()}
    base = results["none"]["rate"]
    names = {"none": "no slave", "async": "async + slave", "sync": "sync + slave"}
    for setting, r in results.items():
        line = f"{names[setting]:<14} {r['rate']:9.0f} msg/s  ratio {r['rate'] / base:5.2f}"
        if "body_bytes" in r:
            line += (f"   state {r['body_bytes']:6.1f} B/acked msg (bodies), "
                     f"{r['log_bytes']:6.1f} B (log records); {r['records']} records")
        print(line)
    if args.json:
        emit_json("state_mirror", [
            ("ack_rate_no_slave", base, "msg/s", "higher"),
            ("ack_rate_async_slave", results["async"]["rate"], "msg/s", "higher"),
            ("ack_rate_sync_slave", results["sync"]["rate"], "msg/s", "higher"),
            ("state_log_bytes_per_ack_async", results["async"]["log_bytes"], "B", "lower"),
        ])


if __name__ == "__main__":
    main()

"""Replication: how fast a slave follows, and what SYNC_MASTER adds to a put.

Throughput: a master (this process, worker processes as by default) puts ``--count`` messages
of ``--size`` bytes in ``put_batch`` calls of ``--batch`` while a slave (``mqstore serve`` in a
subprocess, ``store.role: slave``) follows it over 127.0.0.1. Printed side by side, from the
same run: the master's own append rate (bytes / time of the puts) and the replication rate
(bytes / time from the first put until the slave's consume queues cover the last byte, read
from the slave's /metrics every 20 ms), with the slave's lag when the puts ended.

With ``--protected``, the throughput run is repeated with master and slave speaking mqstore's
handshake over TLS (``server.ha_secret_file`` and ``server.ha_tls_*``, certificates made with
the ``openssl`` command), and the protected replication rate is printed beside the plaintext
one with their ratio.

Latency: ``--puts`` single ``put`` calls (``WAIT`` true) against an ASYNC_MASTER with a slave
connected, then against a SYNC_MASTER with one (each answers PUT_OK only once the slave
acknowledged the put's end): p50 and p99 of each, and what SYNC_MASTER adds.
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
from mqstore import Message, MessageBatch, MessageStore, PutStatus

SEGMENT_BYTES = 64 << 20
POLL_S = 0.02
START_TIMEOUT_S = 120.0


def config(role: str, **server) -> dict:
    return ha_config(role, SEGMENT_BYTES, **server)


def protection(d: str) -> tuple[dict, dict]:
    """The master's and the slave's ``server`` keys for TLS with a shared secret."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)
    ec = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    ca, ca_key = os.path.join(d, "ca.pem"), os.path.join(d, "ca.key")
    openssl("req", "-x509", *ec, "-keyout", ca_key, "-out", ca, "-days", "1", "-subj", "/CN=ca",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext",
            "keyUsage=critical,keyCertSign")
    ext = os.path.join(d, "leaf.ext")
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\n")
    secret = os.path.join(d, "ha.secret")
    with open(secret, "wb") as f:
        f.write(os.urandom(32).hex().encode())
    keys = []
    for serial, name in enumerate(("master", "slave"), start=1):
        cert, key, csr = (os.path.join(d, f"{name}.{x}") for x in ("pem", "key", "csr"))
        openssl("req", *ec, "-keyout", key, "-out", csr, "-subj", f"/CN={name}")
        openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-set_serial",
                str(serial), "-out", cert, "-days", "1", "-extfile", ext)
        keys.append({"ha_secret_file": secret, "ha_tls_cert_file": cert,
                     "ha_tls_key_file": key, "ha_tls_ca_file": ca})
    return keys[0], keys[1]


class Slave:
    """``mqstore serve`` following ``master``, and its /metrics."""

    def __init__(self, root: str, master: str, server: dict | None = None) -> None:
        yaml = os.path.join(os.path.dirname(root), "slave.yaml")
        with open(yaml, "w") as f:
            json.dump(config("slave", ha_master=master, **(server or {})), f)
        self.log = os.path.join(os.path.dirname(root), "slave.log")
        with open(self.log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "mqstore.cli", "serve", "-c", yaml, "--root", root],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            found = re.search(r"serving metrics on (http://[\d.:]+)/metrics", open(self.log).read())
            if found:
                self.url = found.group(1)
                break
            if self.proc.poll() is not None:
                raise RuntimeError(open(self.log).read())
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the slave did not start:\n{open(self.log).read()}")
        while self.metrics().get("mqstore_replication_master_connected") != 1:
            time.sleep(POLL_S)

    def metrics(self) -> dict[str, float]:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            return {line.split()[0]: float(line.split()[1]) for line in r.read().decode().splitlines()
                    if line and not line.startswith("#") and "{" not in line}

    def positions(self) -> tuple[int, int]:
        """The slave's commit-log end and how far its consume queues cover it."""
        m = self.metrics()
        end = int(m["mqstore_commit_log_max_offset_bytes"])
        return end, end - int(m["mqstore_dispatch_lag_bytes"])

    def stop(self) -> None:
        os.killpg(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


def pair(d: str, role: str, protected: bool = False) -> tuple[MessageStore, Slave]:
    master_keys, slave_keys = protection(d) if protected else ({}, {})
    master = MessageStore.open(os.path.join(d, "master"), config=load_config_compat(
        config(role, ha_listen="127.0.0.1:0", **master_keys)))
    master.replication.start()
    return master, Slave(os.path.join(d, "slave"), master.replication.address, slave_keys)


def throughput(count: int, size: int, batch: int, protected: bool = False) -> dict:
    body = b"r" * size
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-repl-") as d:
        master, slave = pair(d, "async_master", protected)
        try:
            began = time.perf_counter()
            for start in range(0, count, batch):
                n = min(batch, count - start)
                r = master.put_batch(MessageBatch(topic="Repl", bodies=[body] * n,
                                                  queue_ids=[i % 8 for i in range(n)]))
                if not r.status.stored:
                    raise RuntimeError(f"put_batch answered {r.status}")
            put_s = time.perf_counter() - began
            end = master.max_phys_offset
            appended, dispatched = slave.positions()
            behind, appended_s = end - appended, None
            while dispatched < end:
                time.sleep(POLL_S)
                appended, dispatched = slave.positions()
                if appended_s is None and appended >= end:
                    appended_s = time.perf_counter() - began
            replicated_s = time.perf_counter() - began
        finally:
            slave.stop()
            master.close()
    return {"bytes": end, "put_s": put_s, "appended_s": appended_s or replicated_s,
            "replicated_s": replicated_s, "behind": behind}


def latencies(role: str, puts: int, size: int) -> list[float]:
    body = b"l" * size
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-repl-") as d:
        master, slave = pair(d, role)
        try:
            out = []
            for i in range(puts + 100):  # the first 100 warm up
                began = time.perf_counter()
                r = master.put(Message("Lat", body, queue_id=i % 4))
                took = time.perf_counter() - began
                if r.status is not PutStatus.PUT_OK:
                    raise RuntimeError(f"{role} put answered {r.status}")
                if i >= 100:
                    out.append(took)
        finally:
            slave.stop()
            master.close()
    return sorted(out)


def pct(sorted_values: list[float], p: float) -> float:
    return sorted_values[min(len(sorted_values) - 1, int(p / 100 * len(sorted_values)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--count", type=int, default=200_000)
    ap.add_argument("--size", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1000)
    ap.add_argument("--puts", type=int, default=2000)
    ap.add_argument("--quick", action="store_true", help="--count 50000 --puts 500")
    ap.add_argument("--protected", action="store_true",
                    help="also replicate over TLS with the shared secret, and compare")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    if args.quick:
        args.count, args.puts = 50_000, 500
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, {args.count} x {args.size} B "
          f"in batches of {args.batch}, {args.puts} single puts")
    t = throughput(args.count, args.size, args.batch)
    mb = t["bytes"] / 1e6
    append, replicated = mb / t["put_s"], mb / t["replicated_s"]
    print(f"master append     {append:8.1f} MB/s  ({mb:.1f} MB in {t['put_s']:.2f} s)")
    print(f"slave appended    {mb / t['appended_s']:8.1f} MB/s  (first put to the slave's last "
          f"byte: {t['appended_s']:.2f} s; {t['behind'] / 1e6:.1f} MB behind when the puts ended)")
    print(f"slave dispatched  {replicated:8.1f} MB/s  (first put to the slave's last unit: "
          f"{t['replicated_s']:.2f} s)")
    print(f"ratio             {replicated / append:8.2f}")
    if args.protected:
        p = throughput(args.count, args.size, args.batch, protected=True)
        protected = p["bytes"] / 1e6 / p["replicated_s"]
        print(f"over TLS + secret {protected:8.1f} MB/s  (first put to the slave's last unit: "
              f"{p['replicated_s']:.2f} s); ratio to plaintext {protected / replicated:.2f}")
    lat = {role: latencies(role, args.puts, args.size) for role in ("async_master", "sync_master")}
    for role, values in lat.items():
        print(f"{role:<13} put  p50 {pct(values, 50) * 1e6:8.0f} us   p99 {pct(values, 99) * 1e6:8.0f} us")
    added50 = pct(lat["sync_master"], 50) - pct(lat["async_master"], 50)
    added99 = pct(lat["sync_master"], 99) - pct(lat["async_master"], 99)
    print(f"SYNC_MASTER adds   p50 {added50 * 1e6:8.0f} us   p99 {added99 * 1e6:8.0f} us")
    if args.json:
        emit_json("replication", [
            ("append_mb_s", append, "MB/s", "higher"),
            ("replicated_mb_s", replicated, "MB/s", "higher"),
            ("sync_master_p50_us", pct(lat["sync_master"], 50) * 1e6, "us", "lower"),
            ("sync_master_p99_us", pct(lat["sync_master"], 99) * 1e6, "us", "lower"),
            ("async_master_p50_us", pct(lat["async_master"], 50) * 1e6, "us", "lower"),
        ])


if __name__ == "__main__":
    main()

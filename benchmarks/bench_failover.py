"""Failover: from a master's SIGKILL to the first send a client gets answered OK.

Each round starts a master (``sync_master``) and its slave as ``mqstore serve`` processes over
127.0.0.1 (mqstore's handshake, ``server.ha_peers``, a gRPC endpoint each), and the official
RocketMQ 5 Python client, configured with both endpoints, sending one message at a time on a
thread of this process. Then the master is SIGKILLed and the slave is promoted as an operator
(or a coordination layer) would: as soon as its replication reports the master gone, one
``Promote`` call on its admin service (what ``mqstore role promote --server`` sends, without
the command's own start-up). Measured from the SIGKILL: when the promotion returned, and when
the client's first send was answered OK.

The baseline, measured in the same run: the procedure before promotion existed: stop the
slave, change its ``store.role`` to ``async_master``, start it again, until the client's first
send is answered OK. Printed: the median of ``--rounds`` rounds of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import re
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


class Node:
    def __init__(self, d: str, name: str, role: str, grpc: int, ha: int, peer: int) -> None:
        self.d, self.name = d, name
        self.endpoint = f"127.0.0.1:{grpc}"
        self.yaml = os.path.join(d, f"{name}.yaml")
        self.config = {
            "commit_log": {"segment_bytes": 16 << 20}, "plugins": {"load_entry_points": False},
            "store": {"root": os.path.join(d, name), "role": role,
                      "ha_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 3000},
            "server": {"metrics_listen": "127.0.0.1:0", "grpc_listen": self.endpoint,
                       "ha_listen": f"127.0.0.1:{ha}", "ha_peers": [f"127.0.0.1:{peer}"],
                       "ha_secret_file": os.path.join(d, "ha.secret"),
                       **({"ha_master": f"127.0.0.1:{peer}"} if role == "slave" else {})}}
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
        self.stopping = threading.Event()

    def run(self) -> None:
        while not self.stopping.is_set():
            msg = self.mq.Message()
            msg.topic, msg.body = "bench", b"x" * 128
            began = time.monotonic()
            try:
                self.producer.send(msg)
                self.ok.append((began, time.monotonic()))
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


def one_round(rocketmq, baseline: bool) -> tuple[float | None, float]:
    from mqstore.endpoint.admin_client import AdminClient
    with tempfile.TemporaryDirectory(prefix="mqstore-failover-") as d:
        with open(os.path.join(d, "ha.secret"), "w") as f:
            f.write(SECRET)
        g1, g2, h1, h2 = free_ports(4)
        master = Node(d, "m", "sync_master", g1, h1, h2).start()
        slave = Node(d, "s", "slave", g2, h2, h1).start()
        admin = AdminClient(slave.endpoint)
        try:
            while admin.role_status()["master_endpoint"] is None:
                time.sleep(POLL_S)
            sender = Sender(rocketmq, f"{master.endpoint};{slave.endpoint}")
            sender.start()
            while len(sender.ok) < 20:
                time.sleep(POLL_S)
            killed = time.monotonic()
            master.kill()
            promoted = None
            if baseline:
                slave.stop()
                slave.config["store"]["role"] = "async_master"
                slave.start()
            else:
                while admin.role_status()["replication"]["connected"]:
                    time.sleep(POLL_S)
                admin.role_promote()
                promoted = time.monotonic() - killed
            first = sender.first_after(killed)
            sender.close()
            return promoted, first
        finally:
            master.kill()
            slave.kill()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--json", action="store_true", help="add a BENCH-JSON line")
    args = parser.parse_args()
    home = tempfile.mkdtemp(prefix="mqstore-client-home-")
    os.environ["HOME"] = home  # the client writes its log under ~/logs
    import rocketmq
    logging.getLogger("rocketmq-python-client").setLevel(logging.CRITICAL)
    promote = [one_round(rocketmq, baseline=False) for _ in range(args.rounds)]
    restart = [one_round(rocketmq, baseline=True) for _ in range(args.rounds)]
    promoted = statistics.median(p for p, _ in promote)
    first = statistics.median(f for _, f in promote)
    base = statistics.median(f for _, f in restart)
    print(f"rounds: {args.rounds} of each")
    print(f"promotion (admin call) returned      {promoted:6.2f} s after the SIGKILL (median)")
    print(f"first send answered OK, promotion    {first:6.2f} s (median; each: "
          f"{', '.join(f'{f:.2f}' for _, f in promote)})")
    print(f"first send answered OK, restart      {base:6.2f} s (median; each: "
          f"{', '.join(f'{f:.2f}' for _, f in restart)})")
    print(f"promotion / restart                  {first / base:6.2f}")
    if args.json:
        emit_json("failover", [("promotion_s", promoted, "s", "lower"),
                               ("first_send_s", first, "s", "lower"),
                               ("restart_first_send_s", base, "s", "lower")])


if __name__ == "__main__":
    main()

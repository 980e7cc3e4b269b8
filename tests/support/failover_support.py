"""Two ``mqstore serve`` nodes replicating to each other's knowledge (``server.ha_peers``), each
with a gRPC endpoint, as the failover tests run them: a master and a slave on 127.0.0.1, the
slave listening for clients (it forwards to the master) and ready to be promoted."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import yaml as yamllib

from cli_support import SMALL_CONFIG, mqstore
from endpoint_support import Served

SECRET = "0123456789abcdef0123456789abcdef\n"
FAST_HA = {"ha_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 3000}


def free_ports(n: int) -> list[int]:
    """``n`` ports free now, sorted as the client sorts "127.0.0.1:PORT" (by text)."""
    socks = []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return sorted(ports, key=lambda p: f"127.0.0.1:{p}")


class Node:
    """One node's directory, configuration and ``serve`` process."""

    def __init__(self, base: Path, name: str, role: str, grpc_port: int, ha_port: int,
                 peer_ha_port: int, home: Path, store: dict | None = None,
                 segment_bytes: int | None = None, server: dict | None = None,
                 coordination: dict | None = None) -> None:
        extra_server = server
        self.name = name
        self.root = base / name
        self.home = home
        self.ha = f"127.0.0.1:{ha_port}"
        self.yaml = base / f"{name}.yaml"
        secret = base / "ha.secret"
        if not secret.exists():
            secret.write_text(SECRET)
        server = {"metrics_listen": "127.0.0.1:0", "grpc_listen": f"127.0.0.1:{grpc_port}",
                  "grpc_min_invisible_ms": 1000, "ha_listen": self.ha,
                  "ha_secret_file": str(secret), "ha_peers": [f"127.0.0.1:{peer_ha_port}"]}
        if role == "slave":
            server["ha_master"] = f"127.0.0.1:{peer_ha_port}"
        server.update(extra_server or {})
        config = yamllib.safe_load(SMALL_CONFIG)
        if segment_bytes is not None:
            config["commit_log"]["segment_bytes"] = segment_bytes
        config["store"] = {"root": str(self.root), "role": role, **FAST_HA, **(store or {})}
        config["server"] = server
        if coordination is not None:  # automatic failover: this node's name is its own
            config["coordination"] = {"node": name, **coordination}
        self.yaml.write_text(json.dumps(config))
        self.endpoint = f"127.0.0.1:{grpc_port}"
        self.served: Served | None = None
        self.starts = 0

    def start(self, argv: list[str] | None = None) -> "Node":
        self.starts += 1
        log = self.yaml.parent / f"{self.name}.{self.starts}.log"
        self.served = Served(self.yaml, log, self.home, argv=argv)
        return self

    def log(self) -> str:
        return self.served.log() if self.served is not None else ""

    def metrics(self) -> str:
        """``/metrics`` of this node's current serve, as text."""
        return self.served.metrics()

    def kill(self) -> None:
        """SIGKILL the whole process group (serve and its workers)."""
        if self.served is not None:
            self.served.kill()

    def signal(self, signum: int) -> None:
        os.killpg(self.served.proc.pid, signum)

    def role(self, *args: str, check: int | None = 0) -> dict | subprocess.CompletedProcess:
        """``mqstore role ARGS --server`` this node, its JSON (or the process, with check
        None)."""
        proc = mqstore("role", *args, "--server", self.endpoint, "--json", check=check)
        return json.loads(proc.stdout) if check is not None else proc


class Clients:
    """A producer and a SimpleConsumer group in processes of their own
    (``endpoint_client_proc.py``'s failover modes), given every node's endpoint, going on
    through a failover; ``at_kill()`` notes what the consumer had received and acknowledged
    when the master died, ``outcome()`` what came after."""

    def __init__(self, base: Path, home: Path, endpoints: str, count: int,
                 topic: str = "orders", group: str = "billing", consume: bool = True) -> None:
        self.base = base
        self.stop_file = base / "consumers.stop"
        self.producer = _client(base / "producer.out", home, "failover-produce", endpoints,
                                topic, "p", count)
        self.consumer = _client(base / "consumer.out", home, "failover-consume", endpoints,
                                topic, group, "3,7", self.stop_file) if consume else None
        self.count = count
        self.before: tuple[set, set] | None = None

    def lines(self, which: str, first: str) -> list[list[str]]:
        path = self.base / f"{which}.out"
        return [line.split()[1:] for line in path.read_text().splitlines()
                if line.startswith(first + " ")]

    def sent(self) -> set[str]:
        """Bodies whose send was answered OK."""
        return {words[0] for words in self.lines("producer", "sent")}

    def acked(self) -> set[str]:
        return {words[1] for words in self.lines("consumer", "acked")}

    def at_kill(self) -> None:
        """Right after the SIGKILL: no ack can complete on a dead master, and none on the
        next one before it is promoted, so these are exactly the acks before the kill."""
        got = self.lines("consumer", "got")
        self.before = (len(got), {w[2] for w in got}, self.acked())

    def wait_all(self, timeout: float = 60.0, consumed: bool = True,
                 lost_ok: bool = False, kept: set[str] | frozenset[str] = frozenset()) -> None:
        """Until every send was answered OK and (``consumed``) every body sent was
        acknowledged, or its ack failed (an ack the master took as it died: it does not come
        back), and then no delivery came for 3 s (redeliveries due have come). ``lost_ok``:
        sends answered OK may be lost (a forced promotion, async replication): of the
        bodies sent only those ``kept`` are waited for."""
        def done():
            sent = self.sent()
            if not consumed:
                return len(sent) == self.count
            settled = {w[0] for w in self.lines("consumer", "acked")} | {
                w[0] for w in self.lines("consumer", "ackfailed")}
            return len(sent) == self.count and (kept if lost_ok else sent) <= settled
        wait_until(done, timeout, "every send answered and every message acknowledged")
        if consumed:
            path = self.base / "consumer.out"
            seen = [path.stat().st_size, time.monotonic()]

            def quiet():
                size = path.stat().st_size
                if size != seen[0]:
                    seen[:] = [size, time.monotonic()]
                return time.monotonic() - seen[1] >= 3.0
            wait_until(quiet, timeout, "no delivery for 3 s")

    def close(self) -> None:
        self.stop_file.touch()
        for proc in (self.producer, self.consumer):
            if proc is None:
                continue
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(30)

    def outcome(self) -> dict:
        """After the kill: the ids delivered again that had been delivered before it
        (``redelivered``), against those in flight at the kill (delivered, not acked) and
        those acknowledged before it; bodies answered OK to the producer and never
        acknowledged (``lost``)."""
        assert self.before is not None, "at_kill() was not called"
        n_before, got_before, acked_before = self.before
        after = [w[2] for w in self.lines("consumer", "got")[n_before:]]
        sent = {w[0] for w in self.lines("producer", "sent")}
        received = {w[0] for w in self.lines("consumer", "got")}
        return {"acked_before": acked_before, "in_flight": got_before - acked_before,
                "redelivered": set(after) & got_before, "sent": sent,
                "lost": sent - received}


def _client(out: Path, home: Path, *args) -> subprocess.Popen:
    from cli_support import env
    from paths import SUPPORT
    with open(out, "w") as f:
        return subprocess.Popen([sys.executable, str(SUPPORT / "endpoint_client_proc.py"),
                                 *map(str, args)], stdout=f, stderr=subprocess.STDOUT,
                                env={**env(), "HOME": str(home), "PYTHONPATH": str(SUPPORT)},
                                start_new_session=True)


def wait_until(probe, timeout: float = 30.0, what: str = "") -> object:
    """``probe()`` until it answers truthy (exceptions count as no); AssertionError after
    ``timeout`` (stretched on a loaded machine: ``mqstore.testing.patience``) naming ``what``
    and the last answer or exception."""
    from mqstore.testing import patience
    timeout = patience(timeout)
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            last = probe()
            if last:
                return last
        except Exception as exc:  # noqa: BLE001 - the node may be between states
            last = exc
        time.sleep(0.1)
    raise AssertionError(f"{what or probe} not reached within {timeout} s; last: {last!r}")


def commit_log_bytes(root: Path) -> bytes:
    """The commit log's bytes, every segment in order, up to the last non-zero byte (the
    segments of two logs that hold the same records compare equal so)."""
    d = root / "commitlog"
    data = b"".join((d / name).read_bytes() for name in sorted(os.listdir(d)))
    return data.rstrip(b"\0")


def child_serve_argv(yaml: Path, kill_after_step: str) -> list[str]:
    """``mqstore serve`` in a process that SIGKILLs itself right after the rejoin cut's step
    ``kill_after_step`` (``lifecycle.rejoin.apply_cut``)."""
    code = (
        "import os, signal, sys\n"
        "import mqstore.lifecycle.opener as opener\n"
        "real = opener.apply_cut\n"
        f"def cut(*a, **k):\n"
        f"    def step(name):\n"
        f"        if name == {kill_after_step!r}:\n"
        f"            os.kill(os.getpid(), signal.SIGKILL)\n"
        f"    return real(*a, step=step, **k)\n"
        "opener.apply_cut = cut\n"
        "from mqstore.cli.app import main\n"
        f"main(['serve', '-c', {str(yaml)!r}])\n")
    return [sys.executable, "-c", code]


__all__ = ["Node", "Clients", "free_ports", "wait_until", "commit_log_bytes", "child_serve_argv",
           "signal"]

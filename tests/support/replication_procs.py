"""Replication's processes for the tests on 127.0.0.1: a master is a store process that puts
(``replica_proc.py``), a slave an ``mqstore serve`` deployment; each is killed with its process
group when a test ends (the ``procs`` fixture of tests/replication/conftest.py)."""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from cli_support import env
from paths import SUPPORT

SEG = 65536
START_S = 60.0
WAIT_S = 60.0


def base_config(**store) -> dict:
    return {"commit_log": {"segment_bytes": SEG}, "consume_queue": {"file_units": 1000},
            "index": {"max_hash_slots": 256, "max_index_entries": 4096},
            "plugins": {"load_entry_points": False},
            "store": {"ha_heartbeat_interval_ms": 200, "ha_housekeeping_interval_ms": 4000,
                      **store},
            "server": {"metrics_listen": "127.0.0.1:0"}}


def write_yaml(path: Path, config: dict) -> Path:
    path.write_text(json.dumps(config))  # JSON is YAML
    return path


def wait_for(condition, what: str, timeout: float = WAIT_S, logs=()) -> None:
    from mqstore.testing import patience
    timeout = patience(timeout)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    if condition():
        return
    raise AssertionError(f"{what} not within {timeout} s\n" + "\n".join(
        f"--- {p}:\n{Path(p).read_text()[-4000:]}" for p in logs))


class Master:
    """A store process that puts (``replica_proc.py``)."""

    def __init__(self, root: Path, config: dict, log: Path) -> None:
        self.root, self.log_path = root, log
        yaml = write_yaml(root.parent / f"{root.name}.yaml", {
            **config, "server": {**config.get("server", {}), "ha_listen": "127.0.0.1:0"}})
        with open(log, "w") as err:
            self.proc = subprocess.Popen(
                [sys.executable, str(SUPPORT / "replica_proc.py"), str(root), str(yaml)],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=err, text=True, env=env(),
                start_new_session=True)
        self.lines: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()
        ready = self.line(START_S)
        assert ready.startswith("READY "), ready
        self.address = ready.split()[1]

    def _pump(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def line(self, timeout: float = WAIT_S) -> str:
        try:
            got = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no answer from the master:\n{self.log_path.read_text()}")
        assert got is not None, f"the master exited:\n{self.log_path.read_text()}"
        return got

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def ask(self, command: str) -> str:
        self.send(command)
        return self.line()

    def end(self) -> int:
        return int(self.ask("end").split()[1])

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(WAIT_S)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.send("close")
            assert self.proc.wait(WAIT_S) == 0, self.log_path.read_text()


class Slave:
    """``mqstore serve`` with ``store.role: slave``."""

    def __init__(self, root: Path, config: dict, master: str, log: Path) -> None:
        self.root, self.log_path = root, log
        self.yaml = write_yaml(root.parent / f"{root.name}.yaml", {
            **config, "store": {**config["store"], "role": "slave"},
            "server": {**config["server"], "ha_master": master}})
        self.start()

    def start(self) -> None:
        pattern = r"serving metrics on (http://[\d.:]+)/metrics"
        earlier = len(re.findall(pattern, self.log_path.read_text())) \
            if self.log_path.exists() else 0
        log = open(self.log_path, "a")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "mqstore.cli", "serve", "-c", str(self.yaml), "--root",
             str(self.root)], stdout=log, stderr=subprocess.STDOUT, env=env(),
            start_new_session=True)
        log.close()
        deadline = time.monotonic() + START_S
        while time.monotonic() < deadline:
            found = re.findall(pattern, self.log_path.read_text())
            if len(found) > earlier and self.proc.poll() is None:
                self.url = found[-1]
                return
            assert self.proc.poll() is None, self.log_path.read_text()
            time.sleep(0.05)
        raise AssertionError(f"serve did not start:\n{self.log_path.read_text()}")

    def metric(self, name: str) -> float:
        with urllib.request.urlopen(self.url + "/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(name + " "):
                    return float(line.split()[1])
        raise AssertionError(f"{name} not in /metrics")

    def health(self) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(self.url + "/healthz", timeout=10) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read())

    def offset(self) -> int:
        return int(self.metric("mqstore_commit_log_max_offset_bytes"))

    def kill(self) -> None:
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(WAIT_S)

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            assert self.proc.wait(WAIT_S) == 0, self.log_path.read_text()


def read_exact(sock, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = sock.recv(n - len(out))
        if not chunk:
            raise ConnectionError(f"closed after {len(out)} of {n} bytes")
        out += chunk
    return out


def kill_all(started: list) -> None:
    """Every process of ``started`` (Masters, Slaves) gone, whatever happened."""
    for p in started:
        if p.proc.poll() is None:
            os.killpg(p.proc.pid, signal.SIGKILL)
            p.proc.wait(WAIT_S)

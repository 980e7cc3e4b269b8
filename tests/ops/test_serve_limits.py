"""``mqstore serve`` cannot be starved: connections are capped and time out, slow and oversized
requests are cut, and running out of file descriptors refuses connections instead of spinning.

Real ``mqstore serve`` processes (worker processes, as by default) on 127.0.0.1; what the
server holds is read from /proc (its threads, descriptors and CPU time). No timing is tight:
a limit of a second or two is checked against waits of tens of seconds, and a busy loop (a
whole core) against a bound of a tenth of one.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import resource
import signal
import socket
import time
import urllib.request
from http.client import HTTPConnection
from pathlib import Path

import pytest

from mqstore.ops.http_server import APP_THREADS
from bounds_support import (CLOSE_WAIT_S, CPU_BOUND_S, CPU_WINDOW_S, closed_by_server,
                            cpu_seconds, descriptors, health, out_of_descriptors_refusals)
from cli_support import SMALL_CONFIG
from serve_support import STOP_TIMEOUT_S, start

pytestmark = pytest.mark.usefixtures("no_plugin_env")


def deployment(tmp_path, **server) -> Path:
    root = tmp_path / "store"
    section = {"metrics_listen": "127.0.0.1:0", "log_level": "info", **server}
    yaml = tmp_path / "deploy.yaml"
    yaml.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}}}\n"
                    f"server: {json.dumps(section)}\n")
    return yaml


def address(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return host, int(port)


def threads(pid: int) -> int:
    return int(re.search(r"^Threads:\s+(\d+)", Path(f"/proc/{pid}/status").read_text(),
                         re.M).group(1))


def wait_for(check, timeout_s: float = CLOSE_WAIT_S, pause_s: float = 0.1):
    deadline = time.monotonic() + timeout_s
    while True:
        value = check()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(pause_s)


def stop(proc, log_path) -> str:
    os.killpg(proc.pid, signal.SIGTERM)
    code = proc.wait(STOP_TIMEOUT_S)
    log = log_path.read_text()
    assert code == 0 and "store closed cleanly" in log, log
    return log


@pytest.mark.slow
def test_idle_and_slow_connections_are_capped_and_closed(tmp_path):
    yaml = deployment(tmp_path, max_connections=8, idle_timeout_ms=1500,
                      request_timeout_ms=1500, max_header_bytes=4096)
    log_path = tmp_path / "serve.log"
    proc, url = start(yaml, log_path)
    idle: list[socket.socket] = []
    try:
        assert health(url + "/healthz") == 200
        base_threads = threads(proc.pid)
        base_fds = descriptors(proc.pid)
        idle = [socket.create_connection(address(url), timeout=10) for _ in range(60)]
        # Past the cap, each new connection replaced the one idle longest: /healthz, the
        # newest, is answered, and the server holds no more than the cap.
        assert health(url + "/healthz") == 200
        assert wait_for(lambda: descriptors(proc.pid) <= base_fds + 8), descriptors(proc.pid)
        assert threads(proc.pid) <= base_threads + APP_THREADS + 1  # (one started already)
        # Every idle connection is closed: 52 at once, the last 8 after the idle timeout.
        assert closed_by_server(idle) == len(idle)
        assert "server.max_connections (8) reached" in log_path.read_text()

        # A keep-alive client is served on one connection, request after request, with
        # prometheus_client's own negotiation (gzip) and HEAD.
        conn = HTTPConnection(*address(url), timeout=10)
        for _ in range(3):
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            assert response.status == 200 and json.loads(response.read())["status"] == "ok"
        conn.request("GET", "/metrics", headers={"Accept-Encoding": "gzip"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("Content-Encoding") == "gzip"
        assert "\nmqstore_writable 1.0\n" in gzip.decompress(response.read()).decode()
        conn.request("HEAD", "/healthz")
        response = conn.getresponse()
        assert response.status == 200 and response.read() == b""
        assert int(response.getheader("Content-Length")) > 0
        conn.close()

        # A client trickling a header line every 0.2 s gains nothing: its request must be
        # whole within request_timeout_ms of its first byte.
        loris = socket.create_connection(address(url), timeout=10)
        loris.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        began = time.monotonic()
        cut = False
        while time.monotonic() - began < CLOSE_WAIT_S and not cut:
            try:
                loris.sendall(b"X-a: b\r\n")
                loris.settimeout(0.2)
                cut = loris.recv(4096) == b""
            except socket.timeout:
                continue
            except OSError:
                cut = True
        loris.close()
        assert cut, "a trickled request was never cut"

        # Request line and headers beyond max_header_bytes: 431, and the connection closes.
        for head in (b"GET /" + b"a" * 8192 + b" HTTP/1.1\r\nHost: x\r\n\r\n",
                     b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-big: " + b"a" * 8192 + b"\r\n\r\n"):
            big = socket.create_connection(address(url), timeout=10)
            big.sendall(head)
            answer = b""
            while chunk := big.recv(4096):
                answer += chunk
            big.close()
            assert answer.startswith(b"HTTP/1.1 431 "), answer[:100]
        # These endpoints take no body.
        body = socket.create_connection(address(url), timeout=10)
        body.sendall(b"POST /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello")
        assert body.recv(4096).startswith(b"HTTP/1.1 413 ")
        body.close()
        assert health(url + "/healthz") == 200
    finally:
        for s in idle:
            s.close()
        log = stop(proc, log_path)
    assert "Traceback" not in log, log


@pytest.mark.slow
def test_out_of_descriptors_refuses_connections_without_spinning(tmp_path):
    """Under a low descriptor limit a flood of connections is refused, not a busy loop; the
    store keeps its descriptors and /healthz answers once the flood is over."""
    yaml = deployment(tmp_path)  # the default limits: the descriptor limit is what binds
    log_path = tmp_path / "serve.log"
    limit = 160
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    proc, url = start(yaml, log_path, preexec_fn=lambda: resource.setrlimit(
        resource.RLIMIT_NOFILE, (limit, hard)))
    flood: list[socket.socket] = []
    try:
        assert health(url + "/healthz") == 200
        for _ in range(150):
            try:
                flood.append(socket.create_connection(address(url), timeout=5))
            except OSError:
                pass
        # The connections it could not hold were closed at once; those it holds stay below
        # the descriptors it keeps for the store.
        assert wait_for(lambda: "out of file descriptors" in log_path.read_text())
        assert descriptors(proc.pid) < limit - 16
        before = cpu_seconds(proc.pid)
        time.sleep(CPU_WINDOW_S)
        spent = cpu_seconds(proc.pid) - before
        assert spent < CPU_BOUND_S, f"{spent:.2f} CPU seconds in {CPU_WINDOW_S} s"
    finally:
        for s in flood:
            s.close()
    try:
        assert wait_for(lambda: health(url + "/healthz") == 200), health(url + "/healthz")
    finally:
        log = stop(proc, log_path)
    refusals = [line for line in log.splitlines() if "out of file descriptors" in line]
    assert 1 <= len(refusals) <= 4, refusals  # once per interval, not once per connection
    assert "Traceback" not in log, log


@pytest.mark.slow
def test_accept_failing_for_want_of_descriptors_closes_at_once(tmp_path):
    """Every descriptor taken (EMFILE at accept): a pending connection is taken off the queue
    on the reserve descriptor and closed at once, without a busy loop; served again once
    descriptors are free."""
    def served_again(port: int) -> None:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=10) as r:
            assert r.status == 200 and r.read() == b"ok\n"
    err = out_of_descriptors_refusals("http", served_again)
    refusals = [line for line in err.splitlines() if "out of file descriptors" in line]
    assert 1 <= len(refusals) <= 3 and "Traceback" not in err, err

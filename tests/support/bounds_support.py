"""What the tests of serve's listener bounds (HTTP, gRPC, remoting) share: a server process's
descriptors and CPU time as /proc says, whether the server closed connections, /healthz's
answer, and a listener whose descriptors are all used up (``fd_hog.py``)."""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from cli_support import env
from paths import SUPPORT

CLOSE_WAIT_S = 30.0  # what "closed by the server" may take on a loaded machine
CPU_WINDOW_S = 5.0
CPU_BOUND_S = 0.5  # a spinning server burns up to CPU_WINDOW_S; an idle one, hundredths
HEALTH_URL = r"health on (http://[\d.:]+/healthz)"  # where serve's log says /healthz is


def descriptors(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def health(url: str) -> int | str:
    """The status ``url`` (a /healthz) answers, or the error that kept it from answering."""
    try:
        with urllib.request.urlopen(url, timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except OSError as exc:
        return repr(exc)


def closed(sock: socket.socket) -> bool:
    """Whether the server closed ``sock`` (without waiting)."""
    sock.setblocking(False)
    try:
        return sock.recv(1) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True
    finally:
        sock.setblocking(True)


def closed_by_server(socks: list[socket.socket], timeout_s: float = CLOSE_WAIT_S) -> int:
    """How many of ``socks`` the server closed (EOF or reset) within ``timeout_s``."""
    deadline, count = time.monotonic() + timeout_s, 0
    with selectors.DefaultSelector() as sel:
        for s in socks:
            sel.register(s, selectors.EVENT_READ)
        while count < len(socks) and time.monotonic() < deadline:
            for key, _ in sel.select(timeout=0.5):
                try:
                    data = key.fileobj.recv(4096)
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(key.fileobj)
                    count += 1
    return count


def out_of_descriptors_refusals(kind: str, served_again: Callable[[int], None]) -> str:
    """Floods ``fd_hog.py kind 64`` (every descriptor taken, EMFILE at accept): 100
    connections, then 20 more, all closed by it, without a busy loop (under CPU_BOUND_S of CPU
    in CPU_WINDOW_S) while the 20 wait; once it let its descriptors go,
    ``served_again(port)`` checks a new connection is served; it exits 0. Returns what it
    logged (its stderr)."""
    proc = subprocess.Popen([sys.executable, str(SUPPORT / "fd_hog.py"), kind, "64"],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env(), text=True)
    try:
        port = int(proc.stdout.readline())
        flood = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(100)]
        assert closed_by_server(flood) == len(flood)
        before = cpu_seconds(proc.pid)
        more = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(20)]
        time.sleep(CPU_WINDOW_S)
        spent = cpu_seconds(proc.pid) - before
        assert spent < CPU_BOUND_S, f"{spent:.2f} CPU seconds in {CPU_WINDOW_S} s"
        assert closed_by_server(more) == len(more)
        for s in flood + more:
            s.close()
        proc.stdin.write("release\n")
        proc.stdin.flush()
        assert proc.stdout.readline().strip() == "released"
        served_again(port)
        proc.stdin.close()
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.stderr.read()

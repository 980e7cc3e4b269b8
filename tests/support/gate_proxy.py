"""TCP proxies between a slave and its master that a test steers.

``GateProxy``: ``open`` forwards as it comes, ``hold`` stops reading the master's side (its
sends back up as they would to a stopped slave), ``trickle`` forwards the master's bytes at a
fixed rate; ``drop()`` closes the connections it carries and the slave dials again through
the proxy, in its current mode. It makes "the slave heard the master's confirm offset but has
not caught up" a certainty: the handshake of a connection made while trickling carries the
confirm offset at once, and the bytes behind it take minutes.

``CuttingProxy``: cuts a connection on demand after a given number of further master bytes
(mid-frame), closing the master's side or the slave's first."""

from __future__ import annotations

import socket
import threading
import time

CHUNK = 4096


class _Proxy:
    """Accepts slaves, dials the master for each, forwards the slave's reports as they are
    and hands the master's side to ``_frames``."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = "127.0.0.1:%d" % self.server.getsockname()[1]
        self.connections = 0  # connections made to the master
        self._socks: list[socket.socket] = []
        self._lock = threading.Lock()
        self._closed = False
        threading.Thread(target=self._serve, daemon=True).start()

    def drop(self) -> None:
        with self._lock:
            socks, self._socks = self._socks, []
        for sock in socks:
            _shut(sock)

    def close(self) -> None:
        self._closed = True
        self.server.close()
        self.drop()

    def _serve(self) -> None:
        while not self._closed:
            try:
                slave, _ = self.server.accept()
            except OSError:
                return
            try:
                master = socket.create_connection(self.target, timeout=10)
            except OSError:
                slave.close()
                continue
            master.settimeout(None)
            with self._lock:
                self._socks += [slave, master]
            self.connections += 1
            threading.Thread(target=self._reports, args=(slave, master), daemon=True).start()
            threading.Thread(target=self._frames, args=(master, slave), daemon=True).start()

    def _reports(self, slave, master) -> None:
        try:
            while data := slave.recv(CHUNK):
                master.sendall(data)
        except OSError:
            pass
        _shut(master)
        _shut(slave)

    def _frames(self, master, slave) -> None:
        raise NotImplementedError


class GateProxy(_Proxy):
    def __init__(self, target: str) -> None:
        self.mode = "open"
        self.rate = 0  # bytes per second, while trickling
        super().__init__(target)

    def hold(self) -> None:
        self.mode = "hold"

    def trickle(self, rate: int) -> None:
        self.rate, self.mode = rate, "trickle"

    def _frames(self, master, slave) -> None:
        sent, since = 0, time.monotonic()
        try:
            while not self._closed:
                mode = self.mode
                if mode == "hold":
                    time.sleep(0.02)
                    continue
                size = CHUNK
                if mode == "trickle":
                    allowed = int((time.monotonic() - since) * self.rate) - sent
                    if allowed <= 0:
                        time.sleep(0.02)
                        continue
                    size = min(CHUNK, allowed)
                data = master.recv(size)
                if not data:
                    break
                slave.sendall(data)
                sent += len(data)
        except OSError:
            pass
        _shut(master)
        _shut(slave)


class CuttingProxy(_Proxy):
    def __init__(self, target: str) -> None:
        self.forwarded = 0
        self._cut: tuple[str, int] | None = None
        super().__init__(target)

    def cut(self, side: str, after: int) -> None:
        self._cut = (side, self.forwarded + after)

    @property
    def pending(self):
        return self._cut

    def _frames(self, master, slave) -> None:
        try:
            while data := master.recv(1500):
                cut = self._cut
                if cut is not None and self.forwarded + len(data) >= cut[1]:
                    keep = cut[1] - self.forwarded
                    slave.sendall(data[:keep])
                    self.forwarded += keep
                    self._cut = None
                    first, second = (master, slave) if cut[0] == "master" else (slave, master)
                    _shut(first)
                    _shut(second)
                    return
                slave.sendall(data)
                self.forwarded += len(data)
        except OSError:
            pass
        _shut(master)
        _shut(slave)


def _shut(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()

"""A master's side of RocketMQ's HA protocol: the listener, and one connection per slave.

Each connection has a reader thread (the slave's offset reports: the first says where to
start, every later one is an acknowledgement) and a writer thread (frames of commit-log
bytes, read through ``CommitLog.read_span``, heartbeats when idle), as RocketMQ's
``HAConnection`` has. The format is ``format.ha_frame``'s.

Everything a peer controls is bounded: at most ``MAX_SLAVES`` connections (more are closed at
once), a report stream that holds at most 7 bytes between reads, nothing read for
``store.ha_housekeeping_interval_ms`` closes the connection, and a send that makes no progress
for as long fails. A report that is negative, or beyond this master's end (the slave holds
bytes this log does not: the two diverged), drops the connection, as does a slave that needs
bytes this master's cleanup already deleted. None of it touches the store: a connection only
reads the commit log and tells ``SlaveAcks`` what the slave acknowledged.
"""

from __future__ import annotations

import logging
import select
import socket
import struct
import threading
import time
from dataclasses import dataclass

from mqstore.config import parse_listen
from mqstore.format.ha_frame import (
    FrameError, ReportDecoder, encode_header, first_transfer_offset,
)
from mqstore.replication.acks import SlaveAcks

log = logging.getLogger(__name__)
MAX_SLAVES = 16
ACCEPT_POLL_S = 0.2
READ_POLL_S = 0.2
IDLE_WAIT_S = 0.1  # RocketMQ's sender waits 100 ms for new bytes unless a put wakes it
STAGED_WAIT_S = 0.01  # bytes appended but still in the transient pool: look again sooner
JOIN_S = 5.0


@dataclass(frozen=True)
class HASettings:
    heartbeat_s: float
    housekeeping_s: float
    batch_bytes: int
    from_first_segment: bool

    @classmethod
    def of(cls, config) -> "HASettings":
        s = config.store
        return cls(s.ha_heartbeat_interval_ms / 1000.0, s.ha_housekeeping_interval_ms / 1000.0,
                   s.ha_transfer_batch_bytes, s.ha_new_slave_from == "first_segment")


def send_timeout(sock: socket.socket, seconds: float) -> None:
    """A blocking send that makes no progress for ``seconds`` fails (BlockingIOError)."""
    whole = int(seconds)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO,
                    struct.pack("ll", whole, int((seconds - whole) * 1e6)))


def readable(sock: socket.socket, timeout_s: float) -> bool:
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    return bool(poller.poll(timeout_s * 1000))


class HAMaster:
    """Listens on ``listen`` (``"host:port"``; port 0 picks one) for slaves."""

    def __init__(self, commit_log, acks: SlaveAcks, settings: HASettings, listen: str) -> None:
        self.commit_log = commit_log
        self.acks = acks
        self.settings = settings
        self.listen = listen
        self.address: str | None = None  # "host:port" bound, once started
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._connections: set[SlaveConnection] = set()

    def start(self) -> None:
        host, port = parse_listen(self.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, port), family=family, backlog=MAX_SLAVES)
        except OSError as exc:
            raise OSError(exc.errno, f"replication cannot listen on server.ha_listen "
                                     f"{self.listen!r}: {exc.strerror}") from None
        sock.settimeout(ACCEPT_POLL_S)
        self._sock = sock
        bound = sock.getsockname()
        self.address = f"[{bound[0]}]:{bound[1]}" if family == socket.AF_INET6 else \
            f"{bound[0]}:{bound[1]}"
        self._stop.clear()
        self.acks.restart()
        self._thread = threading.Thread(target=self._accept_loop, name="mqstore-ha-listen",
                                        daemon=True)
        self._thread.start()
        log.info("replication: master listening for slaves on %s", self.address)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, peer = self._sock.accept()
            except TimeoutError:
                continue
            except OSError:
                if self._stop.is_set():
                    return
                log.exception("replication: accepting a slave failed")
                time.sleep(ACCEPT_POLL_S)
                continue
            name = _peer_name(peer)
            with self._lock:
                full = len(self._connections) >= MAX_SLAVES or self._stop.is_set()
                if not full:
                    slave = SlaveConnection(self, conn, name)
                    self._connections.add(slave)
            if full:
                log.warning("replication: connection from %s refused: %d slaves connected "
                            "already (the most a master takes)", name, MAX_SLAVES)
                close_socket(conn)
                continue
            slave.start()

    def forget(self, slave: "SlaveConnection") -> None:
        with self._lock:
            self._connections.discard(slave)
        self.acks.detach(slave)

    def connections(self) -> list["SlaveConnection"]:
        with self._lock:
            return list(self._connections)

    def status(self) -> dict:
        end = self.commit_log.max_offset
        acked = self.acks.slaves()
        slaves = []
        for c in sorted(self.connections(), key=lambda c: c.peer):
            ack = acked.get(c)
            if ack is not None:
                slaves.append({"address": c.peer, "ack_offset": ack,
                               "lag_bytes": max(0, end - ack), "since_ms": c.since_ms})
        return {"listening": self.address, "max_offset": end, "slaves": slaves}

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            close_socket(self._sock)
        if self._thread is not None:
            self._thread.join(JOIN_S)
        for slave in self.connections():
            slave.close()
        for slave in self.connections():
            slave.join(JOIN_S)
        self.acks.stop()


class SlaveConnection:
    """One slave: RocketMQ's ``HAConnection`` with its read and write services."""

    def __init__(self, master: HAMaster, sock: socket.socket, peer: str) -> None:
        self.master = master
        self.sock = sock
        self.peer = peer
        self.since_ms = int(time.time() * 1000)
        self.requested = -1  # the first report: where sending starts
        self._started = threading.Event()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._threads = [
            threading.Thread(target=self._guard, args=(self._read_loop,), daemon=True,
                             name=f"mqstore-ha-read-{peer}"),
            threading.Thread(target=self._guard, args=(self._write_loop,), daemon=True,
                             name=f"mqstore-ha-write-{peer}")]

    def start(self) -> None:
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send_timeout(self.sock, self.master.settings.housekeeping_s)
        log.info("replication: slave %s connected", self.peer)
        for thread in self._threads:
            thread.start()

    def _guard(self, loop) -> None:
        try:
            why = loop()
        except OSError as exc:
            why = f"{type(exc).__name__}: {exc}"
        except FrameError as exc:
            why = str(exc)
            log.error("replication: slave %s: %s; connection dropped", self.peer, why)
        except Exception:
            log.exception("replication: slave %s: connection failed", self.peer)
            why = "failed"
        if why and not self._closed.is_set():
            log.info("replication: slave %s disconnected: %s", self.peer, why)
        self.close()

    # -- the slave's reports -------------------------------------------------------------------
    def _read_loop(self) -> str | None:
        decoder = ReportDecoder()
        housekeeping = self.master.settings.housekeeping_s
        last_read = time.monotonic()
        while not self._closed.is_set():
            if not readable(self.sock, READ_POLL_S):
                if time.monotonic() - last_read > housekeeping:
                    return f"nothing read for {housekeeping:g} s (store.ha_housekeeping_interval_ms)"
                continue
            data = self.sock.recv(4096)
            if not data:
                return "the slave closed the connection"
            last_read = time.monotonic()
            offset = decoder.feed(data)
            if offset is None:
                continue
            if self.requested < 0:
                self.requested = offset
                self.master.acks.attach(self, offset)
                self._started.set()
                log.info("replication: slave %s asks for the commit log from offset %d",
                         self.peer, offset)
                continue
            end = self.master.commit_log.max_offset
            if offset > end:
                log.error("replication: slave %s acknowledged commit-log offset %d, beyond this "
                          "master's end %d: its log holds bytes this one does not (the logs "
                          "diverge); connection dropped", self.peer, offset, end)
                return "diverged"
            self.master.acks.acked(self, offset)
        return None

    # -- frames to the slave -------------------------------------------------------------------
    def _write_loop(self) -> str | None:
        while not self._started.wait(READ_POLL_S):
            if self._closed.is_set():
                return None
        master, settings, commit_log = self.master, self.master.settings, self.master.commit_log
        segq = commit_log.segments
        requested = self.requested
        end = commit_log.max_offset
        if requested > end:
            log.error("replication: slave %s asks for the commit log from offset %d, beyond "
                      "this master's end %d: its log holds bytes this one does not (the logs "
                      "diverge); connection dropped", self.peer, requested, end)
            return "diverged"
        nxt = first_transfer_offset(requested, end, commit_log.min_offset,
                                    commit_log.segment_bytes, settings.from_first_segment)
        log.info("replication: sending slave %s the commit log from offset %d", self.peer, nxt)
        last_write = time.monotonic()
        seen = master.acks.generation
        while not self._closed.is_set():
            lowest = commit_log.min_offset
            if 0 <= nxt < lowest or (nxt < segq.write_end and segq.find(nxt) is None):
                log.error("replication: slave %s needs commit-log offset %d, which this master "
                          "no longer stores (its log starts at %d): the slave cannot catch up "
                          "and must be rebuilt from the master; connection dropped",
                          self.peer, nxt, lowest)
                return "behind the master's first segment"
            data = commit_log.read_span(nxt, settings.batch_bytes)
            if data:
                self.sock.sendall(encode_header(nxt, len(data)) + data)
                nxt += len(data)
                last_write = time.monotonic()
                continue
            if time.monotonic() - last_write >= settings.heartbeat_s:
                self.sock.sendall(encode_header(nxt, 0))
                last_write = time.monotonic()
            staged = segq.write_end > segq.max_offset
            seen = master.acks.wait_appended(seen, STAGED_WAIT_S if staged else min(
                IDLE_WAIT_S, settings.heartbeat_s))
        return None

    def close(self) -> None:
        with self._close_lock:
            if self._closed.is_set():
                return
            self._closed.set()
        close_socket(self.sock)
        self.master.forget(self)

    def join(self, timeout_s: float) -> None:
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(timeout_s)


def _peer_name(peer) -> str:
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def close_socket(sock: socket.socket) -> None:
    """Shut down and close, whatever state the peer left the connection in."""
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()


__all__ = ["HAMaster", "HASettings", "SlaveConnection", "MAX_SLAVES"]

"""A master's side of RocketMQ's HA protocol: the listener, and one connection per slave.

Each connection has a reader thread (the slave's offset reports: the first says where to
start, every later one is an acknowledgement) and a writer thread (frames of commit-log
bytes, read through ``CommitLog.read_span``, heartbeats when idle), as RocketMQ's
``HAConnection`` has. The format is ``format.ha_frame``'s.

NOTE [ Who counts as a slave ]
A connection is a slave, sent the log and counted by ``SlaveAcks``, only once it is admitted
(``access.HAAccess``): from an address in ``server.ha_allow`` speaking the classic protocol, or
having proven itself in mqstore's handshake (``handshake``). Until then it is *pending*: it is
sent nothing of the log, and it holds no slave slot. An address the configuration cannot admit
is closed at the accept, before anything is read. At most ``MAX_PENDING`` connections are
pending: one more closes the oldest pending connection of the address holding the most, so a
stranger's connections displace each other before they displace a slave's handshake from
another address. A pending connection has ``store.ha_housekeeping_interval_ms`` to be admitted.
Slaves hold at most ``MAX_SLAVES`` slots; strangers never take one.

Everything a peer controls is bounded: the connections above, a report stream that holds at
most 7 bytes between reads, a handshake message of at most 4 KiB, nothing read for the
housekeeping interval closes the connection, and a send that makes no progress for as long
fails. A report that is negative, or beyond this master's end (the slave holds bytes this log
does not: the two diverged), drops the connection, as does a slave that needs bytes this
master's cleanup already deleted. None of it touches the store: a connection only reads the
commit log and tells ``SlaveAcks`` what the slave acknowledged.
"""

from __future__ import annotations

import logging
import socket
import struct
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import Callable

from mqstore.config import parse_listen
from mqstore.format.ha_frame import (
    FrameError, ReportDecoder, encode_header, encode_status, first_transfer_offset,
)
from mqstore.format.ha_hello import is_hello
from mqstore.replication.access import HAAccess, peer_address
from mqstore.replication.acks import SlaveAcks
from mqstore.replication.channel import PlainChannel, TlsChannel, close_socket, readable
from mqstore.replication.handshake import (
    HandshakeRefused, Peers, StreamReader, master_handshake,
)

log = logging.getLogger(__name__)
MAX_SLAVES = 16
MAX_PENDING = 16
ACCEPT_POLL_S = 0.2
READ_POLL_S = 0.2
IDLE_WAIT_S = 0.1  # RocketMQ's sender waits 100 ms for new bytes unless a put wakes it
STAGED_WAIT_S = 0.01  # bytes appended but still in the transient pool: look again sooner
STATUS_EVERY_S = 0.01  # a changed status goes out at most this often while frames flow
JOIN_S = 5.0
REFUSAL_LOG_S = 60.0  # one refusal line per address per minute: strangers cannot flood the log


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


class Refusals:
    """Refused connections: counted, and logged at most once per address per minute."""

    def __init__(self) -> None:
        self.count = 0
        self._lock = threading.Lock()
        self._logged: dict[str, tuple[float, int]] = {}  # host -> (last logged, suppressed)

    def refuse(self, peer: str, why: str) -> None:
        host = peer.rpartition(":")[0]
        now = time.monotonic()
        with self._lock:
            self.count += 1
            last, suppressed = self._logged.get(host, (-REFUSAL_LOG_S, 0))
            if now - last < REFUSAL_LOG_S:
                self._logged[host] = (last, suppressed + 1)
                return
            if len(self._logged) >= 1024:
                self._logged.clear()
            self._logged[host] = (now, 0)
        more = f" ({suppressed} more from {host} since the last line)" if suppressed else ""
        log.warning("replication: connection from %s refused: %s%s", peer, why, more)


class HAMaster:
    """Listens on ``listen`` (``"host:port"``; port 0 picks one) for slaves."""

    def __init__(self, commit_log, acks: SlaveAcks, settings: HASettings, listen: str,
                 access: HAAccess | None = None, peers: Peers | None = None,
                 on_slave: Callable[[], None] = lambda: None) -> None:
        """``peers``: what this master says of itself and how it judges what its peers say
        (``replication.node.Node``; None: it says nothing, an older mqstore master's way);
        ``on_slave()``: called when an admitted slave's first offset report arrived (the state
        mirror ships a snapshot then)."""
        self.commit_log = commit_log
        self.on_slave = on_slave
        self.acks = acks
        self.settings = settings
        self.listen = listen
        self.access = access if access is not None else HAAccess()
        self.peers = peers
        self.address: str | None = None  # "host:port" bound, once started
        self.refusals = Refusals()
        self._sock: socket.socket | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._pending: list[SlaveConnection] = []  # in arrival order
        self._connections: set[SlaveConnection] = set()

    def start(self) -> None:
        host, port = parse_listen(self.listen)
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        try:
            sock = socket.create_server((host, port), family=family,
                                        backlog=MAX_SLAVES + MAX_PENDING)
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
        log.info("replication: master listening for slaves on %s; it admits: %s", self.address,
                 self.access.describe())

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
            self._take(conn, _peer_name(peer), peer_address(peer[0]))

    def _take(self, conn: socket.socket, name: str, addr) -> None:
        if not self.access.admits(addr):  # before a byte is read or a slot taken
            self.refusals.refuse(name, "its address is not in server.ha_allow, and this master "
                                       "takes no handshake (no server.ha_secret_file or TLS)"
                                 if not self.access.loopback_only else
                                 "not a loopback address, and this master was told of no "
                                 "slave (server.ha_allow, server.ha_secret_file, TLS)")
            close_socket(conn)
            return
        slave = SlaveConnection(self, conn, name, addr)
        with self._lock:
            if self._stop.is_set():
                victim = slave
            else:
                victim = self._make_room_locked()
                self._pending.append(slave)
        if victim is slave:
            close_socket(conn)
            return
        if victim is not None:
            self.refusals.refuse(victim.peer, f"closed unadmitted: {MAX_PENDING} connections "
                                              f"were waiting to be admitted, its address held "
                                              f"the most, and it was that address's oldest")
            victim.close()
        slave.start()

    def _make_room_locked(self) -> "SlaveConnection | None":
        if len(self._pending) < MAX_PENDING:
            return None
        crowd = Counter(c.host for c in self._pending)
        most = max(crowd.values())
        victim = next(c for c in self._pending if crowd[c.host] == most)
        self._pending.remove(victim)
        return victim

    def promote(self, slave: "SlaveConnection") -> bool:
        """A pending connection was admitted: it takes a slave slot, if one is free."""
        with self._lock:
            if slave.closed or slave not in self._pending \
                    or len(self._connections) >= MAX_SLAVES:
                return False
            self._pending.remove(slave)
            self._connections.add(slave)
            return True

    def forget(self, slave: "SlaveConnection") -> None:
        with self._lock:
            self._connections.discard(slave)
            if slave in self._pending:
                self._pending.remove(slave)
        self.acks.detach(slave)

    def connections(self) -> list["SlaveConnection"]:
        """The admitted slaves' connections (not the pending ones)."""
        with self._lock:
            return list(self._connections)

    def pending(self) -> list["SlaveConnection"]:
        with self._lock:
            return list(self._pending)

    def status(self) -> dict:
        end = self.commit_log.max_offset
        acked = self.acks.slaves()
        slaves = []
        for c in sorted(self.connections(), key=lambda c: c.peer):
            ack = acked.get(c)
            if ack is not None:
                slaves.append({"address": c.peer, "ack_offset": ack,
                               "lag_bytes": max(0, end - ack), "since_ms": c.since_ms,
                               "admitted": c.admitted})
        return {"listening": self.address, "max_offset": end, "slaves": slaves,
                "pending": len(self.pending()), "refused": self.refusals.count}

    def stop(self) -> None:
        self._stop.set()
        if self._sock is not None:
            close_socket(self._sock)
        if self._thread is not None:
            self._thread.join(JOIN_S)
        everyone = self.connections() + self.pending()
        for slave in everyone:
            slave.close()
        for slave in everyone:
            slave.join(JOIN_S)
        self.acks.stop()


class SlaveConnection:
    """One connection: pending until admitted, then a slave, RocketMQ's ``HAConnection``
    with its read and write services."""

    def __init__(self, master: HAMaster, sock: socket.socket, peer: str, addr) -> None:
        self.master = master
        self.sock = sock
        self.channel: PlainChannel | TlsChannel = PlainChannel(sock)
        self.peer = peer
        self.host = peer.rpartition(":")[0]
        self.addr = addr
        self.admitted: str | None = None  # how it was admitted, once it was
        self.since_ms = int(time.time() * 1000)
        self.requested = -1  # the first report: where sending starts
        self.status_frames = False  # it sent node fields: it takes status frames
        self._started = threading.Event()
        self._closed = threading.Event()
        self._close_lock = threading.Lock()
        self._reader = threading.Thread(target=self._serve, daemon=True,
                                        name=f"mqstore-ha-read-{peer}")
        self._writer = threading.Thread(target=self._guard, args=(self._write_loop,),
                                        daemon=True, name=f"mqstore-ha-write-{peer}")

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def start(self) -> None:
        self.sock.settimeout(None)
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        send_timeout(self.sock, self.master.settings.housekeeping_s)
        self._reader.start()

    def _serve(self) -> None:
        try:
            first = self._admit()
            if first is None:  # a peer's probe, answered: it is no slave
                self.close()
                return
        except (OSError, FrameError, HandshakeRefused) as exc:
            if not self.closed:
                why = str(exc) if isinstance(exc, (FrameError, HandshakeRefused)) else \
                    f"{type(exc).__name__}: {exc}"
                self.master.refusals.refuse(self.peer, why)
            self.close()
            return
        except Exception:
            log.exception("replication: connection from %s failed", self.peer)
            self.close()
            return
        log.info("replication: slave %s connected (%s)", self.peer, self.admitted)
        self._writer.start()
        self._guard(self._read_loop, first)

    def _admit(self) -> bytes | None:
        """Admit this connection as a slave, or raise why not; returns the bytes read past
        the admission (the start of the slave's first offset report), None for a peer's
        probe (answered, and to be closed)."""
        access = self.master.access
        housekeeping = self.master.settings.housekeeping_s
        deadline = time.monotonic() + housekeeping
        if access.tls is not None:
            channel = TlsChannel(self.sock, access.tls, server_side=True)
            channel.handshake(deadline)
            self.channel = channel
        reader = StreamReader(self.channel, deadline)
        try:
            first = reader.peek(4)
        except TimeoutError:
            raise TimeoutError(f"nothing read for {housekeeping:g} s "
                               f"(store.ha_housekeeping_interval_ms)") from None
        if is_hello(first):
            admission = master_handshake(reader, access, lambda: self.master.promote(self),
                                         self.master.peers, self.peer)
            if admission.probe:
                return None
            cert = self.channel.peer_certificate()
            self.admitted = admission.how + (f" ({cert})" if cert else "")
            self.status_frames = admission.peer is not None and self.master.peers is not None
            return reader.rest()
        if not access.classic_ok(self.addr):
            raise HandshakeRefused(
                "it speaks RocketMQ's classic protocol, which this master takes only from "
                "addresses in server.ha_allow" + (" and not over TLS" if access.tls else ""))
        if not self.master.promote(self):
            raise HandshakeRefused(f"{MAX_SLAVES} slaves are connected already (the most a "
                                   f"master takes)")
        self.admitted = "classic protocol, " + ("loopback" if access.loopback_only
                                                 else "server.ha_allow")
        return reader.rest()

    def _guard(self, loop, *args) -> None:
        try:
            why = loop(*args)
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
    def _read_loop(self, first: bytes) -> str | None:
        decoder = ReportDecoder()
        housekeeping = self.master.settings.housekeeping_s
        last_read = time.monotonic()
        data: bytes | None = first
        while not self._closed.is_set():
            if not data:
                if not self.channel.wait_readable(READ_POLL_S):
                    if time.monotonic() - last_read > housekeeping:
                        return (f"nothing read for {housekeeping:g} s "
                                f"(store.ha_housekeeping_interval_ms)")
                    continue
                data = self.channel.recv(4096)
                if data is None:
                    return "the slave closed the connection"
                last_read = time.monotonic()
            offset = decoder.feed(data)
            data = None
            if offset is None:
                continue
            if self.requested < 0:
                self.requested = offset
                self.master.acks.attach(self, offset)
                self.master.on_slave()
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
        send = self.channel.sendall
        status = _StatusSender(master.peers, send) if self.status_frames else None
        while not self._closed.is_set():
            if status is not None:
                status.send_if_changed()
            lowest = commit_log.min_offset
            if 0 <= nxt < lowest or (nxt < segq.write_end and segq.find(nxt) is None):
                log.error("replication: slave %s needs commit-log offset %d, which this master "
                          "no longer stores (its log starts at %d): the slave cannot catch up "
                          "and must be rebuilt from the master; connection dropped",
                          self.peer, nxt, lowest)
                return "behind the master's first segment"
            data = commit_log.read_span(nxt, settings.batch_bytes)
            if data:
                send(encode_header(nxt, len(data)) + data)
                nxt += len(data)
                last_write = time.monotonic()
                continue
            if time.monotonic() - last_write >= settings.heartbeat_s:
                send(encode_header(nxt, 0))
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
        for thread in (self._reader, self._writer):
            if thread is not threading.current_thread() and thread.is_alive():
                thread.join(timeout_s)


class _StatusSender:
    """A slave's status frames: sent when what they say changed, at most every
    ``STATUS_EVERY_S`` while frames flow (format.ha_frame)."""

    def __init__(self, peers: Peers, send) -> None:
        self.peers, self.send = peers, send
        self.last_key = None
        self.last_sent = 0.0

    def send_if_changed(self) -> None:
        key, fields = self.peers.status()
        now = time.monotonic()
        if key != self.last_key and now - self.last_sent >= STATUS_EVERY_S:
            self.send(encode_status(fields))
            self.last_key, self.last_sent = key, now


def _peer_name(peer) -> str:
    host, port = peer[0], peer[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


__all__ = ["HAMaster", "HASettings", "SlaveConnection", "MAX_SLAVES", "MAX_PENDING",
           "close_socket", "readable", "send_timeout"]

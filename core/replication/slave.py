"""A slave's side of RocketMQ's HA protocol: dial the master, take its frames, report.

One thread, as RocketMQ's ``HAClient``: connect to ``server.ha_master`` (with
``server.ha_tls_*``, over TLS; with a secret or TLS, through mqstore's handshake first:
``handshake.slave_handshake``; without, as a RocketMQ slave does), report this log's end
(the master starts there; an empty slave reports 0 and the master picks), then read frames
(``format.ha_frame.FrameDecoder``) and hand them to the ``Receiver``, which appends them; after
each read that moved the log's end, and every ``store.ha_heartbeat_interval_ms`` whatever
happened, report the end again. Nothing read for ``store.ha_housekeeping_interval_ms`` closes
the connection. Whatever ends a connection (the master gone, a frame that breaks the rules,
a log that diverges), the slave closes it and dials again one heartbeat interval later;
partial bytes of the old connection are forgotten, and the new one starts from the log's end.

Through mqstore's handshake the slave also says what it is and hears what the master is (NOTE
[ Node fields ] in ``format.ha_hello``): the master's epochs are checked against this log's
(``following``), and its confirm offset and client endpoint, from the handshake and its status
frames, go to the store's ``RoleState`` (promotion and the endpoint's forwarding read them). A
log that holds records the master lacks is handed to ``on_cut`` (NOTE [ Rejoining ]), and the
client stops dialling.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from mqstore.config import parse_listen
from mqstore.format import ha_hello as hello
from mqstore.format.ha_frame import STATUS_OFFSET, FrameDecoder, FrameError, encode_report
from mqstore.replication.access import HAAccess
from mqstore.replication.following import CutNeeded, Following, MasterStale
from mqstore.replication.channel import PlainChannel, TlsChannel, close_socket
from mqstore.replication.handshake import HandshakeRefused, StreamReader, slave_handshake
from mqstore.replication.master import HASettings, send_timeout
from mqstore.replication.receiver import Receiver, ReplicaDiverged

log = logging.getLogger(__name__)
READ_POLL_S = 0.2
RECV_BYTES = 256 * 1024
JOIN_S = 5.0


class HAClient:
    def __init__(self, receiver: Receiver, settings: HASettings, master: str,
                 access: HAAccess | None = None, node=None, following: Following | None = None,
                 on_cut=None) -> None:
        """``node``: what this store says of itself (``replication.node.Node``; None: the
        handshake carries nothing, as an older mqstore slave's); ``following``: its epochs;
        ``on_cut(CutNeeded)``: its log must be cut to follow (None: a divergence)."""
        self.receiver = receiver
        self.settings = settings
        self.master = master
        self.access = access if access is not None else HAAccess()
        self.node = node
        self.following = following
        self.on_cut = on_cut
        self.heard: hello.NodeInfo | None = None  # what the master last said of itself
        self.connected = False
        self.since_ms = int(time.time() * 1000)  # of the current state (connected or not)
        self.last_error: str | None = None
        self.reported = 0
        self.connections = 0  # made since start
        self._stop = threading.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mqstore-ha-client", daemon=True)
        self._thread.start()
        log.info("replication: slave following master %s", self.master)

    def _run(self) -> None:
        while not self._stop.is_set():
            why = self._connection()
            self._state(False, why)
            if why is not None and not self._stop.is_set():
                log.warning("replication: connection to master %s ended: %s; dialling again "
                            "in %g s", self.master, why, self.settings.heartbeat_s)
            self._stop.wait(self.settings.heartbeat_s)

    def _state(self, connected: bool, why: str | None) -> None:
        if connected != self.connected:
            self.since_ms = int(time.time() * 1000)
        self.connected = connected
        if why is not None:
            self.last_error = why

    def _connection(self) -> str | None:
        """One connection, from dialling to its end; returns why it ended (None: stopped)."""
        host, port = parse_listen(self.master)
        try:
            sock = socket.create_connection((host, port), timeout=self.settings.heartbeat_s)
        except OSError as exc:
            return f"cannot connect: {exc.strerror or exc}"
        self._sock = sock
        try:
            sock.settimeout(None)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            send_timeout(sock, self.settings.housekeeping_s)
            if self._stop.is_set():
                return None
            return self._follow(*self._open(sock, host))
        except OSError as exc:
            return None if self._stop.is_set() else f"{type(exc).__name__}: {exc}"
        except CutNeeded as exc:
            if self.on_cut is None:
                log.error("replication: master %s: %s; connection dropped", self.master, exc)
                return str(exc)
            log.warning("replication: master %s: %s; this store cuts them and rejoins",
                        self.master, exc)
            self._stop.set()  # the store reopens: this client is done
            self.on_cut(exc)
            return None
        except (FrameError, ReplicaDiverged, HandshakeRefused, MasterStale) as exc:
            log.error("replication: master %s: %s; connection dropped", self.master, exc)
            return str(exc)
        except Exception as exc:  # the store closing under it, a file it cannot write
            if self._stop.is_set():
                return None
            log.exception("replication: following master %s failed", self.master)
            return f"{type(exc).__name__}: {exc}"
        finally:
            self._sock = None
            close_socket(sock)

    def _open(self, sock: socket.socket, host: str
              ) -> tuple[PlainChannel | TlsChannel, bytes, hello.NodeInfo | None]:
        """TLS and the handshake, as configured; returns the channel, the master's bytes
        read past the handshake and what the master said of itself."""
        access = self.access
        channel: PlainChannel | TlsChannel = PlainChannel(sock)
        deadline = time.monotonic() + self.settings.housekeeping_s
        if access.tls is not None:
            channel = TlsChannel(sock, access.tls, server_side=False, server_hostname=host)
            channel.handshake(deadline)
        if not access.handshake:
            return channel, b"", None  # RocketMQ's classic protocol: the first report opens it
        reader = StreamReader(channel, deadline)
        node = self.node.info() if self.node is not None else None
        master = slave_handshake(reader, access.secret, node)
        self._heard(master, host)
        if self.following is not None:
            self.following.check(master, self.receiver.end)
        return channel, reader.rest(), master

    def _heard(self, master: hello.NodeInfo | None, host: str) -> None:
        """What the master said of itself, for the store's RoleState."""
        if master is None:
            return
        self.heard = master
        role = getattr(self.node, "role", None)
        if role is None:
            return
        endpoint = master.endpoint
        if endpoint.startswith(":"):  # it listens on every address: the one dialled here
            endpoint = (f"[{host}]" if ":" in host else host) + endpoint
        confirmed = max(role.master_confirmed, master.confirmed) \
            if role.master_epoch == master.last_epoch else master.confirmed
        role.change(master_endpoint=endpoint or None, master_confirmed=confirmed,
                    master_epoch=master.last_epoch)

    def _follow(self, channel: PlainChannel | TlsChannel, first: bytes,
                master: hello.NodeInfo | None) -> str | None:
        receiver, settings = self.receiver, self.settings
        self.reported = receiver.begin()
        channel.sendall(encode_report(self.reported))
        self.connections += 1
        self._state(True, None)
        log.info("replication: connected to master %s%s; this log ends at %d", self.master,
                 " (mqstore's handshake" + (", TLS" if channel.tls else "") + ")"
                 if self.access.handshake else "", self.reported)
        decoder = FrameDecoder(status_frames=master is not None)
        host = parse_listen(self.master)[0]
        last_read = last_report = time.monotonic()
        frames = 0
        data: bytes | None = first
        while not self._stop.is_set():
            if not data and channel.wait_readable(READ_POLL_S):
                data = channel.recv(RECV_BYTES)
                if data is None:
                    return ("the master closed the connection" + (
                        "" if frames else " before sending a frame (a master drops a slave "
                        "whose log ends past its own: do the logs diverge?)"))
                last_read = time.monotonic()
            if data:
                got = decoder.feed(data)
                if master is not None and any(f.phys_offset == STATUS_OFFSET for f in got):
                    got = self._statuses(got, host)
                receiver.accept_all(got)
                if self.following is not None:
                    self.following.advance(receiver.end)
                frames += len(got)
                data = None
            now = time.monotonic()
            if now - last_read > settings.housekeeping_s:
                return (f"nothing from the master for {settings.housekeeping_s:g} s "
                        f"(store.ha_housekeeping_interval_ms)")
            ack = receiver.acknowledged()
            if ack > self.reported or now - last_report >= settings.heartbeat_s:
                channel.sendall(encode_report(ack))
                self.reported, last_report = ack, now
        return None

    def _statuses(self, frames, host: str):
        """Take the status frames out of ``frames`` (what they say goes to the RoleState)."""
        rest = []
        for frame in frames:
            if frame.phys_offset != STATUS_OFFSET:
                rest.append(frame)
                continue
            try:
                self._heard(hello.decode_fields(frame.body, self.heard), host)
            except hello.HelloError as exc:
                raise FrameError(f"status frame: {exc}") from None
        return rest

    def status(self) -> dict:
        receiver = self.receiver
        end = receiver.end
        master_offset = max(receiver.master_offset, end)
        return {"master": self.master, "connected": self.connected, "since_ms": self.since_ms,
                "offset": end, "master_offset": master_offset,
                "lag_bytes": master_offset - end, "reported": self.reported,
                "last_error": self.last_error}

    def stop(self) -> None:
        self._stop.set()
        sock = self._sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(JOIN_S)




__all__ = ["HAClient"]

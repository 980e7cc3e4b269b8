"""A master asks its peers (``server.ha_peers``, their ``server.ha_listen``) what they are,
through mqstore's handshake marked as a probe (NOTE [ Node fields ] in ``format.ha_hello``):
a peer that is master in a newer epoch means this one was replaced (NOTE [ Newer epochs ] in
``replication.node``).

A slave listens on no port, so a peer that refuses the connection is taken as "not a master"
(or down); a peer that cannot be reached in time is skipped until the next round. ``check``
runs one round; ``PeerWatch`` runs rounds every heartbeat interval on a thread of its own
while the store is master. The first round runs before a master with peers takes puts
(``Replication.start``), so a master restarted after a failover never takes one.
"""

from __future__ import annotations

import logging
import socket
import threading
import time

from mqstore.config import parse_listen
from mqstore.format import ha_hello as hello
from mqstore.replication.access import HAAccess
from mqstore.replication.channel import PlainChannel, TlsChannel, close_socket
from mqstore.replication.handshake import HandshakeRefused, StreamReader, slave_handshake
from mqstore.replication.node import Node

log = logging.getLogger(__name__)
JOIN_S = 5.0


def probe(address: str, access: HAAccess, node: Node, timeout_s: float
          ) -> hello.NodeInfo | None:
    """What the master at ``address`` says of itself; None when nothing answers there (no
    master listens) or it says nothing (no fields). OSError, HandshakeRefused (with what the
    peer said, if it did) for other failures."""
    host, port = parse_listen(address)
    try:
        sock = socket.create_connection((host, port), timeout=timeout_s)
    except (ConnectionRefusedError, socket.timeout, OSError) as exc:
        log.debug("replication: peer %s does not answer: %s", address, exc)
        return None
    try:
        sock.settimeout(timeout_s)
        deadline = time.monotonic() + timeout_s
        channel: PlainChannel | TlsChannel = PlainChannel(sock)
        if access.tls is not None:
            channel = TlsChannel(sock, access.tls, server_side=False, server_hostname=host)
            channel.handshake(deadline)
        return slave_handshake(StreamReader(channel, deadline), access.secret,
                               node.info(probe=True))
    finally:
        close_socket(sock)


def check(peers: tuple[str, ...], access: HAAccess, node: Node, timeout_s: float) -> list[str]:
    """One round over ``peers``; returns what was learnt, for the log. A newer master fences
    this one through ``node.newer`` (which tells ``on_replaced``)."""
    learnt = []
    for address in peers:
        try:
            peer = probe(address, access, node, timeout_s)
        except HandshakeRefused as exc:
            peer = exc.peer
            if peer is None:
                learnt.append(f"{address} refused the probe: {exc}")
                continue
        except (OSError, TimeoutError, ConnectionError, ValueError) as exc:
            learnt.append(f"{address} could not be asked: {exc}")
            continue
        if peer is None:
            continue
        role = hello.ROLE_NAMES.get(peer.role, str(peer.role))
        if peer.role == hello.ROLE_MASTER and node.newer(peer, address):
            learnt.append(f"{address} is master in epoch {peer.last_epoch}")
        elif peer.role == hello.ROLE_MASTER and peer.last_epoch == node.epochs.last_epoch \
                and not node.role.is_slave:
            log.error("replication: peer %s is master in epoch %d too: two masters; make one "
                      "of them a slave (`mqstore role demote`)", address, peer.last_epoch)
            learnt.append(f"{address} is also master in epoch {peer.last_epoch}")
        else:
            learnt.append(f"{address} is {role} in epoch {peer.last_epoch}")
    return learnt


class PeerWatch:
    """Rounds of ``check`` every ``interval_s`` while started."""

    def __init__(self, peers: tuple[str, ...], access: HAAccess, node: Node,
                 interval_s: float, timeout_s: float) -> None:
        self.peers, self.access, self.node = peers, access, node
        self.interval_s, self.timeout_s = interval_s, timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mqstore-ha-peers", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            if self.node.role.is_slave or self.node.role.fenced:
                continue
            try:
                check(self.peers, self.access, self.node, self.timeout_s)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("replication: checking the peers failed")

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(JOIN_S)


__all__ = ["probe", "check", "PeerWatch"]

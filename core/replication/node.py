"""What this store says of itself to its replication peers, and what it concludes from what
they say (NOTE [ Node fields ] in ``format.ha_hello``).

A master sends its role, log end, confirm offset (``SlaveAcks.confirmed``), epochs and client
endpoint in its handshake result and in status frames; a slave sends its role, end and epochs
in its proof; a master probing a peer sends the same, marked as a probe.

NOTE [ Newer epochs ]
Epochs only grow, one per promotion: a peer whose newest epoch is above this master's was
made master after it. Whichever way this master hears of one (a slave's proof, a peer's probe,
its own probe's answer), it is fenced at once (NOTE [ Fencing ] in ``mqstore.roles``) and
``on_replaced`` is told, which makes it rejoin the newer master when its address is known. A
peer below this master's epoch learns the same from this master's fields.
"""

from __future__ import annotations

import logging
from typing import Callable

from mqstore.format import ha_hello as hello
from mqstore.replication.acks import SlaveAcks

log = logging.getLogger(__name__)


def advertised(address: str) -> str:
    """A client endpoint as peers are told it: a wildcard host ("0.0.0.0", "::") becomes empty
    (the peer takes the host it dials for replication)."""
    host, _, port = address.rpartition(":")
    return f":{port}" if host.strip("[]") in ("0.0.0.0", "::", "") else address


class Node:
    """``role``: the store's ``RoleState``; ``epochs``: its ``EpochFile``;
    ``on_replaced(why, peer, address)``: a newer master exists (after the fence); ``address``
    is the peer's replication address when this store dialled it, else its connection's."""

    def __init__(self, role, epochs, commit_log, acks: SlaveAcks,
                 on_replaced: Callable[[str, hello.NodeInfo, str], None] | None = None) -> None:
        self.role = role
        self.epochs = epochs
        self.commit_log = commit_log
        self.acks = acks
        self.on_replaced = on_replaced
        self.client_endpoint = ""  # this store's gRPC endpoint as peers should dial it
        self._fenced_for = 0  # the newer epoch this master was fenced for

    def _role_code(self) -> int:
        if self.role.is_slave:
            return hello.ROLE_SLAVE
        return hello.ROLE_FENCED if self.role.fenced else hello.ROLE_MASTER

    def info(self, *, probe: bool = False) -> hello.NodeInfo:
        confirmed = -1 if self.role.is_slave else self.acks.confirmed
        return hello.NodeInfo(self._role_code(), self.commit_log.max_offset, confirmed,
                              tuple(self.epochs.entries), self.client_endpoint, probe)

    # -- what a master's side of the handshake asks (``handshake.Peers``) --------------------
    def fields(self) -> bytes:
        return hello.encode_fields(self.info())

    def judge(self, peer: hello.NodeInfo | None, address: str) -> str | None:
        if peer is None or self.role.is_slave:
            return None
        return self.newer(peer, address)

    def status(self) -> tuple[object, bytes]:
        info = self.info()
        key = (info.role, info.confirmed, info.endpoint, info.last_epoch)
        return key, hello.encode_fields(info, epochs=False)

    # -- NOTE [ Newer epochs ] --------------------------------------------------------------
    def newer(self, peer: hello.NodeInfo, address: str) -> str | None:
        """Why this master must stop, when ``peer`` holds a newer epoch (it is then fenced);
        None otherwise."""
        mine = self.epochs.last_epoch
        if peer.last_epoch <= mine or self.role.is_slave:
            return None
        why = (f"fenced: peer {address} holds epoch {peer.last_epoch}, newer than this "
               f"master's {mine}: another store was made master after this one, so this one "
               f"takes no writes (it rejoins as a slave)")
        if self._fenced_for != peer.last_epoch or self.role.fenced is None:
            self._fenced_for = peer.last_epoch  # logged once per newer epoch
            log.error("replication: %s", why)
            self.role.fence(why)
        if self.on_replaced is not None:
            self.on_replaced(why, peer, address)
        return why


__all__ = ["Node", "advertised"]

"""What every processor works with: the store, who this broker is, and the shared parts.

Identity, as RocketMQ's ``BrokerConfig`` names it: ``brokerName``
(``server.remoting_broker_name``), ``brokerClusterName`` (``server.remoting_cluster``),
``brokerId`` (0 while the store is a master; while it is a slave, ``server.remoting_broker_id``,
default 1: it follows the store's role as it is now, so a promoted slave registers and takes
sends as broker 0, and a demoted master as a slave), the address
clients are told (``server.remoting_advertise``, else the listen address: offset message ids
carry it, and ``mqadmin queryMsgById`` dials it), and its HA address (``ha_address``).
"""

from __future__ import annotations

import socket
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from mqstore.config import parse_listen
from mqstore.format.hosts import Host, parse_host
from mqstore.remoting.clients import Clients
from mqstore.remoting.locks import QueueLocks
from mqstore.remoting.stats import Stats
from mqstore.remoting.topics import BrokerTopics

MASTER_ID = 0


def show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def advertised(listen_host: str, port: int, advertise: str | None) -> str:
    """The address clients are told: ``advertise``, else the listen address (a wildcard
    listen address names this host's address)."""
    if advertise is not None:
        return advertise
    if listen_host in ("0.0.0.0", "", "::"):
        try:
            listen_host = socket.gethostbyname(socket.gethostname())
        except OSError:
            listen_host = "127.0.0.1"
    return show(listen_host, port)


@dataclass
class Broker:
    store: object
    config: object
    address: str  # "ip:port" clients are told
    name: str
    cluster: str
    slave_id: int  # the brokerId while the store is a slave
    topics: BrokerTopics
    clients: Clients = field(default_factory=Clients)
    locks: QueueLocks = field(default_factory=QueueLocks)
    stats: Stats = field(default_factory=Stats)
    put_pool: ThreadPoolExecutor | None = None  # puts that wait for the disk or slaves
    slow_pool: ThreadPoolExecutor | None = None  # lookups that read much (queries by key)
    holds: object = None  # pull.HeldPulls
    offsets: object = None  # offsets.Offsets
    observe: object = None  # (request code, response code, seconds) per answer, or None
    registration: object = None  # registration.Registration, or None without NameServers
    stopping: bool = False

    @property
    def host(self) -> Host:
        return parse_host(self.address)

    @property
    def broker_id(self) -> int:
        return self.slave_id if self.slave else MASTER_ID

    @property
    def slave(self) -> bool:
        """Whether the store is a slave now (its role changes at run time: ``store.roles``)."""
        try:
            return self.store.role_state.is_slave  # type: ignore[attr-defined]
        except Exception:  # noqa: BLE001 - the store reopening for a role change
            return True

    @property
    def ha_address(self) -> str | None:
        """The HA address this broker registers (``haServerAddr``), as the store is now: where
        it listens for slaves, else where it would as a master (a 4.9.8 slave names its own
        HA port too): ``coordination.ha_address`` when set, else ``server.ha_listen`` as bound,
        or as configured when it names a port; a wildcard host reads as the advertised one.
        None when there is none."""
        configured = self.config.coordination.ha_address
        if configured:
            return configured
        try:
            replication = self.store.replication  # type: ignore[attr-defined]
            listen = replication.address if replication is not None else None
        except Exception:  # noqa: BLE001 - the store reopening for a role change
            listen = None
        if listen is None:
            listen = self.config.server.ha_listen
            if listen is None or parse_listen(listen)[1] == 0:
                return None
        host, port = parse_listen(listen)
        if host in ("0.0.0.0", "::"):
            host = parse_listen(self.address)[0]
        return show(host, port)

    @property
    def slave_read_enable(self) -> bool:
        return self.config.server.remoting_slave_read_enable

    def topic_changed(self, oneway: bool) -> None:
        """A topic config changed: NameServers hear of it now."""
        self.topics.changed()
        if self.registration is not None:
            self.registration.soon(oneway)


__all__ = ["Broker", "MASTER_ID", "advertised", "show"]

"""A writable store's replication, by its role (``mqstore.roles.RoleState``): what
``MessageStore.replication`` is.

    async_master, sync_master   ``SlaveAcks`` (the Appender asks it after every put); ``start``
                                listens on ``server.ha_listen`` (when set) for the slaves
                                ``server.ha_*`` admits (``master.HAMaster``,
                                ``access.HAAccess``) and ships the state files to them
                                (``mirror.shipper``: a snapshot at start and whenever a slave
                                connects), and checks the peers of ``server.ha_peers``
                                (``peers``) before the master takes puts, then every heartbeat
                                interval
    slave                       ``start`` dials its master (``role.master``: ``server.ha_master``
                                or the recorded one) through ``slave.HAClient`` and appends what
                                the master sends (``receiver.Receiver``); the Appender refuses
                                producers' puts; dispatch applies the state records to
                                ``replica/`` (``mirror.applier``)

The role changes at run time: ``become_master`` (a promotion: stop following, listen, ship the
state, check the peers) and ``become_slave`` (follow a master; a demotion stops listening
first). What the store says of itself to its peers, and what it concludes from theirs, is
``node.Node``.

Nothing touches the network until ``start`` (``mqstore serve`` calls it beside its HTTP
endpoints; an embedding program calls it itself); the store's close stops it first. While it
runs, a thread keeps ``replication.json`` (``status_file``) current for other processes.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from mqstore.errors import ConfigError
from mqstore.format.ha_hello import NodeInfo
from mqstore.format.replica_run import max_record_bytes
from mqstore.mirror.replica_state import mirror_status
from mqstore.mirror.shipper import StateShipper
from mqstore.replication.access import HAAccess
from mqstore.replication.acks import SlaveAcks
from mqstore.replication.following import CutNeeded, Following
from mqstore.replication.master import HAMaster, HASettings
from mqstore.replication.node import Node
from mqstore.replication.peers import PeerWatch, check
from mqstore.replication.receiver import Receiver
from mqstore.replication.slave import HAClient
from mqstore.replication.status_file import write_status

log = logging.getLogger(__name__)
STATUS_INTERVAL_S = 1.0


def slave_acks(config, role) -> SlaveAcks:
    """What a writable store hands its Appender: its slaves as a put sees them (a slave's
    are used once it is promoted); ``role``: the store's ``RoleState``."""
    return SlaveAcks(sync=role.role == "sync_master",
                     timeout_s=config.flush.sync_timeout_ms / 1000.0,
                     fallbehind_max=config.store.ha_slave_fallbehind_max)


class Replication:
    def __init__(self, root: str, config, commit_log, appender, acks: SlaveAcks, role,
                 epochs) -> None:
        """``role``: the store's ``RoleState``; ``epochs``: its ``EpochFile``."""
        self.root = root
        self.config = config
        self.role_state = role
        self.epochs = epochs
        self.commit_log = commit_log
        self.settings = HASettings.of(config)
        self.acks = acks
        self.node = Node(role, epochs, commit_log, acks, self._replaced)
        self.master: HAMaster | None = None
        self.client: HAClient | None = None
        self.shipper: StateShipper | None = None
        self.watch: PeerWatch | None = None
        self.receiver = Receiver(commit_log, appender,
                                 max_record_bytes(config.commit_log.max_message_bytes))
        self.following = Following(epochs)
        # Set by the store: a cut to make before following (NOTE [ Rejoining ]), and a newer
        # master found (NOTE [ Newer epochs ]): (why, peer info, its replication address).
        self.on_cut: Callable[[CutNeeded], None] | None = None
        self.on_replaced: Callable[[str, NodeInfo, str], None] | None = None
        self.appender = appender
        self.running = False
        self.started = False  # start was called (a reopened store starts its replication)
        self._stop = threading.Event()
        self._status_thread: threading.Thread | None = None
        self._lock = threading.RLock()

    @property
    def role(self) -> str:
        return self.role_state.role

    @property
    def is_slave(self) -> bool:
        return self.role_state.is_slave

    @property
    def address(self) -> str | None:
        """Where a started master listens (``"host:port"``), else None."""
        return self.master.address if self.master is not None else None

    @property
    def client_endpoint(self) -> str:
        """This store's client (gRPC) endpoint as its peers are told it ("" none)."""
        return self.node.client_endpoint

    @client_endpoint.setter
    def client_endpoint(self, value: str) -> None:
        self.node.client_endpoint = value

    def start(self) -> None:
        """Listen and check the peers (a master) or follow (a slave); ConfigError for a
        slave without a master address or a secret or TLS file that cannot be loaded,
        OSError when the port cannot be bound."""
        self.started = True  # before anything it starts can ask the store to reopen
        with self._lock:
            if self.running:
                return
            if self.is_slave:
                self._follow()
            else:
                self._lead()
            self.running = True
            self._keep_telling()

    def _keep_telling(self) -> None:
        """Keep ``replication.json`` current, once there is something to tell (a master no
        slave can reach and no peer asks has nothing)."""
        if self._status_thread is not None or (self.client is None and self.master is None
                                               and self.watch is None):
            return
        self._stop.clear()
        self._status_thread = threading.Thread(target=self._keep_status, daemon=True,
                                               name="mqstore-ha-status")
        self._status_thread.start()
        self._write_status()

    def _follow(self) -> None:
        server, master = self.config.server, self.role_state.master
        if master is None:
            raise ConfigError("store.role is slave but server.ha_master is not set: a "
                              "slave needs the \"host:port\" of its master's "
                              "server.ha_listen")
        self.acks.sync = False
        self.client = HAClient(self.receiver, self.settings, master, HAAccess.for_slave(server),
                               self.node, self.following, self.on_cut)
        self.client.start()

    def _lead(self) -> None:
        server = self.config.server
        self.acks.sync = self.role == "sync_master"
        access = HAAccess.for_master(server)
        if server.ha_peers:
            self._check_peers(access)
        if server.ha_listen is not None:
            self.shipper = self._shipper()
            self.master = HAMaster(self.commit_log, self.acks, self.settings,
                                   server.ha_listen, access, self.node,
                                   on_slave=self.shipper.request_snapshot)
            self.master.start()
            self.shipper.start()
        elif self.role == "sync_master":
            log.warning("replication: store.role is sync_master but server.ha_listen is "
                        "not set: no slave can connect, and puts that wait answer "
                        "SLAVE_NOT_AVAILABLE")
        if server.ha_peers:
            self.watch = PeerWatch(server.ha_peers, HAAccess.for_slave(server), self.node,
                                   self.settings.heartbeat_s, self.settings.housekeeping_s)
            self.watch.start()

    def _check_peers(self, access: HAAccess) -> None:
        """The first round over the peers, before this master takes a put (a restarted master
        that was replaced must not take one)."""
        server = self.config.server
        learnt = check(server.ha_peers, HAAccess.for_slave(server), self.node,
                       min(self.settings.heartbeat_s, self.settings.housekeeping_s))
        for line in learnt:
            log.info("replication: peer %s", line)
        role = self.role_state
        if role.fenced is not None and role.fenced.startswith("the peers in server.ha_peers"):
            role.change(fenced=None)  # none is a newer master: this one takes puts

    def _replaced(self, why: str, peer, address: str) -> None:
        if self.on_replaced is not None:
            self.on_replaced(why, peer, address)

    # -- role changes at run time ------------------------------------------------------------
    def become_master(self) -> None:
        """A promotion: stop following, listen for slaves, check the peers (the caller
        changed the RoleState already)."""
        with self._lock:
            self.stop_following()
            if self.running and self.master is None:
                self._lead()
                self._keep_telling()

    def stop_following(self) -> None:
        with self._lock:
            if self.client is not None:
                self.client.stop()
                self.client = None

    def stop(self) -> None:
        """Close every connection and the listener; waiting SYNC_MASTER puts answer now.
        Idempotent; bounded (each thread is joined with a timeout)."""
        with self._lock:
            if self.acks is not None:
                self.acks.stop()
            if not self.running:
                return
            self.running = False
            self._stop.set()
            if self.client is not None:
                self.client.stop()
            if self.watch is not None:
                self.watch.stop()
            if self.master is not None:
                self.master.stop()
            if self.shipper is not None:
                self.shipper.stop()
                self.shipper = None
            if self._status_thread is not None:
                if self._status_thread is not threading.current_thread():
                    self._status_thread.join(STATUS_INTERVAL_S * 5)
                self._status_thread = None
                self._write_status()

    def _shipper(self) -> StateShipper:
        config = self.config
        # A chunk of a large state file is a record that must fit a segment with room left.
        chunk = min(config.commit_log.max_message_bytes, self.commit_log.segment_bytes // 4)
        return StateShipper(self.root, self.appender.put_state,
                            interval_s=config.store.ha_state_ship_interval_ms / 1000.0,
                            chunk_bytes=chunk)

    def state_changed(self) -> None:
        """A change of the writer process's own state files that a client is told of (an
        ack, a commit): shipped now; under sync_master this returns once a slave holds it
        (or the put's wait ran out: ``flush.sync_timeout_ms``)."""
        shipper = self.shipper
        if shipper is not None:
            sync = self.role == "sync_master"
            shipper.ship_now(wait=sync, timeout_s=2 * self.config.flush.sync_timeout_ms / 1000.0)

    # -- what it is doing --------------------------------------------------------------------
    def status(self) -> dict:
        """The role and, for a master, each slave's acknowledged offset and lag in bytes; for
        a slave, the master's offset as last heard and the lag behind it."""
        role = self.role_state
        out = {"role": role.role, "running": self.running, "epoch": self.epochs.last_epoch,
               "fenced": role.fenced, "updated_ms": int(time.time() * 1000)}
        if self.is_slave:
            if self.client is not None:
                out.update(self.client.status())
            else:
                end = self.commit_log.segments.write_end
                out.update(master=role.master, connected=False, offset=end,
                           master_offset=end, lag_bytes=0, last_error=None)
            out.update(master_confirmed=role.master_confirmed,
                       master_endpoint=role.master_endpoint, master_epoch=role.master_epoch)
            out["state_mirror"] = mirror_status(self.root)
        elif self.master is not None:
            out.update(self.master.status())
            out["confirmed"] = self.acks.confirmed
            if self.shipper is not None:
                out["state_mirror"] = self.shipper.status()
        else:
            out.update(listening=None, max_offset=self.commit_log.max_offset, slaves=[],
                       confirmed=self.acks.confirmed)
        return out

    def problems(self) -> list[str]:
        """What ``/healthz`` reports: a slave that lost its master, a SYNC_MASTER with no
        slave (its puts cannot answer PUT_OK), a fenced master."""
        if not self.running:
            return []
        if self.is_slave:
            client = self.client
            if client is not None and not client.connected:
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(client.since_ms / 1000))
                why = f": {client.last_error}" if client.last_error else ""
                return [f"replication: master {client.master} lost (not connected since "
                        f"{since}){why}"]
            return []
        if self.role_state.fenced:
            return [f"replication: {self.role_state.fenced}"]
        if self.role == "sync_master" and not (self.acks and self.acks.slaves()):
            return ["replication: no slave connected; puts that wait for the store answer "
                    "SLAVE_NOT_AVAILABLE"]
        return []

    def _keep_status(self) -> None:
        last = None
        while not self._stop.wait(STATUS_INTERVAL_S):
            status = self.status()
            moved = {k: v for k, v in status.items() if k != "updated_ms"}
            if moved != last:
                self._write_status(status)
                last = moved

    def _write_status(self, status: dict | None = None) -> None:
        try:
            write_status(self.root, status or self.status())
        except OSError as exc:
            log.warning("replication: cannot write its status for other processes: %s", exc)


__all__ = ["Replication", "slave_acks"]

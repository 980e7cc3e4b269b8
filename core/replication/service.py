"""A writable store's replication, by its role (``store.role``): what ``MessageStore.replication``
is.

    async_master, sync_master   ``SlaveAcks`` from the open on (the Appender asks it after
                                every put); ``start`` listens on ``server.ha_listen`` (when
                                set) for the slaves ``server.ha_*`` admits
                                (``master.HAMaster``, ``access.HAAccess``) and ships the
                                state files to them (``mirror.shipper``: a snapshot at start
                                and whenever a slave connects)
    slave                       ``start`` dials ``server.ha_master`` (``slave.HAClient``) and
                                appends what the master sends (``receiver.Receiver``); the
                                Appender refuses producers' puts; dispatch applies the state
                                records to ``replica/`` (``mirror.applier``)

Nothing touches the network until ``start`` (``mqstore serve`` calls it beside its HTTP
endpoints; an embedding program calls it itself); the store's close stops it first. While it
runs, a thread keeps ``replication.json`` (``status_file``) current for other processes.
"""

from __future__ import annotations

import logging
import threading
import time

from mqstore.errors import ConfigError
from mqstore.format.replica_run import max_record_bytes
from mqstore.mirror.replica_state import mirror_status
from mqstore.mirror.shipper import StateShipper
from mqstore.replication.access import HAAccess
from mqstore.replication.acks import SlaveAcks
from mqstore.replication.master import HAMaster, HASettings
from mqstore.replication.receiver import Receiver
from mqstore.replication.slave import HAClient
from mqstore.replication.status_file import write_status

log = logging.getLogger(__name__)
STATUS_INTERVAL_S = 1.0


def slave_acks(config) -> SlaveAcks | None:
    """What a store of ``config``'s role hands its Appender: a master's ``SlaveAcks``, None
    for a slave."""
    role = config.store.role
    if role == "slave":
        return None
    return SlaveAcks(sync=role == "sync_master", timeout_s=config.flush.sync_timeout_ms / 1000.0,
                     fallbehind_max=config.store.ha_slave_fallbehind_max)


class Replication:
    def __init__(self, root: str, config, commit_log, appender, acks: SlaveAcks | None) -> None:
        self.root = root
        self.config = config
        self.role = config.store.role
        self.commit_log = commit_log
        self.settings = HASettings.of(config)
        self.acks = acks
        self.appender = appender
        self.master: HAMaster | None = None
        self.client: HAClient | None = None
        self.shipper: StateShipper | None = None
        self.receiver = (Receiver(commit_log, appender,
                                  max_record_bytes(config.commit_log.max_message_bytes))
                         if self.role == "slave" else None)
        self.running = False
        self._stop = threading.Event()
        self._status_thread: threading.Thread | None = None
        self._lock = threading.Lock()

    @property
    def is_slave(self) -> bool:
        return self.role == "slave"

    @property
    def address(self) -> str | None:
        """Where a started master listens (``"host:port"``), else None."""
        return self.master.address if self.master is not None else None

    def start(self) -> None:
        """Listen (a master with ``server.ha_listen``) or follow (a slave); ConfigError for a
        slave without ``server.ha_master`` or a secret or TLS file that cannot be loaded,
        OSError when the port cannot be bound."""
        with self._lock:
            if self.running:
                return
            server = self.config.server
            if self.is_slave:
                if server.ha_master is None:
                    raise ConfigError("store.role is slave but server.ha_master is not set: a "
                                      "slave needs the \"host:port\" of its master's "
                                      "server.ha_listen")
                self.client = HAClient(self.receiver, self.settings, server.ha_master,
                                       HAAccess.for_slave(server))
                self.client.start()
            elif server.ha_listen is not None:
                self.shipper = self._shipper()
                self.master = HAMaster(self.commit_log, self.acks, self.settings,
                                       server.ha_listen, HAAccess.for_master(server),
                                       on_slave=self.shipper.request_snapshot)
                self.master.start()
                self.shipper.start()
            elif self.role == "sync_master":
                log.warning("replication: store.role is sync_master but server.ha_listen is "
                            "not set: no slave can connect, and puts that wait answer "
                            "SLAVE_NOT_AVAILABLE")
            self.running = True
            if self.client is None and self.master is None:
                return  # a master no slave can reach: nothing to tell other processes
            self._stop.clear()
            self._status_thread = threading.Thread(target=self._keep_status, daemon=True,
                                                   name="mqstore-ha-status")
            self._status_thread.start()
            self._write_status()

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
            if self.master is not None:
                self.master.stop()
            if self.shipper is not None:
                self.shipper.stop()
                self.shipper = None
            if self._status_thread is not None:
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
        out = {"role": self.role, "running": self.running,
               "updated_ms": int(time.time() * 1000)}
        if self.is_slave:
            if self.client is not None:
                out.update(self.client.status())
            else:
                end = self.commit_log.segments.write_end
                out.update(master=self.config.server.ha_master, connected=False, offset=end,
                           master_offset=end, lag_bytes=0, last_error=None)
            out["state_mirror"] = mirror_status(self.root)
        elif self.master is not None:
            out.update(self.master.status())
            if self.shipper is not None:
                out["state_mirror"] = self.shipper.status()
        else:
            out.update(listening=None, max_offset=self.commit_log.max_offset, slaves=[])
        return out

    def problems(self) -> list[str]:
        """What ``/healthz`` reports: a slave that lost its master, a SYNC_MASTER with no
        slave (its puts cannot answer PUT_OK)."""
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

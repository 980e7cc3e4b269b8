"""``mqstore serve``'s automatic failover: a ``Coordinator`` (``mqstore.coordination``) beside
the served store when ``coordination.etcd_endpoints`` is set (docs/replication.md, "Automatic
failover with etcd"). Imported only then: it needs the ``ha`` extra.

NOTE [ Coordinated roles ]
etcd decides who is master; this module makes the store agree, through the calls the store
has for it (``store.roles``):

- the store takes puts only while ``coordinator.may_write()`` holds (``set_write_guard``: the
  Appender asks before the put and again before PUT_OK). A master whose lease is not renewed
  stops before the lease can expire, so no other node is elected while it still writes. A
  configured master that starts takes no put until it is elected;
- ``on_elected(epoch)``: ``store.promote(epoch=epoch, elected=True)``: a slave becomes
  master in the election's epoch (the state mirror installed, as a manual promotion does; its
  old master's connection, a paused process's, does not refuse it, since that master's lease
  is gone); a fenced master elected again takes puts again. A promotion the store refuses
  (it lacks acknowledged bytes, or has no complete state mirror) steps down at once, so
  another node can win; the refusal is logged and shown in the status;
- ``on_fenced(why)``: ``store.fence(why)``: kept until the store is promoted again or follows
  another node;
- another node leads: ``store.demote(its ha address)``: a master (one that came back after a
  failover: restarted, or paused past its lease) rejoins it as a slave, cutting what it wrote
  that the new master lacks into ``quarantine/`` with a report (NOTE [ Rejoining ]); a slave
  that followed someone else follows it. Checked at every change of leader and at every
  publish, so a leader whose record came late is still followed;
- every renewal interval: the store's log end, role and newest epoch are published (a
  candidate is ranked by its end; an election hands out an epoch above every one it knows,
  NOTE [ Epoch floors ]); a leading master publishes its confirm offset (the end of its
  furthest PUT_OK), which keeps a slave lacking any of it from being elected; and the status
  goes to ``coordination.json`` for ``mqstore stats``.

The slave's gRPC endpoint and the remoting server consult the store's role at each call, so
they follow every change with no wiring here.
"""

from __future__ import annotations

import logging
import threading
import time

from mqstore.config import StoreConfig, coordination_listen_problem
from mqstore.coordination import CoordinationSettings, Coordinator, LeaderInfo
from mqstore.errors import ConfigError
from mqstore.ops.coordination_file import write_coordination

log = logging.getLogger(__name__)
JOIN_S = 10.0


class Failover:
    """Built before the endpoints serve (the write guard is set at once), started once they
    do (``start``: the gRPC endpoint is published), stopped before the store closes."""

    def __init__(self, store, config: StoreConfig) -> None:
        problem = coordination_listen_problem(config.server, config.coordination)
        if problem is not None:
            raise ConfigError(problem)
        self.store = store
        self.node = config.coordination.node
        self.ha_address = config.coordination.ha_address or config.server.ha_listen
        state = store.role_state
        self.coordinator = Coordinator(
            CoordinationSettings.of(config.coordination), role=state.role,
            offset=store.max_phys_offset, addresses={"ha": self.ha_address},
            on_elected=self._elected, on_fenced=self._fenced,
            on_leader_changed=lambda leader: self._follow(leader, told=True),
            bootstrap=not state.is_slave, known_epoch=_known_epoch(state))
        self.interval_s = self.coordinator.settings.renew_s
        self.max_lag = config.coordination.max_lag_bytes
        self.last_action: str | None = None
        self._withdrawn_at: int | None = None  # the log end when it withdrew from elections
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        store.set_write_guard(self.coordinator.may_write, self.status)

    # -- life -----------------------------------------------------------------------------
    def start(self, grpc_endpoint: str | None = None) -> None:
        if grpc_endpoint:
            self.coordinator.publish(addresses={"ha": self.ha_address, "grpc": grpc_endpoint})
        self.coordinator.start()
        self._thread = threading.Thread(target=self._run, name="mqstore-failover", daemon=True)
        self._thread.start()
        log.info("coordination: node %s in cluster %s on etcd %s (replication address %s)",
                 self.node, self.coordinator.settings.cluster,
                 ", ".join(self.coordinator.settings.endpoints), self.ha_address)

    def stop(self) -> None:
        """Step down if leading (another node is elected at once), leave the cluster."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_S)
        self.coordinator.stop()

    def status(self) -> dict:
        """The coordinator's status with ``may_write`` and what this module did last."""
        return {**self.coordinator.status(), "may_write": self.coordinator.may_write(),
                "last_action": self.last_action}

    # -- the coordinator's callbacks (its events thread, one at a time) ----------------------
    def _elected(self, epoch: int) -> None:
        try:
            done = self.store.promote(epoch=epoch, elected=True, accept_lag=self.max_lag,
                                    confirmed=self.coordinator.confirmed)
        except Exception as exc:  # noqa: BLE001 - any refusal: let another node lead
            # It would refuse again: it stands again once its log moves or it follows a
            # leader, not at the next election (others would read it as the leader meanwhile).
            self._did(f"elected in epoch {epoch} but not promoted, stepped down: {exc}",
                      logging.ERROR)
            self._withdrawn_at = self._end()
            self.coordinator.withdraw(f"its store refused the promotion in epoch {epoch}")
            self.coordinator.step_down()
            return
        self.coordinator.publish(role=done["role"], known_epoch=epoch)
        lacked = f", lacking {done['lacked']['bytes']} bytes" if done.get("lacked") else ""
        self._did(f"elected: {done['role']} in epoch {epoch} from commit-log offset "
                  f"{done['start_offset']}{lacked}")

    def _fenced(self, why: str) -> None:
        if self.store.role_state.is_slave:
            return
        try:
            self.store.fence(why)
        except Exception:  # noqa: BLE001 - closing: the write guard refuses puts anyway
            log.debug("coordination: fencing a closed store", exc_info=True)
            return
        self._did(f"fenced: {why}", logging.WARNING)

    def _follow(self, leader: LeaderInfo | None, told: bool = False) -> None:
        """Follow ``leader`` unless it is this node (``told``: the coordinator reported a new
        leader, so the status says so even when the store already follows it)."""
        if leader is None or leader.name == self.node:
            return
        ha = leader.member.addresses.get("ha") if leader.member is not None else None
        if not ha:
            return  # its record is not in the view yet: the next publish looks again
        try:
            done = self.store.demote(ha, why=f"coordination: {leader.name} leads in epoch "
                                             f"{leader.epoch}", if_needed=True)
        except Exception as exc:  # noqa: BLE001 - tried again at the next publish
            self._did(f"could not follow {leader.name} at {ha}: {exc}", logging.ERROR)
            return
        if told or not done.get("unchanged"):
            self._did(f"following {leader.name} (epoch {leader.epoch}) at {ha}, was "
                      f"{done['was']}")
        self._stand_again()

    # -- the publisher ----------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._publish()
            except Exception:  # noqa: BLE001 - a reopen under way: next time
                log.debug("coordination: publish skipped", exc_info=True)

    def _publish(self) -> None:
        store, coordinator = self.store, self.coordinator
        state = store.role_state
        end = store.max_phys_offset
        coordinator.publish(offset=end, role=state.role, known_epoch=_known_epoch(state))
        if self._withdrawn_at is not None and end != self._withdrawn_at:
            self._stand_again()
        replication = store.replication
        if coordinator.epoch is not None and not state.is_slave and replication is not None:
            confirmed = replication.acks.confirmed
            if confirmed > 0:
                coordinator.publish(confirmed_offset=confirmed)
        leader = coordinator.leader
        if leader is not None and leader.name != self.node:
            self._follow(leader)
        write_coordination(store.root, {**self.status(), "updated_ms": int(time.time() * 1000)})

    def _end(self) -> int | None:
        try:
            return self.store.max_phys_offset
        except Exception:  # noqa: BLE001 - reopening
            return None

    def _stand_again(self) -> None:
        if self._withdrawn_at is not None:
            self._withdrawn_at = None
            self.coordinator.withdraw(None)

    def _did(self, what: str, level: int = logging.WARNING) -> None:
        self.last_action = what
        log.log(level, "coordination: %s", what)


def _known_epoch(state) -> int:
    return max(state.epoch or 0, state.master_epoch or 0)


__all__ = ["Failover"]

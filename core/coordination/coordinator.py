"""``Coordinator``: one node of a cluster in etcd. It publishes the node's record, follows the
leader key, campaigns when it is the best candidate, and as leader publishes the confirmed
offset; ``LeaderLease`` holds the lease, the deadlines and the fencing.

One thread (``mqstore-coordination``) runs rounds: publish this node's record if it changed
(or its lease did), read the cluster's keys at one revision, report a change of leader, act
(campaign, or revoke a stale key naming this node), and as leader raise the confirmed offset;
then wait for the leader key to change after that revision (a watch from the next revision:
no change is missed) or ``renew_interval``, whichever comes first. When etcd cannot be reached
the round fails, is logged once, and is tried again every ``renew_interval``: nobody campaigns
without etcd, and a leader fences at its deadline (``LeaderLease``).

The confirmed offset only grows: it is raised by a txn that holds only while the leader key
is this node's term and the key is unchanged since read, so a deposed leader cannot write it
and a new leader, whose log holds at least that offset, never lowers it.
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import replace
from typing import Callable, Mapping

from mqstore.coordination.election import why_not
from mqstore.coordination.etcd import EtcdClient, holds, put, unchanged
from mqstore.coordination.events import Events
from mqstore.coordination.lease import JOIN_S, LeaderLease
from mqstore.coordination.records import (
    ClusterView, Keys, LeaderInfo, MemberInfo, confirmed_record, parse_view,
)
from mqstore.coordination.settings import CoordinationSettings, now
from mqstore.errors import CoordinationError

log = logging.getLogger(__name__)


class Coordinator:
    """See the package docstring for what the store calls and what it gets back."""

    def __init__(self, settings: CoordinationSettings, *, role: str = "slave", offset: int = 0,
                 addresses: Mapping[str, str] | None = None,
                 on_elected: Callable[[int], object] | None = None,
                 on_fenced: Callable[[str], object] | None = None,
                 on_leader_changed: Callable[[LeaderInfo | None], object] | None = None,
                 client_factory: Callable[[], EtcdClient] | None = None,
                 bootstrap: bool = True, known_epoch: int = 0) -> None:
        self.settings = settings
        self.keys = Keys(settings.cluster)
        self.on_leader_changed = on_leader_changed
        self.events = Events()
        self._factory = client_factory or (
            lambda: EtcdClient(settings.endpoints, settings.retry_s))
        self.lease = LeaderLease(settings, on_elected=on_elected, on_fenced=on_fenced,
                                 events=self.events, client_factory=self._factory)
        self._member = MemberInfo(settings.node, role, offset, settings.priority,
                                  settings.priority > 0 and bootstrap, dict(addresses or {}),
                                  _whole(known_epoch, "known_epoch"))
        self.lease.epoch_floor = self._member.epoch
        self.bootstrap = bootstrap  # may win a cluster's first election
        self._confirmed: int | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._registered: tuple[int, bytes] | None = None
        self._seen: tuple[str, int] | None = None
        self._sit_out: tuple[float, int] | None = None  # (until, the epoch it stepped down from)
        self._withdrawn: str | None = None  # why it does not stand until told otherwise
        self.leader: LeaderInfo | None = None
        # The cluster's confirmed offset as last read: an elected node lacking bytes below it
        # lacks acknowledged messages, whatever its old master's frames told it.
        self.confirmed = 0
        self.waiting_for: str | None = "the first read of etcd"
        self.last_error: str | None = None

    # -- what the store calls ---------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self.events.start()
        self.lease.start()
        self._thread = threading.Thread(target=self._run, name="mqstore-coordination",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Step down if leading, take this node's keys out of etcd (its lease revoked), stop
        every thread, after running the callbacks already due. Bounded."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(JOIN_S + self.settings.retry_s + self.settings.renew_s)
            self._thread = None
        self.lease.stop()
        self.events.stop()

    def may_write(self) -> bool:
        """Whether this node leads and its write deadline has not passed: no I/O, no lock."""
        return self.lease.may_write()

    def writable_until(self) -> float:
        return self.lease.writable_until()

    @property
    def epoch(self) -> int | None:
        """The epoch this node leads in, else None."""
        return self.lease.epoch if self.lease.holding else None

    def publish(self, *, offset: int | None = None, role: str | None = None,
                confirmed_offset: int | None = None,
                addresses: Mapping[str, str] | None = None,
                known_epoch: int | None = None) -> None:
        """Update what this node publishes; written by the next round (within
        ``renew_interval``). ``offset``: the commit log's end; ``confirmed_offset`` (used while
        leading): the last offset every PUT_OK so far is known to cover; ``known_epoch``: the
        newest epoch its store knows (its epoch file's, its master's): an election this node
        wins hands out an epoch above it (NOTE [ Epoch floors ] in ``lease``)."""
        with self._lock:
            changes: dict[str, object] = {}
            if offset is not None:
                changes["offset"] = _whole(offset, "offset")
            if role is not None:
                changes["role"] = role
            if addresses is not None:
                changes["addresses"] = dict(addresses)
            if known_epoch is not None and known_epoch > self._member.epoch:
                changes["epoch"] = _whole(known_epoch, "known_epoch")
                self.lease.epoch_floor = max(self.lease.epoch_floor, known_epoch)
            self._member = replace(self._member, **changes)  # type: ignore[arg-type]
            if confirmed_offset is not None:
                self._confirmed = max(self._confirmed or 0,
                                      _whole(confirmed_offset, "confirmed_offset"))

    def step_down(self) -> bool:
        """Stop leading now (``on_fenced("stepped down")``) and sit out the next election, so
        another node takes over (until a new leader is seen, or one TTL passed)."""
        epoch = self.lease.epoch or 0
        if not self.lease.holding:
            return False
        with self._lock:
            self._sit_out = (now() + self.settings.ttl_s, epoch)
        return self.lease.step_down()

    def withdraw(self, why: str | None) -> None:
        """Stand in no election while ``why`` is set (a node whose store refused a promotion:
        elected again, it would refuse again, and other nodes would read it as the leader
        meanwhile); ``withdraw(None)`` stands again. Published by the next round."""
        with self._lock:
            self._withdrawn = why

    def status(self) -> dict:
        leader = self.leader
        left = self.lease.writable_until() - now()
        return {"node": self.settings.node, "cluster": self.settings.cluster,
                "leader": leader.name if leader else None,
                "leader_epoch": leader.epoch if leader else None,
                "leading": self.lease.holding, "epoch": self.epoch,
                "writable_for_ms": int(left * 1000) if math.isfinite(left) and left > 0 else 0,
                "waiting_for": self.waiting_for, "fenced_reason": self.lease.fenced_reason,
                "last_error": self.last_error or self.lease.last_error}

    # -- the rounds ---------------------------------------------------------------------------
    def _run(self) -> None:
        client = self._factory()
        try:
            while not self._stop.is_set():
                try:
                    revision = self._round(client)
                except CoordinationError as exc:
                    if str(exc) != self.last_error:
                        log.warning("coordination: %s", exc)
                    self.last_error = str(exc)
                    self._stop.wait(self.settings.renew_s)
                    continue
                if self.last_error is not None:
                    log.info("coordination: etcd answers again (%s)", client.endpoint)
                    self.last_error = None
                try:
                    client.wait_change(self.keys.leader, revision, self.settings.renew_s)
                except CoordinationError:
                    self._stop.wait(self.settings.renew_s)
        finally:
            client.close()

    def _round(self, client: EtcdClient) -> int:
        lease = self.lease.lease_id
        if lease is not None:
            self._register(client, lease)
        revision, kvs = client.range(self.keys.prefix, prefix=True)
        view = parse_view(self.keys, revision, kvs)
        if lease is not None and self.settings.node not in view.members:
            self._registered = None  # gone from etcd (deleted by hand): publish again
        self._observe(view)
        self._act(view)
        if self.lease.holding:
            self._raise_confirmed(client, view)
        return view.revision

    def _register(self, client: EtcdClient, lease: int) -> None:
        with self._lock:
            record = self._member.encode()
        if self._registered != (lease, record):
            client.put(self.keys.member(self.settings.node), record, lease)
            self._registered = (lease, record)

    def _observe(self, view: ClusterView) -> None:
        leader = view.leader
        with self._lock:
            if view.epoch > self._member.epoch:
                self._member = replace(self._member, epoch=view.epoch)
            if leader is not None and self._sit_out and leader.epoch > self._sit_out[1]:
                self._sit_out = None
            # A node that does not bootstrap stands from the cluster's first election on, so
            # the others do not wait for it in that one.
            standing = self.settings.priority > 0 and not (
                self._sit_out and now() < self._sit_out[0]) and (
                self.bootstrap or view.epoch_mod_revision != 0) and self._withdrawn is None
            if standing != self._member.candidate:
                self._member = replace(self._member, candidate=standing)
        self.leader = leader
        self.confirmed = max(self.confirmed, view.confirmed)
        seen = (leader.name, leader.epoch) if leader is not None else None
        if seen != self._seen:
            self._seen = seen
            self.events.fire(self.on_leader_changed, leader)
            log.info("coordination: leader %s", f"{seen[0]} (epoch {seen[1]})" if seen else
                     "none")

    def _act(self, view: ClusterView) -> None:
        leader = view.leader
        if leader is not None:
            self.waiting_for = None
            if leader.name == self.settings.node and not (
                    self.lease.holding and leader.lease == self.lease.lease_id):
                self.lease.disown(leader.lease)
            return
        reason = why_not(view, self.settings.node, self.settings.max_lag_bytes)
        if view.epoch_mod_revision == 0 and not self.bootstrap:
            reason = ("no election has happened in this cluster yet, and this node does not "
                      "stand in the first (a configured slave waits for its master to win it)")
        withdrawn = self._withdrawn
        if withdrawn is not None:  # it names the cause that ``why_not`` cannot
            reason = f"it withdrew from elections: {withdrawn}"
        if reason is None and not self._member.candidate:
            reason = "it stepped down and sits out this election"
        if reason is None and not self.lease.can_campaign():
            reason = "its lease is not renewed yet"
        self.waiting_for = reason
        if reason is None:  # above every epoch a member's store knows (NOTE [ Epoch floors ])
            known = max((m.epoch for m in view.members.values()), default=0)
            self.lease.epoch_floor = max(self.lease.epoch_floor, known)
        if reason is None and self.lease.acquire() is None:
            self.waiting_for = "another node won the election"

    def _raise_confirmed(self, client: EtcdClient, view: ClusterView) -> None:
        with self._lock:
            want = self._confirmed
        record, epoch = self.lease.record, self.lease.epoch
        if want is None or want <= view.confirmed or record is None or epoch is None:
            return
        client.txn([holds(self.keys.leader, record),
                    unchanged(self.keys.confirmed, view.confirmed_mod_revision)],
                   [put(self.keys.confirmed, confirmed_record(want, epoch,
                                                              self.settings.node))])


def _whole(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{name} {value!r} must be a whole number >= 0 (a commit-log offset)")
    return value


__all__ = ["Coordinator"]

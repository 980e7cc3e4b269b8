"""``LeaderLease``: this node's lease in etcd, and the leader key it may hold on it.

A keeper thread (``mqstore-coordination-lease``) grants the lease, renews it every
``renew_interval`` and, while this node leads, checks after each renewal that the leader key
still names it. Each renewal moves the deadlines (NOTE [ The fencing clock ] in ``settings``):
the lease's own (the keepalive's send time + TTL), and while leading the write deadline, that
minus the safety margin. A watchdog thread (``mqstore-coordination-fence``) fences the holder
when the write deadline passes unrenewed; ``may_write()`` compares the clock with it and needs
neither thread to have run.

An election is one txn (``acquire``): the leader key is absent AND the epoch key is unchanged
since it was read, then put the leader key on this lease and the epoch + 1. Two nodes that read
the same epoch cannot both succeed, and a successful txn is the only way an epoch is handed out:
epochs only grow, one winner each.

NOTE [ Epoch floors ]
The epoch key starts at 0 in a new etcd (or a new cluster name) while the stores may already
hold epochs (manual promotions, an earlier etcd): a store's epoch file needs each new master's
epoch above every one it knows. So a candidate's txn puts ``max(epoch key, the newest epoch its
store or any member's store knows, as published) + 1``, still under the compare on the epoch key's revision: elections stay
serialized by that key, and its value only grows.

Fencing ends a term for good: the lease it was held on is revoked (now, or by the keeper once
etcd answers: after an outage etcd renews every lease to its full TTL, and a fenced leader's key
must not block the next election that long) and a new lease is granted. The node can win a
later election, with a new epoch; a fenced lease is never reused. Stepping down is the same,
asked for. Lease and leader key are this node's alone: when the leader key names this node
under any other lease, or no longer exists, the holder fences.
"""

from __future__ import annotations

import logging
import math
import threading
from typing import Callable

from mqstore.coordination.etcd import EtcdClient, absent, put, unchanged
from mqstore.coordination.events import Events
from mqstore.coordination.records import Keys, LeaderInfo, parse_epoch
from mqstore.coordination.settings import CoordinationSettings, now
from mqstore.errors import CoordinationError, CoordinationUnavailable

log = logging.getLogger(__name__)
JOIN_S = 5.0
NEVER = -math.inf


class LeaderLease:
    """``on_elected(epoch)`` and ``on_fenced(reason)`` run on ``events``' thread, in order."""

    def __init__(self, settings: CoordinationSettings, *,
                 on_elected: Callable[[int], object] | None = None,
                 on_fenced: Callable[[str], object] | None = None,
                 events: Events | None = None,
                 client_factory: Callable[[], EtcdClient] | None = None) -> None:
        self.settings = settings
        self.keys = Keys(settings.cluster)
        self.on_elected, self.on_fenced = on_elected, on_fenced
        self._own_events = events is None
        self.events = events if events is not None else Events()
        self._factory = client_factory or (
            lambda: EtcdClient(settings.endpoints, settings.retry_s))
        self._client = self._factory()  # the caller's calls, under _call_lock
        self._call_lock = threading.Lock()
        self._cond = threading.Condition()  # guards the state below
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.lease_id: int | None = None
        self._lease_until = NEVER
        self._writable_until = NEVER  # read without the lock: one float
        self.holding = False
        self.epoch: int | None = None  # the term held, or the last one held
        self.record: bytes | None = None  # the leader key's value while holding
        self.fenced_reason: str | None = None
        self.fenced_deadline = NEVER  # the write deadline the last term ended with
        self.last_error: str | None = None
        self.epoch_floor = 0  # an election hands out an epoch above it (NOTE [ Epoch floors ])
        self._revoke: list[int] = []
        self._ttl_warned = False

    # -- what the put path asks -------------------------------------------------------------
    def may_write(self) -> bool:
        """Whether this node leads and its write deadline has not passed. No I/O, no lock."""
        return now() < self._writable_until

    def writable_until(self) -> float:
        """The write deadline on the fencing clock (``coordination.now``; -inf when not
        leading)."""
        return self._writable_until

    def can_campaign(self) -> bool:
        """A lease that would leave a winner writable: held, its deadline ahead."""
        return (self.lease_id is not None and not self.holding
                and now() < self._lease_until - self.settings.margin_s)

    # -- life ---------------------------------------------------------------------------------
    def start(self) -> None:
        if self._threads:
            return
        self._stop.clear()
        if self._own_events:
            self.events.start()
        for target, name in ((self._keep, "mqstore-coordination-lease"),
                             (self._watch_deadline, "mqstore-coordination-fence")):
            thread = threading.Thread(target=target, name=name, daemon=True)
            thread.start()
            self._threads.append(thread)

    def stop(self) -> None:
        """Step down if leading, revoke the lease (this node's keys go at once), end the
        threads. Bounded: a revoke etcd does not answer is left to the lease's expiry."""
        self.step_down("the node stops")
        with self._cond:
            self._abandon_locked()
            self._stop.set()
            self._cond.notify_all()
        for thread in self._threads:
            thread.join(JOIN_S)
        self._threads = []
        with self._call_lock:
            self._revoke_pending(self._client)
            self._client.close()
        if self._own_events:
            self.events.stop()

    # -- elections ----------------------------------------------------------------------------
    def acquire(self) -> int | None:
        """Campaign: the new epoch when this node won, None when another holds the key, the
        epoch moved meanwhile, or this node has no live lease. CoordinationUnavailable when
        etcd cannot be reached (a txn whose outcome is unknown abandons the lease first: if
        the key became this node's, the revoke deletes it)."""
        with self._call_lock:
            lease = self.lease_id
            if lease is None or not self.can_campaign():
                return None
            _, kvs = self._client.range(self.keys.epoch)
            epoch_kv = kvs[0] if kvs else None
            epoch = max(parse_epoch(epoch_kv), self.epoch_floor) + 1
            record = LeaderInfo(self.settings.node, epoch, lease).encode()
            try:
                won = self._client.txn(
                    [absent(self.keys.leader),
                     unchanged(self.keys.epoch, epoch_kv.mod_revision if epoch_kv else 0)],
                    [put(self.keys.leader, record, lease),
                     put(self.keys.epoch, str(epoch).encode())]).succeeded
            except CoordinationUnavailable:
                self._abandon(lease, "the outcome of its election txn is unknown")
                raise
            except CoordinationError as exc:  # etcd refused: the lease is gone
                self._abandon(lease, f"etcd refused its election txn: {exc}")
                return None
        return self._take(lease, epoch, record) if won else None

    def step_down(self, reason: str = "stepped down") -> bool:
        """Give up leadership at once: writes stop, ``on_fenced(reason)`` fires, the lease is
        revoked so another node can win now. False when this node did not lead."""
        with self._cond:
            if not self.holding:
                return False
            self._fence_locked(self.lease_id, reason)
        with self._call_lock:
            self._revoke_pending(self._client)
        return True

    def disown(self, lease: int) -> None:
        """The leader key names this node on ``lease`` but no term of this object holds it
        (left by a previous process of this node, or by an election whose outcome was
        unknown): revoke that lease, so the next election need not wait for its expiry."""
        with self._cond:
            if self.holding and lease == self.lease_id:
                return
            if lease == self.lease_id:
                self._abandon_locked()
            elif lease not in self._revoke:
                self._revoke.append(lease)
        log.warning("coordination: the leader key names %s on lease %x, which no term of this "
                    "process holds: revoking it", self.settings.node, lease)

    def _take(self, lease: int, epoch: int, record: bytes) -> int | None:
        with self._cond:
            if self.lease_id != lease or now() >= self._lease_until - self.settings.margin_s:
                self._abandon_locked()  # won on a lease that ran out meanwhile: let it go
                return None
            self.holding, self.epoch, self.record = True, epoch, record
            self.fenced_reason = None
            self._writable_until = self._lease_until - self.settings.margin_s
            self._cond.notify_all()
            self.events.fire(self.on_elected, epoch)
        log.info("coordination: %s won the election: epoch %d", self.settings.node, epoch)
        return epoch

    # -- the keeper thread ------------------------------------------------------------------
    def _keep(self) -> None:
        client = self._factory()
        try:
            while not self._stop.is_set():
                self._revoke_pending(client)
                try:
                    if self.lease_id is None:
                        self._grant(client)
                    else:
                        self._renew(client)
                    self.last_error = None
                except CoordinationError as exc:
                    self.last_error = str(exc)
                    log.debug("coordination: %s", exc)
                self._stop.wait(self.settings.renew_s)
        finally:
            client.close()

    def _grant(self, client: EtcdClient) -> None:
        sent = now()
        lease, ttl = client.grant(self.settings.ttl_s)
        if ttl > self.settings.ttl_s and not self._ttl_warned:
            self._ttl_warned = True
            log.warning("coordination: etcd granted a %d s lease for the %d s asked (its minimum "
                        "follows its election timeout); deadlines still count %d s",
                        ttl, self.settings.ttl_s, self.settings.ttl_s)
        with self._cond:
            if self._stop.is_set():
                self._revoke.append(lease)
                return
            self.lease_id = lease
            self._lease_until = sent + min(ttl, self.settings.ttl_s)

    def _renew(self, client: EtcdClient) -> None:
        lease, sent = self.lease_id, now()
        if lease is None:
            return
        budget = self.settings.retry_s
        if self.holding:  # never wait on etcd past the write deadline
            budget = min(budget, max(self._writable_until - sent, 0.05))
        ttl = client.keepalive(lease, budget)
        if ttl is None:
            self._abandon(lease, "etcd no longer has its lease (it expired)")
            return
        if self.holding:
            _, kvs = client.range(self.keys.leader)
            if not kvs or kvs[0].value != self.record:
                with self._cond:
                    self._fence_locked(lease, "the leader key no longer names this node's "
                                              "term (deleted or taken in etcd)")
                return
        with self._cond:
            if self.lease_id != lease:
                return
            self._lease_until = sent + min(ttl, self.settings.ttl_s)
            if self.holding:
                self._writable_until = self._lease_until - self.settings.margin_s
                self._cond.notify_all()

    def _revoke_pending(self, client: EtcdClient) -> None:
        with self._cond:
            pending = list(self._revoke)
        for lease in pending:
            try:
                client.revoke(lease)
            except CoordinationError as exc:
                log.debug("coordination: revoking lease %x later: %s", lease, exc)
                continue
            with self._cond:
                if lease in self._revoke:
                    self._revoke.remove(lease)

    # -- the watchdog -------------------------------------------------------------------------
    def _watch_deadline(self) -> None:
        with self._cond:
            while not self._stop.is_set():
                if not self.holding:
                    self._cond.wait()
                    continue
                left = self._writable_until - now()
                if left > 0:
                    self._cond.wait(left)
                    continue
                self._fence_locked(self.lease_id, "its lease was not renewed before its write "
                                                  "deadline (etcd unreachable or too slow)")

    # -- ending a lease -----------------------------------------------------------------------
    def _abandon(self, lease: int, reason: str) -> None:
        with self._cond:
            if self.lease_id != lease:
                return
            if self.holding:
                self._fence_locked(lease, reason)
            else:
                log.info("coordination: %s takes a new lease: %s", self.settings.node, reason)
                self._abandon_locked()

    def _fence_locked(self, lease: int | None, reason: str) -> None:
        if not self.holding or self.lease_id != lease:
            return
        self.holding = False
        self.fenced_deadline = self._writable_until
        self._writable_until = NEVER
        self.fenced_reason = reason
        self._abandon_locked()
        self._cond.notify_all()
        self.events.fire(self.on_fenced, reason)
        log.warning("coordination: %s fenced, epoch %s ends: %s", self.settings.node,
                    self.epoch, reason)

    def _abandon_locked(self) -> None:
        if self.lease_id is not None:
            self._revoke.append(self.lease_id)
        self.lease_id, self._lease_until, self.record = None, NEVER, None


__all__ = ["LeaderLease"]

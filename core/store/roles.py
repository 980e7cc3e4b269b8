"""The store's role calls (docs/replication.md, "Failover"): ``MessageStore`` inherits them.

``promote`` makes a slave the master while it runs: it stops following, its epoch file gains
``(epoch, its end)``, ``role.json`` records the role, the state mirror's files become its
state (``install_mirror``), its queue offsets are taken from its consume queues, and it
takes puts, listens for slaves and asks its peers. It is refused (``PromotionRefusedError``)
while its master still serves it, while it lacks bytes the master had answered PUT_OK for
(its confirm offset, heard through mqstore's handshake), and while its state mirror holds no
complete snapshot of the master's state, unless forced; the result says what it lacked and
which state files it installed.

``demote`` makes a master follow another store: fenced at once (NOTE [ Fencing ] in
``mqstore.roles``), ``role.json`` names the new master, and the store reopens itself as a
slave; its handshake with the new master may find records to cut (NOTE [ Rejoining ] in
``lifecycle.rejoin``), which the store records and reopens again to cut. A master that hears
of a newer master (NOTE [ Newer epochs ] in ``replication.node``) demotes itself so.

For automatic failover (``mqstore.coordination``): ``promote(epoch=...)`` from an election,
``fence(why)`` from ``on_fenced``, ``role_state.guard = coordinator.may_write``.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import weakref
from dataclasses import asdict
from typing import TYPE_CHECKING, Callable

from mqstore.append.appender import Appender
from mqstore.config import master_listen_problem
from mqstore.errors import ConfigError, PromotionRefusedError
from mqstore.format.state_record import STATE_TOPIC
from mqstore.mirror.install import MirrorIncompleteError, check_complete
from mqstore.roles import MASTER_ROLES
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR
from mqstore.storage.role_file import Cut, RoleRecord, write_role
from mqstore.store.mirror_calls import install_mirror

if TYPE_CHECKING:
    from mqstore.append.appender import ReadOnlyAppender
    from mqstore.config import StoreConfig
    from mqstore.format.ha_hello import NodeInfo
    from mqstore.lifecycle.parts import StoreParts
    from mqstore.read.reader import Reader
    from mqstore.replication import Replication
    from mqstore.replication.following import CutNeeded
    from mqstore.roles import RoleState
    from mqstore.running_flags import StoreState
    from mqstore.scheduler import Scheduler
    from mqstore.storage.commit_log import CommitLog
    from mqstore.storage.epoch_file import EpochFile
    from mqstore.view.directory_view import DirectoryView

log = logging.getLogger(__name__)
DISPATCH_TIMEOUT_S = 30.0

class RoleCalls:
    # What the calls use of the store that inherits them.
    _parts: StoreParts
    _state: StoreState
    _commit_log: CommitLog
    _reader: Reader
    _appender: Appender | ReadOnlyAppender
    view: DirectoryView
    config: StoreConfig
    clock: Callable[[], int]
    scheduler: Scheduler

    if TYPE_CHECKING:
        @property
        def root(self) -> str: ...

        def _check_open(self) -> None: ...

        def _writable(self) -> object: ...

        def close(self) -> None: ...

        def _opened(self, parts: StoreParts) -> None: ...

        def wait_dispatched(self, timeout: float = 5.0) -> None: ...

    @property
    def _role_lock(self) -> threading.RLock:
        """Role changes one at a time (made at the first, kept across reopens)."""
        lock = self.__dict__.get("_roles_lock")
        return lock if lock is not None else self.__dict__.setdefault("_roles_lock",
                                                                       threading.RLock())

    @property
    def _epochs(self) -> EpochFile:
        epochs = self._parts.epochs
        assert epochs is not None
        return epochs

    @property
    def _replication(self) -> Replication:
        replication = self._parts.replication
        assert replication is not None
        return replication

    @property
    def role_state(self) -> RoleState:
        """What the store is now (``mqstore.roles.RoleState``): its role, epoch, the master it
        follows, whether it is fenced; ``guard`` takes a write guard (coordination's
        ``may_write``)."""
        role = self._parts.role
        assert role is not None
        return role

    def set_write_guard(self, guard: Callable[[], bool] | None,
                        status: Callable[[], dict] | None = None) -> None:
        """Take puts only while ``guard()`` holds (coordination's ``may_write``), now and
        after every reopen of this store (a demotion, a rejoin); ``status()``: what
        ``role_status`` shows of the coordination (its leader, epoch, why it waits)."""
        self.__dict__["_write_guard"] = (guard, status)
        self.role_state.change(guard=guard)

    @property
    def coordination_status(self) -> dict | None:
        """What the coordination says (``set_write_guard``'s ``status``), else None."""
        status = self.__dict__.get("_write_guard", (None, None))[1]
        return status() if status is not None else None

    def role_status(self) -> dict:
        """The role, the epochs, and for a slave what it heard of its master."""
        self._check_open()
        parts = self._parts
        role = self.role_state
        epochs = parts.epochs.entries if parts.epochs is not None else []
        out = {**role.snapshot(), "configured_role": parts.config.store.role,
               "epoch": epochs[-1].epoch if epochs else 0,
               "epochs": [list(e) for e in epochs], "max_offset": self._commit_log.max_offset,
               "writable": role.writable}
        if parts.replication is not None:
            status = parts.replication.status()
            out["replication"] = {k: v for k, v in status.items() if k != "updated_ms"}
        coordination = self.coordination_status
        if coordination is not None:
            out["coordination"] = coordination
        return out

    def fence(self, why: str) -> None:
        """Stop taking puts at once (coordination's ``on_fenced``): until promoted again."""
        self._writable()
        self.role_state.fence(_fenced(why))

    def promote(self, *, epoch: int | None = None, force: bool = False,
                role: str | None = None, timeout: float = DISPATCH_TIMEOUT_S,
                elected: bool = False, accept_lag: int = 0, confirmed: int = 0) -> dict:
        """Make this slave the master now (the module docstring); ``epoch``: the epoch to be
        master in (an election's; default: one above every epoch it knows); ``role``:
        ``async_master`` or ``sync_master`` (default: the configured role when it is a master
        role, else ``async_master``); ``elected``: an election made it (coordination): the
        old master's lease ran out, so it takes no puts even while its connection lasts (a
        paused process), and the connection does not refuse the promotion; ``accept_lag``:
        lacking at most this many acknowledged bytes does not refuse it (coordination's
        ``max_lag_bytes``, which let the election choose it); ``confirmed``: an offset every
        PUT_OK of the old master covered, learnt elsewhere than from its frames (the
        cluster's, in etcd), counted as acknowledged too. Returns what was done."""
        self._writable()
        target = role or (self._parts.config.store.role
                          if self._parts.config.store.role in MASTER_ROLES else "async_master")
        if target not in MASTER_ROLES:
            raise ValueError(f"role {target!r}: a store is promoted to one of "
                             f"{', '.join(MASTER_ROLES)}")
        coordination = None if elected else self.coordination_status
        if coordination is not None:
            raise PromotionRefusedError(
                f"this node's role is decided by etcd (coordination.etcd_endpoints): an "
                f"election promotes it, not a command; it is not elected now because: "
                f"{coordination.get('waiting_for') or 'another node leads'}. To promote a "
                f"node lacking acknowledged bytes, raise coordination.max_lag_bytes on it and "
                f"restart it")
        with self._role_lock:
            state = self.role_state
            if not state.is_slave:
                return self._reelected(epoch, target)
            return self._promote(state, epoch, force, target, timeout, elected, accept_lag,
                                 confirmed)

    def _reelected(self, epoch: int | None, target: str) -> dict:
        """A master promoted again: a fenced one elected in a new epoch takes puts again."""
        state, epochs = self.role_state, self._epochs
        if epoch is None:
            raise ValueError(f"this store is {self.role_state.role} already "
                             f"(epoch {epochs.last_epoch}); only an election's newer epoch "
                             f"promotes it again")
        end = self._commit_log.max_offset
        _begin(epochs, epoch, end)
        self._record(RoleRecord(target, None, epoch, _now(), "elected again"))
        state.change(role=target, epoch=epoch, fenced=None)
        return {"role": target, "epoch": epoch, "start_offset": end, "followed": None,
                "lacked": None, "forced": False, "mirror": None}

    def _promote(self, state: RoleState, epoch: int | None, force: bool, target: str,
                 timeout: float, elected: bool = False, accept_lag: int = 0,
                 confirmed: int = 0) -> dict:
        parts, epochs = self._parts, self._epochs
        replication = self._replication
        client = replication.client
        followed = state.master
        if client is not None and client.connected and not (force or elected):
            raise PromotionRefusedError(
                f"this slave is connected to its master {followed}, which serves it: "
                f"promoting it now would make two masters; stop the master first (or force)")
        end = self._commit_log.max_offset
        lacked = _lacked(state, end, confirmed)
        if lacked is not None and not force and lacked["bytes"] > accept_lag:
            raise PromotionRefusedError(
                f"this slave's log ends at {end}, but its master {followed} had answered "
                f"PUT_OK up to {lacked['to']} (its confirm offset, as this slave last heard "
                f"it or the cluster published it): it lacks {lacked['bytes']} bytes [{end}, {lacked['to']}) of "
                f"acknowledged messages; promote it with force to accept losing them")
        problem = master_listen_problem(parts.config.server)
        if problem is not None:
            raise ConfigError(f"this slave cannot be promoted as configured: {problem}")
        # The mirror and the sign that state was shipped at all (the state topic's consume
        # queue) are dispatch's work: judged on what dispatch made of every byte received.
        self.wait_dispatched(timeout)
        mirrored = _mirror_to_install(self.root, force)
        replication.stop_following()
        self.wait_dispatched(timeout)
        if not mirrored and not force and _state_shipped(self.root):
            # Its first state records came after the look above: installed when complete.
            try:
                check_complete(self.root)
                mirrored = True
            except MirrorIncompleteError as exc:
                log.error("promoting without the state mirror: its master's first state "
                          "records came as the promotion began; %s", exc)
        end = self._commit_log.max_offset
        known = max(epochs.last_epoch, state.master_epoch)
        new_epoch = known + 1 if epoch is None else epoch
        if new_epoch <= known:
            raise ValueError(f"epoch {new_epoch} is not above {known}, the newest this store "
                             f"knows: epochs only grow")
        _begin(epochs, new_epoch, end)
        self._record(RoleRecord(target, None, new_epoch, _now(),
                                f"promoted from slave of {followed}"))
        mirror = (asdict(install_mirror(self, timeout_s=timeout))  # type: ignore[arg-type]
                  if mirrored else None)  # the mixin of MessageStore
        self._take_queue_offsets()
        state.change(role=target, master=None, epoch=new_epoch, fenced=None)
        replication.become_master()
        log.warning("promoted: this store is %s in epoch %d from commit-log offset %d (it "
                    "followed %s)%s", target, new_epoch, end, followed,
                    f"; lacking {lacked['bytes']} acknowledged bytes" if lacked else "")
        return {"role": target, "epoch": new_epoch, "start_offset": end, "followed": followed,
                "lacked": lacked, "forced": force, "mirror": mirror}

    def _take_queue_offsets(self) -> None:
        """A slave's queue-offset table is not kept as its master's records arrive: take each
        queue's end from its consume queue, under the put lock."""
        appender, reader = self._appender, self._reader
        assert isinstance(appender, Appender)  # a writable store's
        with appender.lock:
            reader.discover_queues()
            for key in list(self.view.consume_queues):
                cq = reader.queue(*key)
                if cq is not None:
                    appender.queue_offsets[key] = cq.max_offset

    def _record(self, record: RoleRecord) -> None:
        write_role(self.root, record)

    def demote(self, master: str, *, why: str | None = None, if_needed: bool = False) -> dict:
        """Make this store follow ``master`` (its ``server.ha_listen``): a master is fenced at
        once, ``role.json`` names the master, and the store reopens as its slave (a slave
        just follows the new master). ``if_needed``: nothing is done when this store is a
        slave of ``master`` already (``"unchanged": true``). Returns what was done."""
        from mqstore.config import parse_listen
        if parse_listen(master)[1] == 0:
            raise ValueError(f"master address {master!r}: port 0 cannot be dialled")
        why = why or f"demoted to follow {master}"
        with self._role_lock:  # a reopen under way (another demotion, a cut) ends first
            self._writable()
            state = self.role_state
            was = state.role
            if if_needed and state.is_slave and state.master == master:
                return {"role": "slave", "master": master, "was": was, "unchanged": True}
            if not state.is_slave:
                state.fence(_fenced(why))
            self._record(RoleRecord("slave", master, self._epochs.last_epoch, _now(), why))
            self._reopen()
        return {"role": "slave", "master": master, "was": was}

    def _reopen(self) -> None:
        """Close and open again in place (a role change that rebuilds the parts);
        replication starts again if it ran, telling peers the same client endpoint."""
        from mqstore.lifecycle.opener import Opener
        replication = self._parts.replication
        running = replication is not None and replication.started
        endpoint = replication.client_endpoint if replication is not None else ""
        self.close()
        self._state.running_flags = 0
        self._opened(Opener(self._state, self.config, self.clock, self.scheduler).open())
        if running and self._parts.replication is not None:
            self._parts.replication.client_endpoint = endpoint
            self._parts.replication.start()

    # -- what replication tells the store ----------------------------------------------------
    def _wire_roles(self) -> None:
        """Called by the facade once the parts are adopted."""
        guard = self.__dict__.get("_write_guard", (None, None))[0]
        if guard is not None and self._parts.role is not None:
            self._parts.role.guard = guard
        replication = self._parts.replication
        if replication is None:
            return
        me = weakref.ref(self)
        replication.on_cut = lambda cut: _later(me, "_cut", cut)
        replication.on_replaced = lambda why, peer, address: _later(
            me, "_replaced", why, peer, address)

    def _cut(self, cut: CutNeeded) -> None:
        """The handshake found records the master lacks: record the cut, reopen to make it."""
        with self._role_lock:
            state = self.role_state
            if not state.is_slave or state.master is None:
                return
            record = RoleRecord("slave", state.master, self._epochs.last_epoch, _now(),
                                f"rejoined {state.master}",
                                Cut(cut.point, cut.end, state.master, cut.master.last_epoch))
            self._record(record)
            self._reopen()

    def _replaced(self, why: str, peer: NodeInfo, address: str) -> None:
        """A newer master exists: follow it when its replication address is known."""
        peers = self._parts.config.server.ha_peers
        if address in peers:
            self.demote(address, why=why)
        elif peers:
            from mqstore.replication.access import HAAccess
            from mqstore.replication.peers import check
            replication = self._replication
            check(peers, HAAccess.for_slave(self._parts.config.server), replication.node,
                  replication.settings.heartbeat_s)  # it demotes through on_replaced
        elif self.__dict__.get("_replaced_told") != peer.last_epoch:  # once per epoch
            self.__dict__["_replaced_told"] = peer.last_epoch
            log.error("replication: %s; its replication address is unknown (no "
                      "server.ha_peers): `mqstore role demote --master HOST:PORT` makes this "
                      "store follow it", why)


def _begin(epochs: EpochFile, epoch: int, end: int) -> None:
    """Start ``epoch`` at ``end``. When the last epoch starts there too it holds no record of
    this log: the new epoch takes its place (an entry per start offset, as the file needs);
    the span before it, which other stores share, is unchanged, so their consistent point
    with this log is too."""
    entries = epochs.entries
    if entries and entries[-1].start == end and epoch > entries[-1].epoch:
        epochs.replace([*entries[:-1], type(entries[-1])(epoch, end)])
    else:
        epochs.append(epoch, end)


def _lacked(state: RoleState, end: int, confirmed: int) -> dict | None:
    confirmed = max(state.master_confirmed, confirmed)
    if confirmed <= end:
        return None
    return {"from": end, "to": confirmed, "bytes": confirmed - end}


def _later(ref: weakref.ref, name: str, *args: object) -> None:
    """Run ``ref().name(*args)`` on a thread of its own: replication's threads call it, and
    what it does (a reopen) stops them."""
    def run() -> None:
        store = ref()
        if store is None:
            return
        try:
            getattr(store, name)(*args)
        except Exception:  # noqa: BLE001 - logged; the store stays as it was
            log.exception("replication: %s failed", name.strip("_"))
    threading.Thread(target=run, name=f"mqstore-role-{name.strip('_')}", daemon=True).start()


def _mirror_to_install(root: str, force: bool) -> bool:
    """Whether the promotion installs the state mirror of the store in ``root`` (call once
    dispatch covers what it received); ``PromotionRefusedError`` when its master shipped
    state but the mirror holds no complete snapshot of it, unless ``force``."""
    if not _state_shipped(root):
        log.warning("promoting with no state mirror to install: the master shipped no state "
                    "record (it had no state file)")
        return False
    try:
        check_complete(root)
    except MirrorIncompleteError as exc:
        if not force:
            raise PromotionRefusedError(
                f"{exc}; promoted without it, the store would redeliver what its master's "
                f"consumer groups had acknowledged and lose its topic configs: let the "
                f"slave follow until a snapshot arrives (the master ships one whenever a "
                f"slave connects), or promote with force to start from the slave's own "
                f"state") from None
        log.warning("promoting without the state mirror (forced): %s", exc)
        return False
    return True


def _state_shipped(root: str) -> bool:
    """Whether this store ever received a state record: a master with no state file ships
    none, and then nothing is mirrored and nothing is lacking."""
    return os.path.isdir(os.path.join(root, CONSUME_QUEUE_DIR, STATE_TOPIC))


def _fenced(why: str) -> str:
    """A fencing reason as refusals print it: ``fenced: <why>``, the word once."""
    return why if why.startswith("fenced") else f"fenced: {why}"


def _now() -> int:
    return int(time.time() * 1000)


__all__ = ["RoleCalls"]

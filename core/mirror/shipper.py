"""The master's side of the state mirror: a thread of the writer process that ships the state
files' changes as records of the system topic (NOTE [ State mirror ]).

Each pass takes the paths the change feed noted since the last one (``storage.state_feed``),
finds their units (``storage.state_files``), reads each under its owner's lock
(``unit_read``) and puts the operations through the store's put path (``put_state``: queue 0
of ``rmq_sys_MQSTORE_STATE``, past topic configs), at most about ``BATCH_BYTES`` a put. A pass
runs every ``interval_s`` (changes of other processes), at once when this process changed a
state file (the feed's listener), and whenever ``ship_now`` asks (``wait``: in the caller's
thread). What a put did not store is shipped again whole by a snapshot in the next pass.

A snapshot (every state file as a ``put``, between ``snapshot-begin`` and ``snapshot-end``,
the end naming every path) is shipped when the shipper starts and after ``request_snapshot``
(a slave connected: one that started from the master's last segment, or was away, gets
complete state); the feed is emptied first, since the snapshot carries every file. A store
with no state file at all ships nothing (its log holds only what was put), until its first
state file appears: that brings the snapshot.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from typing import Callable, Sequence

from mqstore.format.state_record import (
    SNAPSHOT_BEGIN, SNAPSHOT_END, STATE_QUEUE, STATE_TOPIC, StateOp, properties_of,
    snapshot_end_body,
)
from mqstore.message import MessageBatch
from mqstore.mirror.unit_read import Ident, changes, unit_locked
from mqstore.storage import state_feed
from mqstore.storage.state_files import Unit, unit_of, units_in

log = logging.getLogger(__name__)

BATCH_BYTES = 1 << 20  # a put carries about this much (more for one large chunk)
RETRY_PAUSE_S = 1.0
PASS_POLL_S = 0.05  # a waiting ship_now looks again this often (it is woken when a pass ends)
JOIN_S = 10.0


class StateShipper:
    """Ships the state of the store in ``root``. ``put_state(batch)`` puts a
    ``MessageBatch`` of the state topic and returns its ``BatchPutResult``;
    ``chunk_bytes`` is the most body one record carries; ``epoch()`` the master's epoch
    (None: none), named in every snapshot-end."""

    def __init__(self, root: str, put_state: Callable, *, interval_s: float, chunk_bytes: int,
                 epoch: Callable[[], int | None] = lambda: None) -> None:
        self.root = root
        self._put_state = put_state
        self.interval_s = interval_s
        self.chunk_bytes = max(1, chunk_bytes)
        self._epoch = epoch
        self._ids = itertools.count(time.time_ns())
        self._shipped: dict[str, dict[str, Ident]] = {}  # unit name -> rel -> identity
        self._units: dict[str, Unit] = {}
        self._feed: state_feed.FeedReader | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._passing = threading.Lock()  # one pass at a time: the thread's or a caller's
        self._requested = self._done = 0
        self._snapshot_due = True
        self._thread: threading.Thread | None = None
        self.snapshots = 0  # completed, for status and tests
        self.shipped_records = 0
        self.shipped_bytes = 0
        self.last_error: str | None = None

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> None:
        self._feed = state_feed.FeedReader(self.root)
        state_feed.listen(self.root, self._wake.set)
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="mqstore-state-shipper",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        state_feed.unlisten(self.root, self._wake.set)
        if self._thread is not None:
            self._thread.join(JOIN_S)
            self._thread = None
        with self._cond:
            self._cond.notify_all()
        with self._passing:  # a caller's pass ends before the feed goes
            if self._feed is not None:
                self._feed.close()
                self._feed = None

    def request_snapshot(self) -> None:
        """Ship every state file in the next pass (a slave connected)."""
        self._snapshot_due = True
        self._wake.set()

    def ship_now(self, wait: bool = True, timeout_s: float | None = None) -> bool:
        """Ship what changed so far now. With ``wait``, return once every change noted before
        this call is put (under sync_master, the put waited for a slave): True, or False
        when the shipper stopped, a put failed or ``timeout_s`` passed first. The caller
        runs the pass itself when no other pass runs (no hand-over to the shipper's thread),
        else waits for that one; callers arriving together share a pass."""
        with self._cond:
            self._requested += 1
            ticket = self._requested
        if not wait:
            self._wake.set()
            return True
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while not self._stop.is_set():
            if self._done >= ticket:
                return True
            if self._passing.acquire(blocking=False):
                try:
                    if self._done < ticket and not self._stop.is_set() \
                            and not self._one_pass():
                        return False
                finally:
                    self._passing.release()
                continue
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return False
            with self._cond:  # another pass runs: it may cover this ticket
                self._cond.wait(PASS_POLL_S if left is None else min(left, PASS_POLL_S))
        return False

    # -- the passes ----------------------------------------------------------------------------
    def _run(self) -> None:
        while not self._stop.is_set():
            self._wake.clear()  # before the pass: a change noted during it brings the next
            with self._passing:
                if self._stop.is_set():
                    return
                ok = self._one_pass()
            if not ok:
                self._stop.wait(RETRY_PAUSE_S)
                continue
            self._wake.wait(self.interval_s)

    def _one_pass(self) -> bool:
        """One pass (the caller holds ``_passing``); False when it failed (the next pass
        ships every file again)."""
        with self._cond:
            target = self._requested
        try:
            self._pass()
            self.last_error = None
        except Exception as exc:  # a full disk, a refused put: snapshot when it works again
            self._snapshot_due = True
            error = f"{type(exc).__name__}: {exc}"
            if error != self.last_error:  # once per cause, not once per retry
                log.error("state mirror: shipping failed (%s); every state file is shipped "
                          "again once it works", error)
            self.last_error = error
            return False
        with self._cond:
            self._done = max(self._done, target)
            self._cond.notify_all()
        return True

    def _pass(self) -> None:
        feed = self._feed
        assert feed is not None
        if self._snapshot_due or feed.full():
            feed.restart()
            units = units_in(self.root)
            if any(unit.member_files(self.root) for unit in units):
                self._snapshot_due = False
                self._snapshot(units)
            # else the store has no state yet: nothing to ship, and its first state file
            # brings the snapshot (a log holding only messages stays as it was)
            return
        units: dict[str, Unit] = {}
        for rel in feed.read():
            found = unit_of(rel)
            if found is not None:
                units.setdefault(found[0].name, found[0])
        self._ship_units(list(units.values()), [])

    def _snapshot(self, units: list[Unit]) -> None:
        sid = next(self._ids)
        self._shipped.clear()
        begin = StateOp(SNAPSHOT_BEGIN, op_id=sid)
        self._ship_units(units, [begin])
        paths = sorted(rel for files in self._shipped.values() for rel in files)
        self._put([StateOp(SNAPSHOT_END, op_id=sid, epoch=self._epoch(),
                           body=snapshot_end_body(paths))])
        self.snapshots += 1
        log.info("state mirror: snapshot %d shipped (%d files)", sid, len(paths))

    def _ship_units(self, units: Sequence[Unit], ops: list[StateOp]) -> None:
        """Read each unit and put what changed, about ``BATCH_BYTES`` a put; the shipped
        identities move only once their put stored."""
        pending: list[tuple[Unit, dict[str, Ident | None]]] = []
        size = sum(len(op.body) for op in ops)
        for unit in units:
            shipped = self._shipped.get(unit.name, {})
            with unit_locked(self.root, unit):
                found = changes(self.root, unit, shipped, lambda: next(self._ids))
            if not found:
                continue
            ops += [op for c in found for op in self._chunks(c.op)]
            pending.append((unit, {c.op.path: c.ident for c in found}))
            size += sum(len(c.op.body) for c in found)
            if size >= BATCH_BYTES:
                self._put(ops)
                self._adopt(pending)
                ops, pending, size = [], [], 0
        if ops:
            self._put(ops)
            self._adopt(pending)

    def _adopt(self, pending) -> None:
        for unit, idents in pending:
            files = self._shipped.setdefault(unit.name, {})
            for rel, ident in idents.items():
                if ident is None:
                    files.pop(rel, None)
                else:
                    files[rel] = ident
            if not files:
                self._shipped.pop(unit.name, None)

    def _chunks(self, op: StateOp) -> list[StateOp]:
        """``op`` cut so that no record carries more than ``chunk_bytes`` of body."""
        step = self.chunk_bytes
        if len(op.body) <= step:
            return [op]
        body = memoryview(op.body)
        return [StateOp(op.kind, op.path, pos=op.pos + at, op_id=op.op_id, total=op.total,
                        body=bytes(body[at:at + step])) for at in range(0, len(body), step)]

    def _put(self, ops: list[StateOp]) -> None:
        result = self._put_state(MessageBatch(
            topic=STATE_TOPIC, bodies=[op.body for op in ops], queue_ids=STATE_QUEUE,
            properties=[properties_of(op) for op in ops]))
        if not result.status.stored:
            raise OSError(f"the store refused the state records: {result.status.value}"
                          f"{': ' + result.error if result.error else ''}")
        self.shipped_records += len(ops)
        self.shipped_bytes += sum(len(op.body) for op in ops)

    def status(self) -> dict:
        return {"snapshots": self.snapshots, "records": self.shipped_records,
                "bytes": self.shipped_bytes, "last_error": self.last_error}

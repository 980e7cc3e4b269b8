"""Transactions: the half messages a writable store holds open, their ends, and RocketMQ's
transaction checker (``TransactionalMessageCheckService``), a thread of the writer process
beside the schedule (``runtime.schedule``).

The records are RocketMQ's (``format.transaction``, ``append.transactions``). The thread
tails the half queue and the op queue (both are consume queues, so what a put, a slave's
replica or a recovery wrote is seen alike) and keeps the open transactions in memory: a half
is open while no op record names its queue offset and no later half of the same transaction
(same ``UNIQ_KEY``: a check's re-appended copy) supersedes it. Every tick it checks each open
transaction whose age (store clock, from its born time, as RocketMQ) reached the transaction
timeout (or the message's ``CHECK_IMMUNITY_TIME_IN_SECONDS``) and whose last check is a check
interval old: it re-appends the half with ``TRANSACTION_CHECK_TIMES`` + 1, then asks the
checker (the endpoint sends the producer a ``RecoverOrphanedTransactionCommand``). One checked
``check_max`` times already is discarded instead: written to ``TRANS_CHECK_MAX_TIME_TOPIC``
and counted, as 4.9.8 does.

NOTE [ Transaction progress ]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
The checker's progress is where RocketMQ keeps it, so either reads the other's store: the
consumer offsets of group ``CID_RMQ_SYS_TRANS`` over the half queue (the first half still
open) and the op queue (the first op record naming a half at or past that one), which the
state mirror ships to slaves. They only bound what a start reads again: whether a half is open
is decided by the records themselves (op records and superseding copies), so a kill between a
put and the progress's write re-reads a little and decides the same. An end writes the real
message and the op record in one put (all or nothing). A discard killed before its progress
was written is discarded again at the next start (one more record in the discard topic).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Callable, Protocol

from mqstore import log_limit
from mqstore.append import transactions as records
from mqstore.append.encoding import Rejected
from mqstore.format.transaction import (
    HALF_TOPIC, OP_TOPIC, PROPERTY_CHECK_IMMUNITY_S, PROPERTY_PRODUCER_GROUP, check_times,
    op_offsets,
)
from mqstore.message import BatchPutResult, PutStatus
from mqstore.runtime.ticking import MasterTicker

log = logging.getLogger(__name__)
log_limit.limit(log, level=logging.WARNING)

TICK_S = 0.1
RETRY_S = 1.0
READ_BATCH = 1024
_NEVER = 1 << 62


class TransactionEndedError(ValueError):
    """The transaction an end names is not open (committed, rolled back or discarded)."""


class Progress(Protocol):
    """Where the checker's progress lives (NOTE [ Transaction progress ])."""

    def load(self) -> tuple[int | None, int | None]: ...

    def save(self, half: int, op: int) -> None: ...


@dataclass(frozen=True)
class Settings:
    timeout_ms: int
    check_interval_ms: int
    check_max: int


@dataclass
class OpenTransaction:
    """One open transaction, as its latest half record says."""

    message_id: str  # UNIQ_KEY (what clients name it by), or "@<offset>" without one
    producer_group: str
    topic: str  # where a commit puts it
    queue_offset: int  # of the latest half record in the half queue
    phys_offset: int
    born_timestamp: int
    store_timestamp: int
    checks: int
    immunity_ms: int | None

    def due_at(self, settings: Settings) -> int:
        """When (store clock) it is next checked: once the timeout has passed since its
        birth, and a check interval since its last check."""
        timeout = settings.timeout_ms if self.immunity_ms is None else self.immunity_ms
        first = self.born_timestamp + timeout
        if self.checks == 0:
            return first
        return max(first, self.store_timestamp + settings.check_interval_ms)


@dataclass(frozen=True)
class TransactionCheck:
    """A check-back the checker asks for: the re-appended half (``message``, a
    ``StoredMessage``) of ``producer_group``'s transaction ``message_id``."""

    producer_group: str
    message_id: str
    message: object


def _open_of(msg) -> OpenTransaction:
    props = msg.properties
    key = msg.uniq_key or f"@{msg.phys_offset}"
    immunity = props.get(PROPERTY_CHECK_IMMUNITY_S, "")
    return OpenTransaction(
        key, props.get(PROPERTY_PRODUCER_GROUP, ""), props.get("REAL_TOPIC", ""),
        msg.queue_offset, msg.phys_offset, msg.born_timestamp, msg.store_timestamp,
        check_times(props),
        int(immunity) * 1000 if immunity.isdecimal() and len(immunity) < 10 else None)


class TransactionService:
    """The open transactions of one writable store and their checker (module docstring)."""

    def __init__(self, *, reader, commit_log, appender, put_ctx, clock: Callable[[], int],
                 role, dispatched: Callable[[], int], settings: Settings,
                 progress: Progress) -> None:
        self.reader = reader
        self.commit_log = commit_log
        self.appender = appender
        self.put_ctx = put_ctx
        self.clock = clock
        self.role = role
        self.dispatched = dispatched
        self.settings = settings
        self.progress = progress
        # Who is asked (each endpoint's producers); every one, each ignoring a check no
        # producer of its own can answer.
        self.checkers: tuple[Callable[[TransactionCheck], None], ...] = ()
        self.open: dict[str, OpenTransaction] = {}
        self._done: dict[int, int] = {}  # half queue offset -> the op record's queue offset
        self._half_read = self._op_read = 0
        self._next_due = _NEVER  # the store time the first open transaction is due
        self._saved: tuple[int, int] | None = None
        self.recovered = False
        self.counts = {"committed": 0, "rolled_back": 0, "checks": 0, "discarded": 0}
        self.ticks = 0
        self._lock = threading.RLock()
        self._recover_end: int | None = None
        self._ticker = MasterTicker("mqstore-transactions", self.run_once, role=role,
                                    on_slave=self._on_slave, log=log, what="transactions",
                                    tick_s=TICK_S, retry_s=RETRY_S)

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        self._ticker.stop()

    def _on_slave(self) -> None:
        self.recovered = False  # a master again reads everything anew

    def run_once(self) -> None:
        """Read what the queues got, check what is due, record the progress."""
        if not self.recovered and not self.recover():
            return
        self.tail()
        for check in self._check_due():
            self._ask(check)
        self._save_progress()
        self.ticks += 1

    # -- reading the queues ---------------------------------------------------------------------
    def recover(self) -> bool:
        """Start from the recorded progress, once dispatch reached the log's end at start."""
        with self._lock:
            if self._recover_end is None:
                self._recover_end = self.commit_log.max_offset
            if self.dispatched() < self._recover_end:
                return False
            self._recover_end = None
            half, op = self.progress.load()
            self.open, self._done, self._next_due = {}, {}, _NEVER
            self._half_read = max(half or 0, self._min_offset(HALF_TOPIC))
            self._op_read = max(op or 0, self._min_offset(OP_TOPIC))
            # None recorded reads as 0: a store that never held a half writes no progress.
            self._saved = (half or 0, op or 0)
            self.recovered = True
            self.tail()
            return True

    def _min_offset(self, topic: str) -> int:
        return self.reader.min_offset(topic, 0) if self.reader.queue_ids(topic) else 0

    def tail(self) -> None:
        """Take in the op records and halves written since the last call."""
        with self._lock:
            while self._tail_ops() >= READ_BATCH:
                pass
            while self._tail_halves() >= READ_BATCH:
                pass

    def _tail_ops(self) -> int:
        batch = self.reader.read(OP_TOPIC, 0, self._op_read, READ_BATCH)
        if batch is None or not len(batch):
            self._op_read = max(self._op_read, batch.next_begin_offset if batch else 0)
            return 0
        by_offset = {t.queue_offset: t.message_id for t in self.open.values()}
        for i in range(len(batch)):
            try:
                closed = op_offsets(batch.body(i))
            except ValueError as exc:
                log.error("transactions: op record %d passed over: %s",
                          int(batch.queue_offsets[i]), exc)
                continue
            for half in closed:  # a half named twice (RocketMQ may write it so) is one end
                self._done.setdefault(half, int(batch.queue_offsets[i]))
                key = by_offset.pop(half, None)
                if key is not None:
                    self.open.pop(key, None)
        self._op_read = int(batch.next_begin_offset)
        return len(batch)

    def _tail_halves(self) -> int:
        batch = self.reader.read(HALF_TOPIC, 0, self._half_read, READ_BATCH)
        if batch is None or not len(batch):
            self._half_read = max(self._half_read, batch.next_begin_offset if batch else 0)
            return 0
        for i in range(len(batch)):
            offset = int(batch.queue_offsets[i])
            msg = batch.message(i)
            if offset in self._done:
                self.open.pop(msg.uniq_key or f"@{msg.phys_offset}", None)
                continue
            t = _open_of(msg)
            known = self.open.get(t.message_id)
            if known is None or known.queue_offset <= offset:
                self.open[t.message_id] = t  # a later copy supersedes the earlier
                self._next_due = min(self._next_due, t.due_at(self.settings))
        self._half_read = int(batch.next_begin_offset)
        return len(batch)

    # -- ending ---------------------------------------------------------------------------------
    def end(self, phys_offset: int, commit: bool) -> BatchPutResult:
        """Commit or roll back the transaction whose half (any of its copies) starts at
        ``phys_offset``: a commit puts the real message and the op record in one put, a
        rollback only the op record. ValueError when no half starts there,
        ``TransactionEndedError`` when its transaction is not open. The result's first row is
        the committed message's (a rollback's: the op record's)."""
        half = self.reader.message_at(phys_offset)
        if half is None or half.topic != HALF_TOPIC:
            raise ValueError(f"no half message starts at commit-log offset {phys_offset} "
                             f"(a transaction is ended by its half's offset)")
        with self._lock:
            if not self.recovered and (self.role.refusal() is not None or not self.recover()):
                return BatchPutResult.rejected(PutStatus.SERVICE_NOT_AVAILABLE, (
                    "the store's transactions are not ready (a slave, or dispatch is still "
                    "catching up after the open); try again"))
            # No read of the queues: the halves not read yet cannot have been checked, and
            # every op record since the start is this service's own (``_done``).
            key = half.uniq_key or f"@{half.phys_offset}"
            t = self.open.get(key)
            if t is None:
                if half.queue_offset < self._half_read or half.queue_offset in self._done:
                    raise TransactionEndedError(
                        f"transaction {key} (half at offset {phys_offset}) is not open: it "
                        f"was committed, rolled back or discarded")
                t = _open_of(half)
            latest = half if t.phys_offset == half.phys_offset else self.reader.message_at(
                t.phys_offset)
            items = [records.op_record(t.queue_offset, self.put_ctx)]
            if commit:
                items.insert(0, records.committed(latest, self.put_ctx))
            result = self.appender.put_copies(items)
            if result.status.stored:
                self.open.pop(key, None)
                self._done[t.queue_offset] = int(result.queue_offsets[-1])
                self.counts["committed" if commit else "rolled_back"] += 1
            return result

    # -- checking -------------------------------------------------------------------------------
    def _check_due(self) -> list[TransactionCheck]:
        asks: list[TransactionCheck] = []
        with self._lock:
            now = self.clock()
            if now < self._next_due:
                return asks  # nothing is due: no pass over every open transaction
            settings = self.settings
            due = sorted((t for t in self.open.values() if t.due_at(settings) <= now),
                         key=lambda t: t.queue_offset)
            for t in due:
                latest = self.reader.message_at(t.phys_offset)
                if latest is None:
                    continue
                if t.checks >= self.settings.check_max:
                    self._discard(t, latest)
                    continue
                try:
                    item = records.rechecked(latest, self.put_ctx)
                    records.committed(latest, self.put_ctx)  # it could be committed
                except (Rejected, ValueError) as exc:  # NotACopy among them: no real topic
                    # Never to be committed: no one is asked, it is let go (logged).
                    log.error("transactions: %s (half at %d) passed over: %s", t.message_id,
                              t.phys_offset, getattr(exc, "reason", exc))
                    self.open.pop(t.message_id, None)
                    continue
                result = self.appender.put_copies([item])
                if not result.status.stored:
                    log.warning("transactions: re-appending %s refused (%s: %s)",
                                t.message_id, result.status.value, result.error)
                    break
                copy = self.reader.message_at(int(result.phys_offsets[0]))
                if copy is None:
                    continue
                self.open[t.message_id] = _open_of(copy)
                self.counts["checks"] += 1
                asks.append(TransactionCheck(t.producer_group, t.message_id, copy))
            self._next_due = min((t.due_at(settings) for t in self.open.values()),
                                 default=_NEVER)
        return asks

    def _discard(self, t: OpenTransaction, latest) -> None:
        result = self.appender.put_copies([records.discarded(latest, self.put_ctx)])
        if result.status.stored:
            self.open.pop(t.message_id, None)
            self.counts["discarded"] += 1
            log.warning("transactions: %s of producer group %s discarded after %d checks "
                        "(store.transaction_check_max)", t.message_id, t.producer_group,
                        t.checks)

    def _ask(self, check: TransactionCheck) -> None:
        # With none, the half was re-appended all the same, as RocketMQ does.
        for checker in self.checkers:
            try:
                checker(check)
            except Exception:
                log.exception("transactions: a checker failed on %s", check.message_id)

    # -- progress (NOTE [ Transaction progress ]) ---------------------------------------------
    def _save_progress(self) -> None:
        with self._lock:
            half = min((t.queue_offset for t in self.open.values()), default=self._half_read)
            for done in [h for h in self._done if h < half]:
                del self._done[done]
            op = min(self._done.values(), default=self._op_read)
        if self._saved != (half, op):
            self.progress.save(half, op)
            self._saved = (half, op)

    # -- what callers see -----------------------------------------------------------------------
    def open_transactions(self) -> list[OpenTransaction]:
        """The open transactions (none known yet on a slave, or while dispatch catches up
        after an open: ``status()["running"]`` says when they are)."""
        with self._lock:
            if not self.recovered and self.role.refusal() is None:
                self.recover()
            if self.recovered:
                self.tail()
            return sorted(self.open.values(), key=lambda t: t.queue_offset)

    def status(self) -> dict:
        """``running``, ``open`` transactions, counts (``committed``, ``rolled_back``,
        ``checks`` asked, ``discarded`` after the check limit), the ``progress`` recorded
        (half and op queue offsets) and ``ticks`` run."""
        with self._lock:
            return {"running": self.recovered, "open": len(self.open), **self.counts,
                    "progress": self._saved, "ticks": self.ticks}


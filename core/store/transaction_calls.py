"""The store's transaction calls (docs/transactions.md): ``MessageStore`` inherits them.

A half is put as any message carrying ``TRAN_MSG=true`` (and its producer group in
``PGROUP``), as RocketMQ's producers send it; ``end_transaction`` commits or rolls it back;
``open_transactions`` lists what is neither; ``set_transaction_checker`` names who is asked
about the transactions left open past the transaction timeout. They delegate to
``runtime.transactions.TransactionService``, which a writable store runs in its writer; its
progress is the consumer offsets of ``CID_RMQ_SYS_TRANS`` (NOTE [ Transaction progress ]).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

from mqstore.format.transaction import HALF_TOPIC, OP_TOPIC, SYSTEM_GROUP
from mqstore.runtime.transactions import Settings, TransactionService

if TYPE_CHECKING:
    from mqstore.consumer.offsets import ConsumerOffsets
    from mqstore.lifecycle.parts import StoreParts
    from mqstore.message import BatchPutResult
    from mqstore.runtime.transactions import OpenTransaction, TransactionCheck


class OffsetsProgress:
    """The checker's progress as group ``CID_RMQ_SYS_TRANS``'s offsets of the half and op
    queues (queue 0 of each), where RocketMQ's broker keeps it."""

    def __init__(self, offsets: Callable[[], "ConsumerOffsets"]) -> None:
        self._offsets = offsets  # the store's current one (a promotion replaces it)

    def load(self) -> tuple[int | None, int | None]:
        offsets = self._offsets()
        return (offsets.offsets(HALF_TOPIC, SYSTEM_GROUP).get(0),
                offsets.offsets(OP_TOPIC, SYSTEM_GROUP).get(0))

    def save(self, half: int, op: int) -> None:
        offsets = self._offsets()
        offsets.commit(HALF_TOPIC, SYSTEM_GROUP, {0: half})
        offsets.commit(OP_TOPIC, SYSTEM_GROUP, {0: op})


def transaction_side(parts: "StoreParts", offsets: Callable[[], "ConsumerOffsets"]
                     ) -> TransactionService | None:
    """A writable store's transaction service (None for a read-only one), not yet started."""
    if parts.runtime is None:
        return None
    store = parts.config.store
    appender = parts.appender
    return TransactionService(
        reader=parts.reader, commit_log=parts.commit_log, appender=appender,
        put_ctx=appender.put_ctx, clock=parts.clock, role=parts.role,  # type: ignore[union-attr]
        dispatched=parts.runtime.dispatched,
        settings=Settings(store.transaction_timeout_ms, store.transaction_check_interval_ms,
                          store.transaction_check_max),
        progress=OffsetsProgress(offsets))


class TransactionCalls:
    # What the calls use of the store that inherits them.
    _transactions: TransactionService | None = None
    _transaction_checkers: tuple[Callable[[TransactionCheck], None], ...] = ()

    if TYPE_CHECKING:
        def _check_open(self) -> None: ...

    def _transaction_service(self) -> TransactionService:
        self._check_open()
        if self._transactions is None:
            raise PermissionError("a read-only store ends no transactions (open it writable)")
        return self._transactions

    def end_transaction(self, half_offset: int, commit: bool) -> BatchPutResult:
        """Commit (``commit=True``) or roll back the transaction whose half message (or any
        copy a check re-appended) starts at commit-log offset ``half_offset``. A commit puts
        the message in its real topic (sysflag COMMIT, ``prepared_tx_offset`` the half's
        offset) and the op record in one put; a rollback only the op record. The result's
        first row is the committed message's. ValueError when no half starts there;
        ``runtime.transactions.TransactionEndedError`` when the transaction is not open."""
        if isinstance(half_offset, bool) or not isinstance(half_offset, int) or half_offset < 0:
            raise ValueError(f"half_offset {half_offset!r} must be a commit-log offset (int >= 0)")
        return self._transaction_service().end(half_offset, bool(commit))

    def open_transactions(self) -> list[OpenTransaction]:
        """The transactions neither committed, rolled back nor discarded, of the halves
        dispatch has reached (``wait_dispatched`` first to see a put's), oldest first: each
        with its ``message_id``, ``producer_group``, ``topic``, latest half's offsets, and
        ``checks`` so far."""
        return self._transaction_service().open_transactions()

    def set_transaction_checker(self, checker: Callable[[TransactionCheck], None] | None
                                ) -> None:
        """Who is asked about a transaction left open past the timeout (called in the
        checker's thread with a ``TransactionCheck``; it answers by ``end_transaction``),
        instead of any other; None: no one. It stays through a role change that rebuilds the
        store's parts."""
        self._set_checkers(() if checker is None else (checker,))

    def add_transaction_checker(self, checker: Callable[[TransactionCheck], None]) -> None:
        """One more checker, asked beside the others (each endpoint asks its producers). A
        store between its parts (a role change) or read-only keeps it for its next parts."""
        self._set_checkers((*self._transaction_checkers, checker))

    def remove_transaction_checker(self, checker: Callable[[TransactionCheck], None]
                                   ) -> None:
        self._set_checkers(tuple(c for c in self._transaction_checkers if c != checker))

    def _set_checkers(self, checkers: tuple) -> None:
        # Kept by the store, not only by its parts: a role change closes the parts and opens
        # new ones (an endpoint may name its checker meanwhile), and the new checker service
        # takes them after it is installed. Set first, then read the service: whichever way
        # this interleaves with an open, the installed service ends with these.
        self._transaction_checkers = checkers
        service = self._transactions
        if service is not None:
            service.checkers = checkers

    def transaction_status(self) -> dict | None:
        """The checker's counts (``open``, ``committed``, ``rolled_back``, ``checks``,
        ``discarded``); None for a read-only store."""
        self._check_open()
        return None if self._transactions is None else self._transactions.status()

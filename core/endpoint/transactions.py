"""Transactions over gRPC (docs/transactions.md): ``EndTransaction``, and the store checker's
check-backs sent to a live producer over its Telemetry stream as a
``RecoverOrphanedTransactionCommand``, as the Apache proxy does.

A transactional send (MessageType.TRANSACTION) is a half put with ``TRAN_MSG=true`` and, as
the proxy does, the topic as its producer group (``PGROUP``): 5.x producers have no group, and
any producer publishing the topic may answer for it. Its ``transaction_id`` is the half's
offset message id (store host and commit-log offset, 32 hex digits), what a 4.x broker
answers as a half's ``offsetMsgId``; an end names it with the message id, and both must
agree with the half. A check-back goes to one of the producers whose Telemetry settings
publish the half's topic (round robin); with none connected it is only logged, and the checker
asks again an interval later, as RocketMQ does.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import dataclass, field
from types import SimpleNamespace

from mqstore.endpoint import wire
from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2
from mqstore.endpoint.resources import full_name, resource
from mqstore.endpoint.status import EndpointError, ok, put_status, status
from mqstore.format.hosts import Host
from mqstore.format.record import offset_msg_id
from mqstore.runtime.transactions import TransactionEndedError

log = logging.getLogger(__name__)
_COMMIT = definition_pb2.TransactionResolution.COMMIT
_ROLLBACK = definition_pb2.TransactionResolution.ROLLBACK
_ID_DIGITS = 32  # an IPv4 store host's offset message id


def transaction_id(store_host: Host, half_offset: int) -> str:
    return offset_msg_id(store_host, half_offset)


def half_offset(text: str) -> int:
    """The half's commit-log offset a ``transaction_id`` names; INVALID_TRANSACTION_ID naming
    it when it is not one this endpoint gives."""
    if len(text) not in (_ID_DIGITS, _ID_DIGITS + 24) or not all(
            c in "0123456789ABCDEFabcdef" for c in text):
        raise EndpointError(Code.INVALID_TRANSACTION_ID, (
            f"transaction_id {text[:80]!r} is not one this endpoint gave (the half's offset "
            f"message id: {_ID_DIGITS} hex digits)"))
    return int(text[-16:], 16)


@dataclass(eq=False)
class _Stream:
    context: object
    topics: frozenset[str]
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class Producers:
    """The producers' Telemetry streams by the topics their settings publish. Loop thread."""

    def __init__(self) -> None:
        self._streams: dict[str, _Stream] = {}
        self._turn = itertools.count()

    def stream(self, client_id: str, context) -> _Stream:
        """The stream of ``context`` (its write lock is held around every write on it)."""
        known = self._streams.get(client_id)
        if known is None or known.context is not context:
            known = self._streams[client_id] = _Stream(context, frozenset())
        return known

    def publishing(self, client_id: str, context, settings) -> _Stream:
        s = self.stream(client_id, context)
        if settings.HasField("publishing"):
            s.topics = frozenset(full_name(t) for t in settings.publishing.topics)
        return s

    def gone(self, client_id: str, context) -> None:
        known = self._streams.get(client_id)
        if known is not None and known.context is context:
            del self._streams[client_id]

    def pick(self, topic: str) -> _Stream | None:
        live = [s for s in self._streams.values() if topic in s.topics]
        return live[next(self._turn) % len(live)] if live else None


class Transactions:
    """EndTransaction and the check-backs of one endpoint's store."""

    def __init__(self, store, producers: Producers, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._producers = producers
        self._loop = loop
        self.asked = self.unasked = 0

    # -- EndTransaction -----------------------------------------------------------------------
    async def end(self, request) -> service_pb2.EndTransactionResponse:
        offset = half_offset(request.transaction_id)
        resolution = request.resolution
        if resolution not in (_COMMIT, _ROLLBACK):
            # The producer does not know yet (its checker answered neither): the transaction
            # stays open and is checked again.
            return service_pb2.EndTransactionResponse(status=ok())
        result = await self._loop.run_in_executor(
            None, self._end, offset, request.message_id, resolution == _COMMIT)
        return service_pb2.EndTransactionResponse(status=result)

    def _end(self, offset: int, message_id: str, commit: bool):
        store = self._store
        half = store.message_at(offset)
        if half is None or half.uniq_key != message_id:
            return status(Code.INVALID_TRANSACTION_ID, (
                f"no half message of message id {message_id!r} at the offset transaction id "
                f"names ({offset})"))
        try:
            r = store.end_transaction(offset, commit)
        except (ValueError, TransactionEndedError) as exc:
            return status(Code.INVALID_TRANSACTION_ID, str(exc))
        return put_status(r.status, r.error)

    # -- check-backs (the store's checker thread calls ``check``) ----------------------------
    def check(self, check) -> None:
        try:
            self._loop.call_soon_threadsafe(self._send, check)
        except RuntimeError:
            pass  # the loop ended: the endpoint stopped

    def _send(self, check) -> None:
        msg = check.message
        props = msg.properties
        topic = props.get("REAL_TOPIC", "")
        stream = self._producers.pick(check.producer_group or topic)
        if stream is None:
            self.unasked += 1
            log.info("no producer of %s is connected to check transaction %s; it is asked "
                     "again after the check interval", check.producer_group, check.message_id)
            return
        real_qid = props.get("REAL_QID", "0")
        out = wire.to_wire(SimpleNamespace(full=msg, queue_id=int(real_qid) if real_qid.isdecimal()
                                           else 0, queue_offset=msg.queue_offset), "", 0)
        out.topic.CopyFrom(resource(topic))
        command = service_pb2.TelemetryCommand(
            recover_orphaned_transaction_command=service_pb2.RecoverOrphanedTransactionCommand(
                message=out, transaction_id=transaction_id(self._store.store_host,
                                                           msg.phys_offset)))
        self.asked += 1
        asyncio.ensure_future(self._write(stream, command))

    @staticmethod
    async def _write(stream: _Stream, command) -> None:
        try:
            async with stream.lock:
                await stream.context.write(command)
        except Exception as exc:  # noqa: BLE001 - the producer went away: asked again later
            log.info("a transaction check could not be sent: %r", exc)

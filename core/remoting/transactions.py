"""END_TRANSACTION (37) and CHECK_TRANSACTION_STATE (39): RocketMQ 4.x's transactions
(``EndTransactionProcessor``, ``Broker2Client.checkProducerTransactionState``;
docs/transactions.md).

A 4.x ``TransactionMQProducer`` sends its half as a send with the PREPARED sysflag and
``TRAN_MSG=true`` (``send``: the store keeps it in ``RMQ_SYS_TRANS_HALF_TOPIC``), then ends it
with a oneway END_TRANSACTION naming the half's commit-log offset, its producer group and
``commitOrRollback`` (8 commit, 12 rollback, 0 not yet known). The half's ``PGROUP`` must be
the group named, as the broker checks. The store's checker asks about a transaction left open
with a oneway CHECK_TRANSACTION_STATE to one producer of its group (round robin over the
connections that heart-beat for it): the header names the half's offsets and ids, the body is
the half as a record of its real topic and queue, which the client decodes and answers with
END_TRANSACTION (``fromTransactionCheck``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from dataclasses import replace

from mqstore.append.delays import copy_of
from mqstore.append.encoding import PutContext, encode_single
from mqstore.format.record import offset_msg_id
from mqstore.format.remoting_frame import ONEWAY_FLAG, Command
from mqstore.remoting.codes import PUT_CODES, RemotingError, Resp
from mqstore.remoting.fields import Fields
from mqstore.runtime.transactions import TransactionEndedError

log = logging.getLogger(__name__)
END_TRANSACTION = 37
CHECK_TRANSACTION_STATE = 39
COMMIT, ROLLBACK, UNKNOWN = 8, 12, 0  # MessageSysFlag's transaction types
_opaques = itertools.count(1 << 30)
MAX_RECORD = 1 << 30  # a stored half is re-encoded whole, whatever its size


class EndRequest:
    __slots__ = ("group", "half_offset", "resolution", "from_check", "msg_id")

    def __init__(self, cmd: Command) -> None:
        f = Fields(cmd.ext)
        self.group = f.text("producerGroup")
        f.int64("tranStateTableOffset")
        self.half_offset = f.int64("commitLogOffset")
        self.resolution = f.int32("commitOrRollback")
        self.from_check = f.boolean("fromTransactionCheck")
        self.msg_id = f.text("msgId", required=False)


def end(store, req: EndRequest) -> tuple[int, str | None]:
    """The response code and remark of one end."""
    half = store.message_at(req.half_offset)
    if half is None:
        return Resp.SYSTEM_ERROR, (f"find prepared transaction message failed: no half at "
                                   f"commit-log offset {req.half_offset}")
    group = half.properties.get("PGROUP")
    if group != req.group:
        return Resp.SYSTEM_ERROR, (f"the producer group wrong: the half's is {group!r}, the "
                                   f"request names {req.group!r}")
    try:
        r = store.end_transaction(req.half_offset, req.resolution == COMMIT)
    except (ValueError, TransactionEndedError) as exc:
        return Resp.SYSTEM_ERROR, str(exc)
    return PUT_CODES[r.status], (None if r.status.stored else r.error or r.status.value)


def handle_end(broker, conn, cmd: Command):
    req = EndRequest(cmd)
    if broker.slave:
        raise RemotingError(Resp.SLAVE_NOT_AVAILABLE, (
            f"broker {broker.name} is a slave: it ends no transactions"))
    if req.resolution == UNKNOWN:
        return None if cmd.is_oneway else cmd.response(Resp.SUCCESS)
    if req.resolution not in (COMMIT, ROLLBACK):
        raise RemotingError(Resp.SYSTEM_ERROR, (
            f"commitOrRollback {req.resolution} is not 8 (commit), 12 (rollback) or 0"))
    if broker.put_pool is None:
        return _answer(cmd, end(broker.store, req))
    return _end_on_thread(broker, cmd, req)


async def _end_on_thread(broker, cmd: Command, req: EndRequest):
    loop = asyncio.get_running_loop()
    return _answer(cmd, await loop.run_in_executor(broker.put_pool, end, broker.store, req))


def _answer(cmd: Command, result: tuple[int, str | None]):
    code, remark = result
    if code != Resp.SUCCESS:
        log.info("END_TRANSACTION refused: %s", remark)
    return None if cmd.is_oneway else cmd.response(code, remark)


class Checks:
    """The check-backs of the store's checker, sent to producers' connections."""

    def __init__(self, broker, loop: asyncio.AbstractEventLoop) -> None:
        self._broker = broker
        self._loop = loop
        self._turn = itertools.count()
        self.asked = 0

    def check(self, check) -> None:
        """Called on the checker's thread."""
        try:
            self._loop.call_soon_threadsafe(self._send, check)
        except RuntimeError:
            pass  # the loop ended: the server stopped

    def _send(self, check) -> None:
        broker = self._broker
        members = list(broker.clients.producers.get(check.producer_group, {}).values())
        if not members:
            return  # none of the group here (it may be a gRPC producer's)
        member = members[next(self._turn) % len(members)]
        half = check.message
        member.connection.send(Command(
            CHECK_TRANSACTION_STATE, opaque=next(_opaques) & 0x7FFFFFFF, flag=ONEWAY_FLAG,
            ext={"tranStateTableOffset": str(half.queue_offset),
                 "commitLogOffset": str(half.phys_offset), "msgId": check.message_id,
                 "transactionId": check.message_id,
                 "offsetMsgId": offset_msg_id(broker.host, half.phys_offset)},
            body=as_real(half, broker.store.store_host)))
        self.asked += 1


def as_real(half, store_host) -> bytes:
    """The half as a record of its real topic and queue, at the half's offsets and times, as
    the broker sends it (``MessageDecoder.encode`` of the half with its topic restored)."""
    ctx = PutContext(store_host, MAX_RECORD, True, len(store_host.address) == 16)
    p = replace(copy_of(half, ctx), sysflag=half.sysflag)
    return encode_single(p, store_host, p.queue_id, half.queue_offset, half.phys_offset,
                         half.store_timestamp)


def handlers(broker) -> dict:
    return {END_TRANSACTION: handle_end}


__all__ = ["handlers", "Checks", "END_TRANSACTION", "CHECK_TRANSACTION_STATE"]

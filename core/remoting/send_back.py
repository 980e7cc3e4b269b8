"""CONSUMER_SEND_MSG_BACK (36): ``SendMessageProcessor.consumerSendMsgBack`` of RocketMQ 4.x, a
push consumer's RECONSUME_LATER.

The header names the record (``offset``: its commit-log offset), the ``group``, the
``delayLevel`` and the ``maxReconsumeTimes`` (a client before 3.4.9 sends none: the group's
``retryMaxTimes``, ``config/subscriptionGroup.json``). The record is read again and put as a
new message with its body, flag, born time and host and every property, plus ``RETRY_TOPIC``
(its topic, unless it came from a retry) and ``ORIGIN_MESSAGE_ID`` (the offset id its send
was answered, unless it has one), with reconsume times + 1:

* to ``%RETRY%<group>`` (``retryQueueNums`` queues, one at random, perm 6) at delay level
  ``3 + reconsumeTimes`` when the request says 0, else the level it says: the store's delay
  levels deliver it (docs/delays.md);
* to ``%DLQ%<group>`` (1 queue, perm 6), ``DELAY`` 0, when the record's reconsume times reach
  the maximum or the level is below 0.

A record the store does not hold answers SYSTEM_ERROR naming the offset, as the broker does.
"""

from __future__ import annotations

import asyncio
import random

from mqstore.consumer.dead_letters import (
    DLQ_PREFIX, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RETRY_TOPIC, RETRY_PREFIX,
)
from mqstore.errors import CorruptRecordError
from mqstore.format.properties import PROPERTY_DELAY, PROPERTY_WAIT, decode_properties
from mqstore.format.record import SYSFLAG_USER_BITS, offset_msg_id
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.remoting_frame import Command
from mqstore.message import Message
from mqstore.remoting.codes import PUT_CODES, RemotingError, Req, Resp
from mqstore.remoting.fields import Fields

READ_WRITE = 6
DLQ_QUEUES = 1
FIRST_RETRY_LEVEL = 3  # RocketMQ: a retry's level is 3 + its reconsume times (10 s first)


def message_back(broker, cmd: Command) -> Message:
    """The message a send-back puts (its topic and queue created when missing)."""
    if broker.slave:
        raise RemotingError(Resp.SERVICE_NOT_AVAILABLE, (
            f"broker {broker.name} is a slave now: send back to its master"))
    f = Fields(cmd.ext)
    offset, group = f.int64("offset"), f.text("group")
    level = f.int32("delayLevel")
    most = f.int32("maxReconsumeTimes", required=False)
    store = broker.store
    try:
        config = store.group_config(group)
    except ValueError as exc:
        raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None
    try:
        stored = store.message_at(offset) if offset >= 0 else None
    except CorruptRecordError as exc:
        raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None
    if stored is None:
        raise RemotingError(Resp.SYSTEM_ERROR, f"look message by offset failed, {offset}")
    rec = stored.record
    props = decode_properties(stored.properties_text)
    props.pop(PROPERTY_CRC32, None)
    props.setdefault(PROPERTY_RETRY_TOPIC, stored.topic)
    # The id clients were answered: the advertised address's (``send``), not the record's.
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, offset_msg_id(broker.host, rec.phys_offset))
    props[PROPERTY_WAIT] = "false"
    most = config.retry_max_times if most is None else most
    if rec.reconsume_times >= most or level < 0:
        topic, queues = DLQ_PREFIX + group, DLQ_QUEUES
        props[PROPERTY_DELAY] = "0"
    else:
        topic, queues = RETRY_PREFIX + group, config.retry_queue_nums
        props[PROPERTY_DELAY] = str(FIRST_RETRY_LEVEL + rec.reconsume_times if level == 0
                                    else level)
    route, created = broker.topics.ensure(topic, queues, READ_WRITE)
    if created:
        broker.topic_changed(oneway=True)
    return Message(topic, stored.body, properties=props,
                   queue_id=random.randrange(max(route.write, 1)), flag=rec.flag,
                   sysflag=rec.sysflag & SYSFLAG_USER_BITS, born_timestamp=rec.born_timestamp,
                   born_host=str(rec.born_host), reconsume_times=rec.reconsume_times + 1)


def handle(broker, conn, cmd: Command):
    message = message_back(broker, cmd)
    if broker.put_pool is None:
        return _answer(cmd, _put(broker.store, message))
    return _put_on_thread(broker, cmd, message)


async def _put_on_thread(broker, cmd: Command, message: Message) -> Command:
    loop = asyncio.get_running_loop()
    return _answer(cmd, await loop.run_in_executor(broker.put_pool, _put, broker.store,
                                                   message))


def _put(store, message: Message):
    try:
        return store.put(message)
    except ValueError as exc:
        raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None


def _answer(cmd: Command, result) -> Command:
    if not result.status.stored:
        code = PUT_CODES.get(result.status, Resp.SYSTEM_ERROR)
        return cmd.response(code, result.error or result.status.value)
    return cmd.response(Resp.SUCCESS)


def handlers(broker) -> dict:
    return {Req.CONSUMER_SEND_MSG_BACK: handle}


__all__ = ["handlers", "message_back"]

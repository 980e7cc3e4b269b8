"""SEND_MESSAGE (10), SEND_MESSAGE_V2 (310), SEND_BATCH_MESSAGE (320): ``SendMessageProcessor``.

The header says where (topic, queueId) and how (sysFlag, flag, bornTimestamp, properties,
reconsumeTimes); the body is the message, or with ``batch`` true the items of a batch
(``format.remoting_message``): the broker takes the batch path by that field, not by the
code, as 4.9.8 does (the C++ client's ``send_batch`` sends code 10 with ``"batch":"1"``,
which is false: its whole body is stored as one message, as the Java broker stores it).

A send to a topic the broker does not have creates it (``BrokerTopics.for_send``) and tells
the NameServers; a group's ``%RETRY%`` topic is created by a send whether or not sends may
create topics, and a send to it past its ``maxReconsumeTimes`` goes to the group's ``%DLQ%``
topic instead. A message with a ``DELAY`` level is the store's to
schedule (``SCHEDULE_TOPIC_XXXX``, docs/delays.md): the answer names the real queue and the
schedule queue's offset, as RocketMQ's does; a batch holding one is refused
(MESSAGE_ILLEGAL), as RocketMQ refuses it. A transaction's half (the prepared sysFlag,
``TRAN_MSG=true``) is the store's to keep in ``RMQ_SYS_TRANS_HALF_TOPIC``
(``remoting.transactions``, docs/transactions.md); other transaction sysFlags are refused
(NO_PERMISSION). The put's status answers with the broker's code
(``codes.PUT_CODES``); a stored message answers msgId (the offset message id: the advertised
address and the commit-log offset), queueId and queueOffset, a batch its comma-joined msgIds
and its first queue offset.

Under ``flush.policy: async`` a put runs on the event loop (it does not wait); a policy that
waits for the disk, or a sync_master waiting for its slaves, puts on a thread.
"""

from __future__ import annotations

import asyncio
import random
from functools import lru_cache

from mqstore.append.encoding import DELAY_IN_BATCH
from mqstore.format.hosts import parse_host
from mqstore.format.properties import EncodedProperties, decode_encoded, decode_properties
from mqstore.format.schedule import delay_level
from mqstore.format.topic_config import PERM_READ_WRITE
from mqstore.format.transaction import SYSFLAG_PREPARED, is_half
from mqstore.format.record import SYSFLAG_TX_MASK, SYSFLAG_USER_BITS, offset_msg_id
from mqstore.format.remoting_frame import JSON, Command, JsonTemplate
from mqstore.format.remoting_message import decode_batch
from mqstore.message import Message, PutStatus
from mqstore.remoting.codes import PUT_CODES, RemotingError, Req, Resp
from mqstore.remoting.fields import V2_KEYS, Fields
from mqstore.remoting.topics import DLQ_PREFIX, RETRY_PREFIX

PROPERTY_CLUSTER = "CLUSTER"
DEFAULT_MAX_RECONSUME = 16
MAX_BATCH_MESSAGES = 1 << 16
SEND_OK_EXT = {"MSG_REGION": "DefaultRegion", "TRACE_ON": "true"}


# The send header's fields in the order SendRequest reads them, by their names in
# SEND_MESSAGE and in SEND_MESSAGE_V2 / SEND_BATCH_MESSAGE.
_NAMES = ("producerGroup", "topic", "defaultTopic", "defaultTopicQueueNums", "queueId",
          "sysFlag", "flag", "reconsumeTimes", "bornTimestamp", "properties",
          "maxReconsumeTimes", "batch")
_V2_NAMES = tuple(V2_KEYS[name] for name in _NAMES)
INT32_DIGITS, INT64_DIGITS = 9, 18  # plain digits this long are in range whatever they are
INT64_MAX = (1 << 63) - 1


def _plain(text: str | None, most: int) -> bool:
    return text is not None and len(text) <= most and text.isdigit() and text.isascii()


class SendRequest:
    """The send header. Nearly every header is the usual one (each field there, its numbers
    plain digits): read straight from it; any other goes through ``Fields``, whose errors
    name the field and the rule."""

    __slots__ = ("topic", "queue_id", "sysflag", "flag", "born", "properties", "reconsume",
                 "batch", "default_queues", "max_reconsume", "group")

    def __init__(self, cmd: Command) -> None:
        v1 = cmd.code == Req.SEND_MESSAGE
        (group, topic, default_topic, queues, queue_id, sysflag, flag, reconsume, born,
         properties, most, batch) = map(cmd.ext.get, _NAMES if v1 else _V2_NAMES)
        if (group is not None and topic is not None and default_topic is not None
                and _plain(queues, INT32_DIGITS) and _plain(queue_id, INT32_DIGITS)
                and _plain(sysflag, INT32_DIGITS) and _plain(flag, INT32_DIGITS)
                and _plain(reconsume, INT32_DIGITS) and _plain(born, INT64_DIGITS)
                and (most is None or _plain(most, INT32_DIGITS))):
            self.group, self.topic = group, topic
            self.default_queues, self.queue_id = int(queues), int(queue_id)
            self.sysflag, self.flag, self.born = int(sysflag), int(flag), int(born)
            self.properties = properties or ""
            self.reconsume = int(reconsume)
            self.max_reconsume = None if most is None else int(most)
            self.batch = batch is not None and batch.lower() == "true"
        else:
            self._read(Fields(cmd.ext, None if v1 else V2_KEYS))

    def _read(self, f: Fields) -> None:
        self.group = f.text("producerGroup")
        self.topic = f.text("topic")
        f.text("defaultTopic")
        self.default_queues = f.int32("defaultTopicQueueNums")
        self.queue_id = f.int32("queueId")
        self.sysflag = f.int32("sysFlag")
        self.born = f.int64("bornTimestamp")
        self.flag = f.int32("flag")
        self.properties = f.text("properties", required=False) or ""
        self.reconsume = f.int32("reconsumeTimes", 0, required=False)
        self.max_reconsume = f.int32("maxReconsumeTimes", required=False)
        self.batch = f.boolean("batch")


def _topic_of(broker, req: SendRequest) -> tuple[str, int]:
    """The topic and queue a send is stored in, created when it may be (``%RETRY%`` past the
    maximum: the group's ``%DLQ%``)."""
    topic, queue_id = req.topic, req.queue_id
    if topic.startswith(RETRY_PREFIX):
        group = topic[len(RETRY_PREFIX):]
        most = req.max_reconsume if req.max_reconsume is not None else DEFAULT_MAX_RECONSUME
        if req.reconsume >= most:
            topic = DLQ_PREFIX + group
            route, created = broker.topics.ensure(topic, 1, PERM_READ_WRITE)
            if created:
                broker.topic_changed(oneway=True)
            return topic, 0
        # RocketMQ creates a group's retry topic (1 queue, read-write) whether or not it
        # may create topics for sends.
        route, created = broker.topics.ensure(topic, 1, PERM_READ_WRITE)
    else:
        route, created = broker.topics.for_send(topic, req.default_queues)
    if created:
        broker.topic_changed(oneway=True)
    if not route.perm & 2:
        raise RemotingError(Resp.NO_PERMISSION,
                            f"the topic[{topic}] sending message is forbidden (perm {route.perm})")
    most = max(route.read, route.write)
    if queue_id < 0:
        queue_id = random.randrange(max(route.write, 1))
    elif queue_id >= most:
        raise RemotingError(Resp.SYSTEM_ERROR, (
            f"request queueId[{queue_id}] is illegal: topic {topic} has {route.write} write "
            f"and {route.read} read queues"))
    return topic, queue_id


def _properties(text: str, cluster: str) -> dict[str, str]:
    """A send's properties with CLUSTER set: as they came with CLUSTER after them when the
    text is their plain encoding (nearly every send: stored as it is), else decoded (the
    caller sets CLUSTER)."""
    encoded = decode_encoded(text, PROPERTY_CLUSTER, cluster)
    return decode_properties(text) if encoded is None else encoded


def messages_of(broker, conn, cmd: Command, req: SendRequest) -> list[Message]:
    if broker.slave:
        raise RemotingError(Resp.SERVICE_NOT_AVAILABLE, (
            f"broker {broker.name} is a slave now: send to its master"))
    tx = req.sysflag & SYSFLAG_TX_MASK
    props = {} if req.batch else _properties(req.properties, broker.cluster)
    if tx and not (tx == SYSFLAG_PREPARED and not req.batch and is_half(props)):
        raise RemotingError(Resp.NO_PERMISSION, (
            f"the broker[{broker.name}] sending transaction message is forbidden: a "
            f"transaction's half is one message with the prepared sysFlag and TRAN_MSG=true, "
            f"ended by END_TRANSACTION"))
    topic, queue_id = _topic_of(broker, req)
    sysflag = req.sysflag & SYSFLAG_USER_BITS & ~SYSFLAG_TX_MASK  # a half's: the store's
    common = {PROPERTY_CLUSTER: broker.cluster}
    if not req.batch:
        if type(props) is not EncodedProperties:
            props.update(common)
        return [Message(topic, cmd.body, properties=props, queue_id=queue_id, flag=req.flag,
                        sysflag=sysflag, born_timestamp=req.born, born_host=conn.peer,
                        reconsume_times=req.reconsume)]
    if not cmd.body:
        raise RemotingError(Resp.MESSAGE_ILLEGAL, "batch message body is empty")
    try:
        items = decode_batch(cmd.body, MAX_BATCH_MESSAGES)
    except ValueError as exc:
        raise RemotingError(Resp.MESSAGE_ILLEGAL, str(exc)) from None
    out = []
    for flag, body, text in items:
        props = decode_properties(text)
        if delay_level(props, 1):  # a batch of one is put alone: refused here, as RocketMQ
            raise RemotingError(Resp.MESSAGE_ILLEGAL, DELAY_IN_BATCH)
        props.update(common)
        out.append(Message(topic, body, properties=props, queue_id=queue_id, flag=flag,
                           sysflag=sysflag, born_timestamp=req.born, born_host=conn.peer,
                           reconsume_times=req.reconsume))
    return out


def put(store, messages: list[Message]):
    """``(status, error, queue id, first queue offset, commit-log offsets)``."""
    try:
        if len(messages) == 1:
            r = store.put(messages[0])
            return r.status, r.error, r.queue_id, r.queue_offset, [r.phys_offset]
        r = store.put_batch(messages)
    except ValueError as exc:
        raise RemotingError(Resp.MESSAGE_ILLEGAL, str(exc)) from None
    if not r.status.stored:
        return r.status, r.error, -1, -1, []
    return (r.status, r.error, int(r.queue_ids[0]), int(r.queue_offsets[0]),
            r.phys_offsets.tolist())


_ANSWER_HOLES = ("msgId", "queueId", "queueOffset")
# PUT_OK's JSON answer, every field but these fixed: its header comes from this template
_PUT_OK = JsonTemplate(PUT_CODES[PutStatus.PUT_OK], {**dict.fromkeys(_ANSWER_HOLES, ""),
                                                     **SEND_OK_EXT}, _ANSWER_HOLES)


@lru_cache(maxsize=16)
def _id_prefix(address: str) -> str:
    """What every offset message id of the broker at ``address`` starts with: its address
    and port, the commit-log offset's 16 hex digits follow (``offset_msg_id``)."""
    return offset_msg_id(parse_host(address), 0)[:-16]


def answer(broker, cmd: Command, result) -> Command:
    status, error, queue_id, queue_offset, phys = result
    code = PUT_CODES[status]
    if not status.stored:
        return cmd.response(code, error or status.value)
    prefix = _id_prefix(broker.address)
    values = (",".join([prefix + format(p, "016X") if 0 <= p <= INT64_MAX
                        else offset_msg_id(broker.host, p) for p in phys]),
              str(queue_id), str(queue_offset))
    ext = dict(zip(_ANSWER_HOLES, values))
    ext.update(SEND_OK_EXT)
    ok = status is PutStatus.PUT_OK
    response = cmd.response(code, None if ok else (error or status.value), ext)
    if ok and cmd.serialize_type == JSON:  # hex ids and digits: nothing to escape
        response.encoded_header = _PUT_OK.render(cmd.opaque, values)
    return response


def handle_send(broker, conn, cmd: Command):
    req = SendRequest(cmd)
    messages = messages_of(broker, conn, cmd, req)
    if broker.put_pool is None:
        return answer(broker, cmd, put(broker.store, messages))
    return _put_on_thread(broker, cmd, messages)


async def _put_on_thread(broker, cmd: Command, messages):
    loop = asyncio.get_running_loop()
    result = await loop.run_in_executor(broker.put_pool, put, broker.store, messages)
    return answer(broker, cmd, result)


def handlers(broker) -> dict:
    return {Req.SEND_MESSAGE: handle_send, Req.SEND_MESSAGE_V2: handle_send,
            Req.SEND_BATCH_MESSAGE: handle_send}


__all__ = ["handlers", "handle_send", "SendRequest"]

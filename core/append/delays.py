"""Delay levels and timers on the put path (``format.schedule``): a delayed message rerouted
to ``SCHEDULE_TOPIC_XXXX``, a timed one to ``rmq_sys_wheel_timer``, and the schedule's
delivered copy of either, all as ``Prepared`` records the Appender writes like any other.

``to_schedule`` runs after the queue of the real topic was chosen (``REAL_QID`` names it), as
RocketMQ's ``CommitLog.putMessage`` rewrites a message after the broker chose its queue. The
put answers the real queue id and the schedule queue's offset, as RocketMQ's send does.

``copy_of`` keeps every field of the stored record but topic, queue, store time and offsets:
the properties text is copied byte for byte (RocketMQ's ``messageTimeup`` rebuilds the same
text from the same map), except a whole-record CRC property, which the copy gets anew when
the store writes one.
"""

from __future__ import annotations

from dataclasses import replace

from mqstore.append.encoding import (
    Prepared, PutContext, Rejected, encode_tail, finish_tail, message_properties,
    properties_too_large, topic_refusal,
)
from mqstore.format import record_crc
from mqstore.format.hosts import Host
from mqstore.format.names import check_queue_id, check_topic
from mqstore.format.properties import (
    PROPERTY_DELAY, decode_properties, encode_properties,
)
from mqstore.format.properties import MAX_PROPERTIES_BYTES
from mqstore.format.record import (
    HEADER_STRUCTS, MAGIC_V1, MAGIC_V2, MAX_V1_TOPIC_BYTES, SYSFLAG_STOREHOST_V6, unpack_record,
)
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.schedule import (
    PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, PROPERTY_TIMER_OUT_MS, SCHEDULE_TOPIC,
    TIMER_PROPERTIES, TIMER_TOPIC, deliver_ms, delay_level, queue_of_level, timer_out_ms,
)
from mqstore.message import Message, PutStatus


def to_schedule(p: Prepared, msg: Message, ctx: PutContext, max_level: int) -> Prepared:
    """``p`` (a delayed message whose queue was chosen) as its record in the schedule topic;
    ``Rejected`` when the added properties outgrow their limit."""
    props = message_properties(msg.tags, msg.keys, msg.properties)
    level = delay_level(props, max_level)
    if str(level) != props[PROPERTY_DELAY]:
        props[PROPERTY_DELAY] = str(level)  # capped, as RocketMQ's setDelayTimeLevel(max)
    for name in TIMER_PROPERTIES:  # a level wins over a delivery time, as in RocketMQ 5
        props.pop(name, None)
    return _rerouted(p, props, SCHEDULE_TOPIC, queue_of_level(level), ctx)


def is_timed_message(msg: Message) -> bool:
    props = msg.properties
    return bool(props) and any(name in props for name in TIMER_PROPERTIES)


def to_timer(p: Prepared, msg: Message, ctx: PutContext, now: int, max_delay_ms: int,
             precision_ms: int) -> Prepared:
    """``p`` (a timed message whose queue was chosen) as its record in the timer topic, or
    ``p`` itself when its time has come already (stored as any message, as RocketMQ 5 does);
    ``Rejected`` when its time is not an integer or further than ``max_delay_ms`` away."""
    props = message_properties(msg.tags, msg.keys, msg.properties)
    try:
        deliver = deliver_ms(props, now)
    except ValueError as exc:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, str(exc)) from None
    if deliver <= now:
        return p
    if deliver - now > max_delay_ms:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, (
            f"delivery time {deliver} is {deliver - now} ms away; the most is "
            f"{max_delay_ms} ms (store.timer_max_delay_sec)"))
    props[PROPERTY_TIMER_OUT_MS] = str(timer_out_ms(deliver, precision_ms))
    return _rerouted(p, props, TIMER_TOPIC, 0, ctx)


def _rerouted(p: Prepared, props: dict, topic: str, queue_id: int, ctx: PutContext
              ) -> Prepared:
    props[PROPERTY_REAL_TOPIC] = p.topic
    props[PROPERTY_REAL_QID] = str(p.queue_id)
    tail = finish_tail(topic, False, ctx.record_crc, props, None)
    size = HEADER_STRUCTS[(p.sysflag >> 4) & 3].size + len(p.body) + len(tail)
    return replace(p, topic=topic, queue_id=queue_id, tail=tail, magic=MAGIC_V1, size=size,
                   answer_queue_id=p.queue_id)


class NotACopy(ValueError):
    """A schedule record that names no real topic and queue: RocketMQ drops it, logged."""


def copy_of(stored, ctx: PutContext) -> Prepared:
    """The delivered copy of the schedule record ``stored`` (a ``StoredMessage``)."""
    raw = stored.raw
    lay = unpack_record(raw)
    block = bytes(raw[lay.props_at:lay.props_at + lay.props_len])
    props = decode_properties(block.decode("utf-8", "replace"))
    topic, qid = props.get(PROPERTY_REAL_TOPIC), props.get(PROPERTY_REAL_QID)
    try:
        topic = check_topic(topic)
        queue_id = check_queue_id(int(qid)) if qid is not None and qid.isdecimal() else None
    except ValueError as exc:
        raise NotACopy(f"{PROPERTY_REAL_TOPIC} {topic!r}: {exc}") from None
    if queue_id is None:
        raise NotACopy(f"{PROPERTY_REAL_QID} {qid!r} is not a queue id")
    long_topic = len(topic) > MAX_V1_TOPIC_BYTES
    reason = topic_refusal(topic, ctx.auto_v2) if long_topic else None
    if reason is not None:
        raise NotACopy(reason)
    if PROPERTY_CRC32 in props:
        block = encode_properties({k: v for k, v in props.items()
                                   if k != PROPERTY_CRC32}).encode("utf-8")
    if ctx.record_crc:
        block = record_crc.reserve(block)
    if len(block) > MAX_PROPERTIES_BYTES:
        raise Rejected(PutStatus.PROPERTIES_SIZE_EXCEEDED, properties_too_large(len(block)))
    tail = encode_tail(topic, long_topic, block)
    f = lay.fields
    sysflag = (f[7] & ~SYSFLAG_STOREHOST_V6) | (SYSFLAG_STOREHOST_V6 if ctx.store_v6 else 0)
    body = bytes(raw[lay.body_at:lay.body_at + f[16]])
    size = HEADER_STRUCTS[(sysflag >> 4) & 3].size + len(body) + len(tail)
    return Prepared(topic, queue_id, body, f[2], tail, MAGIC_V2 if long_topic else MAGIC_V1,
                    sysflag, f[4], f[8], Host(f[9], f[10]), f[14], f[15], True, False, False,
                    size)

"""``mqstore group dlq``: a group's dead letters listed, and chosen ones sent again to their
original topic (as RocketMQ's dashboard resends a DLQ message), as plain values.

A dead letter's origin is its ``DLQ_ORIGIN_TOPIC`` (RocketMQ 5), else its ``RETRY_TOPIC``
(4.x); its id the ``DLQ_ORIGIN_MESSAGE_ID``, else its ``UNIQ_KEY``, else its record's offset
id; its attempts ``RECONSUME_TIME``, else the record's reconsume times. A resend is a new
message to the origin topic with the same body, tags, keys, ``UNIQ_KEY`` and the user's
properties, without the properties dead-lettering added (so it is delivered afresh, attempt
1); the dead letter stays in the DLQ, as in RocketMQ.
"""

from __future__ import annotations

from mqstore.consumer.dead_letters import (
    PROPERTY_DLQ_ORIGIN_MESSAGE_ID, PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC, dlq_topic,
)
from mqstore.consumer.names import check_group
from mqstore.format.properties import PROPERTY_DELAY, PROPERTY_KEYS, PROPERTY_TAGS
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.schedule import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC
from mqstore.message import Message

MAX_LISTED = 10_000  # dead letters one listing reads, from the oldest kept
# What dead-lettering (and the retry before it) added; a resend leaves them out.
_ADDED = frozenset((PROPERTY_DLQ_ORIGIN_TOPIC, PROPERTY_DLQ_ORIGIN_MESSAGE_ID,
                    PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_RECONSUME_TIME, PROPERTY_RETRY_TOPIC,
                    PROPERTY_DELAY, PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID, PROPERTY_CRC32,
                    PROPERTY_TAGS, PROPERTY_KEYS, "MIN_OFFSET", "MAX_OFFSET",
                    "CONSUME_START_TIME", "CLUSTER"))


def _letters(store, group: str):
    """``(queue offset, StoredMessage)`` of every dead letter of ``group`` kept now."""
    check_group(group)
    topic = dlq_topic(group)
    if 0 not in store.queue_ids(topic):
        return
    offset = store.min_offset(topic, 0)
    end = min(store.max_offset(topic, 0), offset + MAX_LISTED)
    while offset < end:
        batch = store.read(topic, 0, offset, min(256, end - offset))
        if batch is None or not len(batch):
            return
        for i, o in enumerate(batch.queue_offsets.tolist()):
            yield o, batch.message(i)
        offset = batch.next_begin_offset


def describe(offset: int, msg) -> dict:
    props = msg.properties
    attempts = props.get(PROPERTY_RECONSUME_TIME)
    return {"offset": offset,
            "id": props.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID) or msg.uniq_key or msg.msg_id,
            "origin_topic": props.get(PROPERTY_DLQ_ORIGIN_TOPIC) or props.get(
                PROPERTY_RETRY_TOPIC),
            "attempts": int(attempts) if attempts and attempts.isdecimal()
            else msg.record.reconsume_times,
            "store_time_ms": msg.record.store_timestamp, "tags": msg.tags, "keys": msg.keys,
            "body_bytes": len(msg.body)}


def list_dead_letters(store, group: str) -> list[dict]:
    return [describe(o, m) for o, m in _letters(store, group)]


def resend(store, group: str, *, offsets=(), ids=(), every: bool = False) -> dict:
    """Send the chosen dead letters (by queue offset, by id, or ``every`` one) to their
    origin topics; ValueError naming what was asked for and not found, with nothing sent."""
    if not (offsets or ids or every):
        raise ValueError("choose the dead letters to resend: offsets, ids, or all")
    wanted_offsets, wanted_ids = set(offsets), set(ids)
    chosen = [(o, m) for o, m in _letters(store, group)
              if every or o in wanted_offsets or describe(o, m)["id"] in wanted_ids]
    found = {o for o, _m in chosen} | {describe(o, m)["id"] for o, m in chosen}
    missing = sorted(map(str, (wanted_offsets | wanted_ids) - found))
    if missing:
        raise ValueError(f"group {group!r} has no dead letter {', '.join(missing)} in "
                         f"{dlq_topic(group)}; nothing was resent (`mqstore group dlq` lists "
                         f"them)")
    unknown = [describe(o, m) for o, m in chosen if not describe(o, m)["origin_topic"]]
    if unknown:
        raise ValueError(f"dead letter at offset {unknown[0]['offset']} names no origin topic "
                         f"({PROPERTY_DLQ_ORIGIN_TOPIC} or {PROPERTY_RETRY_TOPIC}); nothing "
                         f"was resent")
    messages = [_again(m, describe(o, m)["origin_topic"]) for o, m in chosen]
    out = []
    if messages:
        result = store.put_batch(messages)
        if not result.status.stored:
            raise OSError(f"resending {len(messages)} dead letters of group {group!r} was "
                          f"refused: {result.status.name} {result.error or ''}".rstrip())
        for (o, m), r in zip(chosen, result):
            out.append({"offset": o, "id": describe(o, m)["id"], "topic": m.properties.get(
                PROPERTY_DLQ_ORIGIN_TOPIC) or m.properties.get(PROPERTY_RETRY_TOPIC),
                "queue_id": r.queue_id, "queue_offset": r.queue_offset,
                "status": r.status.name})
    return {"group": group, "resent": out}


def _again(msg, topic: str) -> Message:
    rec = msg.record
    props = {k: v for k, v in msg.properties.items() if k not in _ADDED}
    return Message(topic=topic, body=msg.body, tags=msg.tags, keys=msg.keys or None,
                   properties=props or None, flag=rec.flag, sysflag=rec.sysflag & ~0x3C,
                   born_timestamp=rec.born_timestamp)

"""Transactional messages on the put path (``format.transaction``): a half message rerouted to
``RMQ_SYS_TRANS_HALF_TOPIC``, and the records an end or a check writes (the committed
message, the op record, the re-appended half, the discarded half), all as ``Prepared`` records
the Appender writes like any other.

``to_half`` runs after the real topic's queue was chosen (``REAL_QID`` names it), as RocketMQ's
``SendMessageProcessor`` hands the broker's chosen queue to ``parseHalfMessageInner``; the put
answers the real queue id and the half queue's offset, as RocketMQ's send does. The records
built from a stored half keep every field of it but topic, queue, store time, offsets, sysflag
and ``preparedTransactionOffset``, as 4.9.8's ``endMessageTransaction`` and
``renewHalfMessageInner`` copy them.
"""

from __future__ import annotations

import uuid
from dataclasses import replace

from mqstore.append.delays import copy_of
from mqstore.append.encoding import (
    Prepared, PutContext, Rejected, encode_tail, message_properties, properties_too_large,
)
from mqstore.format import record_crc
from mqstore.format.properties import (
    MAX_PROPERTIES_BYTES, PROPERTY_UNIQ_KEY, decode_properties,
)
from mqstore.format.record import HEADER_STRUCTS, MAGIC_V1, unpack_record
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.transaction import (
    CHECK_MAX_TOPIC, HALF_TOPIC, OP_PROPERTIES_TEXT, OP_TOPIC, PROPERTY_CHECK_TIMES,
    SYSFLAG_COMMIT, SYSFLAG_TX_MASK, check_times, half_properties, java_properties_text,
    op_body,
)
from mqstore.hashing import crc32
from mqstore.message import Message, PutStatus


def is_half_message(msg: Message) -> bool:
    props = msg.properties
    return bool(props) and str(props.get("TRAN_MSG", "")).lower() == "true"


def to_half(p: Prepared, msg: Message, ctx: PutContext) -> Prepared:
    """``p`` (a transaction's half whose real queue was chosen) as its half record."""
    props = message_properties(msg.tags, msg.keys, msg.properties)
    if not props.get(PROPERTY_UNIQ_KEY):
        # RocketMQ's producers always set one; it is what names the transaction through its
        # re-appended copies, and what clients end and are asked about it by.
        props[PROPERTY_UNIQ_KEY] = uuid.uuid4().hex.upper()
    text = java_properties_text(half_properties(props, p.topic, p.queue_id), props)
    sysflag = p.sysflag & ~SYSFLAG_TX_MASK  # the broker stores a half as NOT_TYPE
    return replace(_record(p, HALF_TOPIC, 0, text, ctx, sysflag=sysflag,
                           answer_queue_id=p.queue_id), queued=True)


def committed(half, ctx: PutContext) -> Prepared:
    """The real message of the stored half ``half`` (a ``StoredMessage``): its properties
    text unchanged, sysflag COMMIT, ``preparedTransactionOffset`` the half's offset."""
    p = copy_of(half, ctx)
    return replace(p, sysflag=(p.sysflag & ~SYSFLAG_TX_MASK) | SYSFLAG_COMMIT,
                   prepared_tx_offset=half.phys_offset)


def op_record(half_queue_offset: int, ctx: PutContext) -> Prepared:
    """The op record closing the half at ``half_queue_offset`` (born at the store host)."""
    body = op_body([half_queue_offset])
    block = OP_PROPERTIES_TEXT.encode("ascii")
    if ctx.record_crc:
        block = record_crc.reserve(block)
    tail = encode_tail(OP_TOPIC, False, block)
    sysflag = 0x30 if ctx.store_v6 else 0
    size = HEADER_STRUCTS[(sysflag >> 4) & 3].size + len(body) + len(tail)
    return Prepared(OP_TOPIC, 0, body, crc32(body), tail, MAGIC_V1, sysflag, 0, None,
                    ctx.store_host, 0, 0, True, True, False, size)


def rechecked(half, ctx: PutContext) -> Prepared:
    """The half ``half`` re-appended for its next check: ``TRANSACTION_CHECK_TIMES`` + 1."""
    names, props = _properties(half)
    props[PROPERTY_CHECK_TIMES] = str(check_times(props) + 1)
    p = copy_of(half, ctx)
    return _record(p, HALF_TOPIC, 0, java_properties_text(props, names), ctx,
                   sysflag=p.sysflag)


def discarded(half, ctx: PutContext) -> Prepared:
    """The half ``half`` as its record in ``TRANS_CHECK_MAX_TIME_TOPIC`` (checked too often)."""
    names, props = _properties(half)
    p = copy_of(half, ctx)
    return _record(p, CHECK_MAX_TOPIC, 0, java_properties_text(props, names), ctx,
                   sysflag=p.sysflag)


def _properties(half) -> tuple[list[str], dict[str, str]]:
    raw = half.raw
    lay = unpack_record(raw)
    text = bytes(raw[lay.props_at:lay.props_at + lay.props_len]).decode("utf-8", "replace")
    props = decode_properties(text)
    props.pop(PROPERTY_CRC32, None)
    names = [seg.split("\x01", 1)[0] for seg in text.split("\x02") if "\x01" in seg]
    return names, props


def _record(p: Prepared, topic: str, queue_id: int, text: str, ctx: PutContext, *,
            sysflag: int, answer_queue_id: int | None = None) -> Prepared:
    block = text.encode("utf-8")
    if ctx.record_crc:
        block = record_crc.reserve(block)
    if len(block) > MAX_PROPERTIES_BYTES:
        raise Rejected(PutStatus.PROPERTIES_SIZE_EXCEEDED, properties_too_large(len(block)))
    tail = encode_tail(topic, False, block)
    size = HEADER_STRUCTS[(sysflag >> 4) & 3].size + len(p.body) + len(tail)
    return replace(p, topic=topic, queue_id=queue_id, tail=tail, magic=MAGIC_V1,
                   sysflag=sysflag, size=size, answer_queue_id=answer_queue_id,
                   prepared_tx_offset=0)

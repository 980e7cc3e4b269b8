"""Dead letters: a message a group gave up on, written to ``%DLQ%<group>`` as RocketMQ writes
it, and found again after a crash.

The dead letter is the stored record with a new topic (queue 0 of ``%DLQ%<group>``, one queue,
perm 6, as RocketMQ's ``createTopicInSendMessageBackMethod`` makes it) and the same body, flag,
born time and host, keys, tags and ``UNIQ_KEY`` (the message id clients know). Its properties
gain what RocketMQ's ``consumerSendMsgBack`` adds: ``RETRY_TOPIC`` (the origin topic, unless the
message came from a retry and has one), ``ORIGIN_MESSAGE_ID`` (the origin record's offset id,
unless it has one), 4.x's ``DELAY`` 0, ``RECONSUME_TIME`` and the record's reconsume times =
the attempts made, and 5.x's ``DLQ_ORIGIN_TOPIC`` and ``DLQ_ORIGIN_MESSAGE_ID`` (the message id).
It is written as the schedule writes its copies (``Appender.put_copies``): past the put hooks
and topic configs, all or nothing.

``found`` looks for a group's dead letters of one message in the commit log from a position on
(NOTE [ Dead-lettering exactly once ] in ``pop``): it reads the records themselves, never the
consume queues, which may not have caught up yet.
"""

from __future__ import annotations

import threading
from mqstore.append.delays import NotACopy
from mqstore.append.encoding import (
    Prepared, Rejected, encode_tail, properties_too_large, topic_refusal,
)
from mqstore.format import record_crc
from mqstore.format.hosts import Host
from mqstore.format.properties import (
    MAX_PROPERTIES_BYTES, PROPERTY_DELAY, decode_properties, encode_properties,
)
from mqstore.format.record import (
    HEADER_STRUCTS, MAGIC_V1, MAGIC_V2, MAX_V1_TOPIC_BYTES, SCAN_BAD, SCAN_BLANK,
    SYSFLAG_STOREHOST_V6, scan_record, unpack_record,
)
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.schedule import PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC
from mqstore.format.topic_config import PERM_READ_WRITE
from mqstore.message import PutStatus

DLQ_PREFIX = "%DLQ%"
RETRY_PREFIX = "%RETRY%"
DLQ_QUEUES = 1  # RocketMQ's DLQ_NUMS_PER_GROUP
PROPERTY_RETRY_TOPIC = "RETRY_TOPIC"
PROPERTY_ORIGIN_MESSAGE_ID = "ORIGIN_MESSAGE_ID"
PROPERTY_RECONSUME_TIME = "RECONSUME_TIME"
PROPERTY_DLQ_ORIGIN_TOPIC = "DLQ_ORIGIN_TOPIC"
PROPERTY_DLQ_ORIGIN_MESSAGE_ID = "DLQ_ORIGIN_MESSAGE_ID"
_SCAN_CHUNK = 1 << 20


def dlq_topic(group: str) -> str:
    return DLQ_PREFIX + group


def message_id(stored) -> str:
    """The id clients know a message by: its ``UNIQ_KEY``, else its record's offset id."""
    return stored.uniq_key or stored.msg_id


def dead_letter_properties(stored, attempts: int) -> dict[str, str]:
    """The properties of ``stored``'s dead letter after ``attempts`` deliveries."""
    props = decode_properties(stored.properties_text)
    props.pop(PROPERTY_CRC32, None)
    for name in (PROPERTY_REAL_TOPIC, PROPERTY_REAL_QID):
        props.pop(name, None)  # a delivered copy's routing, which would send it back
    props.setdefault(PROPERTY_RETRY_TOPIC, stored.topic)
    props.setdefault(PROPERTY_ORIGIN_MESSAGE_ID, stored.msg_id)
    props[PROPERTY_DELAY] = "0"
    props[PROPERTY_RECONSUME_TIME] = str(attempts)
    props[PROPERTY_DLQ_ORIGIN_TOPIC] = stored.topic
    props[PROPERTY_DLQ_ORIGIN_MESSAGE_ID] = message_id(stored)
    return props


def dead_letter_of(stored, group: str, attempts: int, ctx) -> Prepared:
    """``stored`` (a ``StoredMessage``) as its dead letter for ``group``, after ``attempts``
    deliveries; ``NotACopy`` when the topic cannot be written in this store's record format,
    ``Rejected`` when the properties outgrow their limit."""
    raw = stored.raw
    lay = unpack_record(raw)
    block = encode_properties(dead_letter_properties(stored, attempts)).encode("utf-8")
    if ctx.record_crc:
        block = record_crc.reserve(block)
    if len(block) > MAX_PROPERTIES_BYTES:
        raise Rejected(PutStatus.PROPERTIES_SIZE_EXCEEDED, properties_too_large(len(block)))
    topic = dlq_topic(group)
    long_topic = len(topic) > MAX_V1_TOPIC_BYTES
    reason = topic_refusal(topic, ctx.auto_v2) if long_topic else None
    if reason is not None:
        raise NotACopy(reason)
    tail = encode_tail(topic, long_topic, block)
    f = lay.fields
    sysflag = (f[7] & ~SYSFLAG_STOREHOST_V6) | (SYSFLAG_STOREHOST_V6 if ctx.store_v6 else 0)
    body = bytes(raw[lay.body_at:lay.body_at + f[16]])
    size = HEADER_STRUCTS[(sysflag >> 4) & 3].size + len(body) + len(tail)
    return Prepared(topic, 0, body, f[2], tail, MAGIC_V2 if long_topic else MAGIC_V1, sysflag,
                    f[4], f[8], Host(f[9], f[10]), attempts, f[15], True, False, False, size)


class DeadLetters:
    """Writes and finds the dead letters of one writable store (the writer's appender)."""

    def __init__(self, *, appender, put_ctx, commit_log, topics) -> None:
        self._appender, self._ctx, self._log, self._topics = appender, put_ctx, commit_log, topics
        self._lock = threading.Lock()
        self._counts: dict[str, int] = {}
        self._listeners: list = []

    def watch(self, listener) -> None:
        """``listener(group, count)`` is called after each put of dead letters (under the pop
        state's flock: it must be quick and must not raise)."""
        if listener not in self._listeners:  # named again for parts rebuilt: once
            self._listeners.append(listener)

    def log_end(self) -> int:
        return self._log.max_offset

    def put_many(self, group: str, letters: list) -> None:
        """Write the dead letters of ``letters`` (``(StoredMessage, attempts)``) in one put, all
        or nothing; raises (nothing written) when they cannot be written."""
        topic = dlq_topic(group)
        if self._topics.get(topic) is None:
            try:
                self._topics.create(topic, queues=DLQ_QUEUES, perm=PERM_READ_WRITE)
            except ValueError:
                if self._topics.get(topic) is None:  # not another process's creation
                    raise
        prepared = [dead_letter_of(m, group, attempts, self._ctx) for m, attempts in letters]
        result = self._appender.put_copies(prepared)
        if not result.status.stored:
            raise OSError(f"{len(letters)} dead letter(s) to {topic} not written: "
                          f"{result.status.name} {result.error or ''}".rstrip())
        with self._lock:
            self._counts[group] = self._counts.get(group, 0) + len(letters)
        for listener in self._listeners:
            listener(group, len(letters))

    def counts(self) -> dict[str, int]:
        """Dead letters this process wrote since the store opened, per group."""
        with self._lock:
            return dict(self._counts)

    def found(self, group: str, origin_topic: str, ids: set, log_from: int) -> set:
        """Which of the message ids ``ids`` of ``origin_topic`` have a dead letter of
        ``group`` in the commit log from ``log_from`` on (the records, read in chunks)."""
        topic = dlq_topic(group)
        out: set = set()
        pos, end = log_from, self._log.max_offset
        while pos < end and len(out) < len(ids):
            buf = self._log.read_span(pos, _SCAN_CHUNK)
            if not buf:
                break
            at = 0
            while at < len(buf):
                kind, size, head = scan_record(buf, at, len(buf), False)
                if kind == SCAN_BAD:
                    break  # cut at the chunk's end (read on from here), or damage
                if kind == SCAN_BLANK:
                    at = len(buf)  # the rest of the segment is a blank
                    break
                if head.topic == topic:
                    props = decode_properties(head.properties.decode("utf-8", "replace"))
                    if props.get(PROPERTY_DLQ_ORIGIN_TOPIC) == origin_topic:
                        found = props.get(PROPERTY_DLQ_ORIGIN_MESSAGE_ID)
                        if found in ids:
                            out.add(found)
                at += size
            if at == 0:
                break  # damage, or a record larger than a read: nothing more to find here
            pos += at
        return out

"""Turning Message objects into commit-log records: validation, sizing and batch encoding.

``prepare`` checks one message and computes everything that does not depend on where it lands;
``encode_single`` fills in queue offset, physical offset and store time under the put lock.
Batches are encoded column-wise by :mod:`mqstore.batch_columns`.
"""

from __future__ import annotations

import gc
import re
import struct
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mqstore.format.hosts import Host, parse_host
from mqstore.format.properties import (
    KEY_SEPARATOR, MAX_PROPERTIES_BYTES, PROPERTY_DELAY, PROPERTY_INNER_NUM, PROPERTY_KEYS,
    PROPERTY_TAGS, PROPERTY_WAIT, check_property, encode_properties,
)
from mqstore.format.record import (
    HEADER_STRUCTS, MAGIC_V1, MAGIC_V2, MAX_TOPIC_BYTES, MAX_V1_TOPIC_BYTES, SYSFLAG_BORNHOST_V6,
    SYSFLAG_INNER_BATCH, SYSFLAG_STOREHOST_V6, SYSFLAG_TX_MASK, SYSFLAG_USER_BITS, TX_COMMIT,
    TX_NOT, topic_field,
)
from mqstore.hashing import crc32
from mqstore.message import Message, PutStatus

TOPIC_PATTERN = re.compile(r"^[%|a-zA-Z0-9_-]+$")
RETRY_PREFIX = "%RETRY%"
INT32_MAX = 0x7FFFFFFF
_SHORT = struct.Struct(">h")
MAX_RECORD_OVERHEAD = 64 * 1024  # a record may exceed the body limit by this much


class Rejected(Exception):
    """A message the store refuses with a status (nothing is written)."""

    def __init__(self, status: PutStatus, reason: str, index: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.index = index


_valid_topics: set[str] = set()


def check_topic(topic: object) -> str:
    """RocketMQ's character rule; it also keeps every path inside the store directory."""
    if topic in _valid_topics:
        return topic  # type: ignore[return-value]
    if not isinstance(topic, str) or not TOPIC_PATTERN.match(topic):
        raise ValueError(f"topic {topic!r} must match {TOPIC_PATTERN.pattern} (letters, digits, %|_-)")
    if len(_valid_topics) < 100_000:
        _valid_topics.add(topic)
    return topic


def check_queue_id(queue_id: object) -> int:
    if isinstance(queue_id, bool) or not isinstance(queue_id, (int, np.integer)) \
            or not 0 <= queue_id <= INT32_MAX:
        raise ValueError(f"queue_id {queue_id!r} must be an int in [0, {INT32_MAX}]")
    return int(queue_id)


def _int_field(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"{name} {value!r} must be an int in [{lo}, {hi}]")
    return int(value)


@dataclass(slots=True)
class Prepared:
    topic: str
    queue_id: int | None
    body: bytes
    body_crc: int
    tail: bytes  # TOPICLENGTH+TOPIC+PROPERTIESLENGTH+PROPERTIES
    magic: int
    sysflag: int
    flag: int
    born_timestamp: int | None
    born_host: Host
    reconsume_times: int
    prepared_tx_offset: int
    queued: bool  # gets a queue offset and a consume-queue unit
    wait: bool  # sync flush waits for this message
    delay: bool
    size: int


@dataclass(frozen=True, slots=True)
class PutContext:
    store_host: Host
    max_message_bytes: int
    auto_v2: bool
    store_v6: bool


# Tails (topic + properties fields) of messages that carry at most a tag, by (topic, tags):
# most traffic repeats a handful of these, so encoding and checking them once is enough.
_simple_tails: dict[tuple[str, str | None], tuple[bytes, dict[str, str]]] = {}


def _encode_tail(msg: Message, topic: str, topic_len: int, auto_v2: bool
                 ) -> tuple[dict[str, str], bytes]:
    props: dict[str, str] = {}
    tags = msg.tags
    if tags is not None:
        check_property(PROPERTY_TAGS, tags)
        props[PROPERTY_TAGS] = tags
    if msg.keys:
        keys = msg.keys.split(KEY_SEPARATOR) if isinstance(msg.keys, str) else list(msg.keys)
        for key in keys:
            if not isinstance(key, str) or not key or KEY_SEPARATOR in key:
                raise ValueError(f"key {key!r} must be a non-empty string without spaces")
        props[PROPERTY_KEYS] = KEY_SEPARATOR.join(keys)
    if msg.properties:
        for name, value in msg.properties.items():
            check_property(name, value)
            if name in props:
                raise ValueError(f"property {name!r} is set both as a field and in properties")
            props[name] = value
    props_bytes = encode_properties(props).encode("utf-8") if props else b""
    if len(props_bytes) > MAX_PROPERTIES_BYTES:
        raise Rejected(PutStatus.PROPERTIES_SIZE_EXCEEDED,
                       f"properties are {len(props_bytes)} bytes; the limit is {MAX_PROPERTIES_BYTES}")
    v2 = auto_v2 and topic_len > MAX_V1_TOPIC_BYTES
    topic_bytes = topic.encode("ascii")
    return props, b"".join((topic_field(topic_bytes, v2), _SHORT.pack(len(props_bytes)), props_bytes))


def prepare(msg: Message, ctx: PutContext) -> Prepared:
    if type(msg) is not Message:
        raise TypeError(f"expected a mqstore.Message, got {type(msg).__name__}")
    topic = check_topic(msg.topic)
    topic_len = len(topic)  # ASCII by the topic rule
    if topic_len > MAX_V1_TOPIC_BYTES and (
        topic_len > MAX_TOPIC_BYTES or not topic.startswith(RETRY_PREFIX)
    ):
        raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                       f"topic {topic[:32]!r}... is {topic_len} bytes; the limit is "
                       f"{MAX_V1_TOPIC_BYTES} ({MAX_TOPIC_BYTES} for {RETRY_PREFIX} topics)")
    queue_id = msg.queue_id
    if queue_id is not None:
        queue_id = check_queue_id(queue_id)
    body = msg.body
    if type(body) is not bytes:
        if body is None:
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, "message body is None")
        if not isinstance(body, (bytes, bytearray, memoryview)):
            raise ValueError(f"body must be bytes, got {type(body).__name__}")
        body = bytes(body)
    if len(body) > ctx.max_message_bytes:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                       f"body of {len(body)} bytes exceeds commit_log.max_message_bytes "
                       f"({ctx.max_message_bytes})")
    tags = msg.tags
    simple = not msg.keys and not msg.properties and (tags is None or type(tags) is str)
    cached = _simple_tails.get((topic, tags)) if simple else None
    if cached is not None:
        tail, props = cached
    else:
        props, tail = _encode_tail(msg, topic, topic_len, ctx.auto_v2)
        if simple and len(_simple_tails) < 4096:
            _simple_tails[(topic, tags)] = (tail, props)
    sysflag = msg.sysflag
    if sysflag:
        sysflag = _int_field("sysflag", sysflag, 0, INT32_MAX)
        if sysflag & ~SYSFLAG_USER_BITS:
            raise ValueError(f"sysflag {sysflag:#x} sets bits the store owns (allowed: {SYSFLAG_USER_BITS:#x})")
    if PROPERTY_INNER_NUM in props and not sysflag & SYSFLAG_INNER_BATCH:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, "INNER_NUM property without the INNER_BATCH sysflag")
    if msg.born_host is None:
        born_host = ctx.store_host
        born_v6 = ctx.store_v6
    else:
        born_host = parse_host(msg.born_host)
        born_v6 = len(born_host.address) == 16
    if born_v6:
        sysflag |= SYSFLAG_BORNHOST_V6
    if ctx.store_v6:
        sysflag |= SYSFLAG_STOREHOST_V6
    v2 = ctx.auto_v2 and topic_len > MAX_V1_TOPIC_BYTES
    size = HEADER_STRUCTS[(sysflag >> 4) & 3].size + len(body) + len(tail)
    if size > ctx.max_message_bytes + MAX_RECORD_OVERHEAD:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, f"record of {size} bytes is too large")
    tx = sysflag & SYSFLAG_TX_MASK
    if props:
        wait_text = props.get(PROPERTY_WAIT)
        delay_text = props.get(PROPERTY_DELAY)
        wait = wait_text is None or wait_text.lower() == "true"
        delay = delay_text is not None and delay_text.strip().isdigit() and int(delay_text) > 0
    else:
        wait, delay = True, False
    flag = msg.flag
    if flag:
        flag = _int_field("flag", flag, -(1 << 31), INT32_MAX)
    born_ts = msg.born_timestamp
    if born_ts is not None:
        born_ts = _int_field("born_timestamp", born_ts, -(1 << 63), (1 << 63) - 1)
    reconsume = msg.reconsume_times
    if reconsume:
        reconsume = _int_field("reconsume_times", reconsume, -(1 << 31), INT32_MAX)
    prepared = msg.prepared_tx_offset
    if prepared:
        prepared = _int_field("prepared_tx_offset", prepared, -(1 << 63), (1 << 63) - 1)
    return Prepared(
        topic, queue_id, body, crc32(body), tail, MAGIC_V2 if v2 else MAGIC_V1, sysflag, flag,
        born_ts, born_host, reconsume, prepared, tx == TX_NOT or tx == TX_COMMIT, wait, delay,
        size,
    )


def prepare_batch(messages: Sequence[Message], ctx: PutContext) -> list[Prepared]:
    """``prepare`` every message of a batch; transactions and delays are refused in batches."""
    # A batch allocates a few small objects per message. With the cyclic GC on, every few
    # hundred allocations trigger a scan whose cost grows with all live objects (a producer's
    # own message list included), which costs more than the encoding itself.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        items = []
        for i, msg in enumerate(messages):
            try:
                p = prepare(msg, ctx)
                if not p.queued or p.sysflag & SYSFLAG_TX_MASK:
                    raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                                   "a batch may not hold transaction messages")
                if p.delay:
                    raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                                   "a batch may not hold delayed messages (DELAY > 0)")
            except Rejected as rej:
                rej.index = i
                raise
            except (ValueError, TypeError) as exc:
                raise type(exc)(f"message {i}: {exc}") from None
            items.append(p)
        return items
    finally:
        if gc_was_enabled:
            gc.enable()


def encode_single(p: Prepared, store_host: Host, queue_id: int, queue_offset: int,
                  phys_offset: int, store_timestamp: int) -> bytes:
    header = HEADER_STRUCTS[(p.sysflag >> 4) & 3].pack(
        p.size, p.magic, p.body_crc, queue_id, p.flag, queue_offset, phys_offset, p.sysflag,
        store_timestamp if p.born_timestamp is None else p.born_timestamp,
        p.born_host.address, p.born_host.port, store_timestamp, store_host.address,
        store_host.port, p.reconsume_times, p.prepared_tx_offset, len(p.body),
    )
    return b"".join((header, p.body, p.tail))

"""Turning Message objects into commit-log records: validation, sizing and batch encoding.

``prepare`` checks one message and computes everything that does not depend on where it lands;
``encode_single`` fills in queue offset, physical offset and store time under the put lock.
Batches are encoded column-wise by :mod:`mqstore.append.columns`.

A put answers in one of two ways, as RocketMQ does. A bad argument (a wrong type, a topic
outside the character rule, a negative queue id, a separator inside a property) raises
ValueError or TypeError naming the value. A well-formed message the store will not hold (no
body, too large, a topic too long for the record version) is refused with a status and a
reason, and nothing is written. Every argument of every message is checked before any refusal,
so the answer does not depend on the order of checks nor on how a batch was handed over.
"""

from __future__ import annotations

import gc
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass


from mqstore.format import record_crc
from mqstore.format.hosts import Host, parse_host
from mqstore.format.names import (  # noqa: F401 - the put rules, re-exported
    INT32_MAX, INT32_MIN, INT64_MAX, INT64_MIN, TOPIC_PATTERN, check_int, check_queue_id,
    check_topic, shown,
)
from mqstore.format.properties import (
    KEY_SEPARATOR, MAX_PROPERTIES_BYTES, PROPERTY_DELAY, PROPERTY_INNER_NUM, PROPERTY_KEYS,
    PROPERTY_TAGS, EncodedProperties, PROPERTY_WAIT, check_keys, check_property, check_tags, encode_properties,
)
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.schedule import is_timed
from mqstore.format.transaction import is_half
from mqstore.format.record import (
    HEADER_STRUCTS, MAGIC_V1, MAGIC_V2, MAX_TOPIC_BYTES, MAX_V1_TOPIC_BYTES, SYSFLAG_BORNHOST_V6,
    SYSFLAG_INNER_BATCH, SYSFLAG_STOREHOST_V6, SYSFLAG_TX_MASK, SYSFLAG_USER_BITS, TX_COMMIT,
    TX_NOT, topic_field,
)
from mqstore.hashing import crc32, zlib_crc32
from mqstore.message import Message, PutStatus

RETRY_PREFIX = "%RETRY%"
AUTO_V2_SETTING = "commit_log.auto_v2_on_long_topic"
_SHORT = struct.Struct(">h")
MAX_RECORD_OVERHEAD = 64 * 1024  # a record may exceed the body limit by this much

BODY_IS_NONE = "message body is None"
INNER_NUM_WITHOUT_BATCH = "INNER_NUM property without the INNER_BATCH sysflag"
TX_IN_BATCH = "a batch may not hold transaction messages"
DELAY_IN_BATCH = "a batch may not hold delayed messages (DELAY > 0)"
HALF_IN_BATCH = ("a batch may not hold a transaction's half (TRAN_MSG=true): put it alone, "
                 "as RocketMQ's producers send it")
TIMED_IN_BATCH = ("a batch may not hold timed messages (TIMER_DELIVER_MS, TIMER_DELAY_SEC, "
                  "TIMER_DELAY_MS): put them one by one")


class Rejected(Exception):
    """A message the store refuses with a status (nothing is written)."""

    def __init__(self, status: PutStatus, reason: str, index: int | None = None) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason
        self.index = index


def check_body(body: object) -> bytes | None:
    """The body as bytes; None is kept, since a missing body is refused rather than raised."""
    if type(body) is bytes or body is None:
        return body
    if isinstance(body, (bytearray, memoryview)):
        return bytes(body)
    raise ValueError(f"body must be bytes, got {type(body).__name__}")


def topic_refusal(topic: str, auto_v2: bool) -> str | None:
    """Why a checked topic cannot be stored, or None.

    A V1 record gives the topic length one signed byte. Only %RETRY% topics may be longer, and
    only in V2 records (a short length), which the store writes only when auto_v2 is on: a V1
    record with a longer topic could not be read back.
    """
    size = len(topic)  # ASCII by the character rule
    if size <= MAX_V1_TOPIC_BYTES:
        return None
    if size > MAX_TOPIC_BYTES or not topic.startswith(RETRY_PREFIX):
        return (f"topic {topic[:32]!r}... is {size} bytes; the limit is {MAX_V1_TOPIC_BYTES} "
                f"({MAX_TOPIC_BYTES} for {RETRY_PREFIX} topics)")
    if not auto_v2:
        return (f"topic {topic[:32]!r}... is {size} bytes; a V1 record holds at most "
                f"{MAX_V1_TOPIC_BYTES}, and V2 records are off ({AUTO_V2_SETTING}: false)")
    return None


def body_too_large(size: int, limit: int) -> str:
    return f"body of {size} bytes exceeds commit_log.max_message_bytes ({limit})"


def properties_too_large(size: int) -> str:
    return f"properties are {size} bytes; the limit is {MAX_PROPERTIES_BYTES}"


def record_limit(ctx: "PutContext") -> int:
    # the size field is a signed int whatever the configured body limit
    return min(ctx.max_message_bytes + MAX_RECORD_OVERHEAD, INT32_MAX)


def record_too_large(size: int, ctx: "PutContext") -> str:
    return f"record of {size} bytes is too large (the limit is {record_limit(ctx)})"


def message_properties(tags: object, keys: object, properties: object) -> dict[str, str]:
    """TAGS, KEYS and the user's properties of one message, every string checked.

    All of them share one encoded block, so each is held to the block's rules; otherwise a
    separator inside a key or tag could forge other properties.
    """
    props: dict[str, str] = {}
    if tags is not None:
        props[PROPERTY_TAGS] = check_tags(tags)
    if keys is not None:
        tokens = check_keys(keys)
        if tokens:
            props[PROPERTY_KEYS] = KEY_SEPARATOR.join(tokens)
    if properties is not None:
        if type(properties) is not dict and not isinstance(properties, Mapping):
            raise ValueError(f"properties {properties!r} must be a mapping of names to values")
        for name, value in properties.items():
            check_property(name, value)
            if name == PROPERTY_CRC32:
                continue  # the store's own: a copied message's stale value is dropped
            if record_crc.near_name(name):
                raise ValueError(f"property name {name!r} is within {record_crc.MAX_FLIPPED_BITS}"
                                 f" bits of the store's {PROPERTY_CRC32}, which would read as a "
                                 f"damaged record CRC")
            if name in props:
                raise ValueError(f"property {name!r} is set both as a field and in properties")
            props[name] = value
    return props


def properties_block(props: Mapping[str, str]) -> bytes:
    if type(props) is EncodedProperties and props.text is not None:
        return props.text.encode("ascii")  # its encoding, checked when it was decoded
    return encode_properties(props).encode("utf-8") if props else b""


def encode_tail(topic: str, v2: bool, block: bytes) -> bytes:
    """TOPICLENGTH+TOPIC+PROPERTIESLENGTH+PROPERTIES of an accepted message."""
    return b"".join((topic_field(topic.encode("ascii"), v2), _SHORT.pack(len(block)), block))


def is_delayed(props: Mapping[str, str]) -> bool:
    text = props.get(PROPERTY_DELAY)
    if text is None:
        return False
    text = text.strip()
    # isdecimal, not isdigit: int() cannot parse digits such as "\u00b2"
    return text.isdecimal() and int(text) > 0


def waits(props: Mapping[str, str]) -> bool:
    text = props.get(PROPERTY_WAIT)
    return text is None or text.lower() == "true"


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
    answer_queue_id: int | None = None  # what the put answers, when not queue_id (a delay's)


@dataclass(frozen=True, slots=True)
class PutContext:
    store_host: Host
    max_message_bytes: int
    auto_v2: bool
    store_v6: bool
    record_crc: bool = False  # append the __CRC32# property (format.record_crc)


# Tails of accepted messages that carry at most a tag, keyed by all their bytes depend on:
# topic, tag, record version and whether the record CRC is reserved. Most traffic repeats a
# handful of these, so checking and encoding each once is enough; stores with different
# settings in one process share it safely.
_simple_tails: dict[tuple[str, str | None, bool, bool], tuple[bytes, dict[str, str]]] = {}
_SIMPLE_TAILS_MAX = 4096


def tail_for(topic: str, v2: bool, crc: bool, tags: object, keys: object, properties: object
             ) -> tuple[bytes, dict[str, str]]:
    """Checked tail and properties of a message whose topic was checked and accepted."""
    simple = keys is None and properties is None and (tags is None or type(tags) is str)
    if simple:
        cached = _simple_tails.get((topic, tags, v2, crc))
        if cached is not None:
            return cached
    props = message_properties(tags, keys, properties)
    return finish_tail(topic, v2, crc, props, (topic, tags, v2, crc) if simple else None), props


def finish_tail(topic: str, v2: bool, crc: bool, props: dict[str, str],
                cache_key: tuple | None) -> bytes:
    """The tail of checked properties (with the record CRC's bytes reserved when ``crc``),
    refused when their block outgrows its length field."""
    block = properties_block(props)
    if crc:
        block = record_crc.reserve(block)
    if len(block) > MAX_PROPERTIES_BYTES:
        raise Rejected(PutStatus.PROPERTIES_SIZE_EXCEEDED, properties_too_large(len(block)))
    tail = encode_tail(topic, v2, block)
    if cache_key is not None and len(_simple_tails) < _SIMPLE_TAILS_MAX:
        _simple_tails[cache_key] = (tail, props)
    return tail


def _check_sysflag(sysflag: object) -> int:
    sysflag = check_int("sysflag", sysflag, 0, INT32_MAX)
    if sysflag & ~SYSFLAG_USER_BITS:
        raise ValueError(f"sysflag {sysflag:#x} sets bits the store owns (allowed: {SYSFLAG_USER_BITS:#x})")
    return sysflag


def prepare(msg: Message, ctx: PutContext) -> Prepared:
    if type(msg) is not Message:
        raise TypeError(f"expected a mqstore.Message, got {type(msg).__name__}")
    # Arguments first, each raising, so a bad argument is never hidden behind a refusal.
    topic = check_topic(msg.topic)
    queue_id = msg.queue_id
    if queue_id is not None:
        queue_id = check_queue_id(queue_id)
    body = msg.body
    if type(body) is not bytes:
        body = check_body(body)
    sysflag, flag, born_ts = msg.sysflag, msg.flag, msg.born_timestamp
    reconsume, prepared = msg.reconsume_times, msg.prepared_tx_offset
    # Nearly all messages leave these at their defaults, which need no range check: one test
    # keeps the checks off the common path. Types go first, since an array's truth raises.
    if (type(sysflag) is not int or type(flag) is not int or type(reconsume) is not int
            or type(prepared) is not int or sysflag or flag or reconsume or prepared):
        sysflag, flag, born_ts, reconsume, prepared = _checked_ints(msg)
    elif born_ts is not None and not (type(born_ts) is int and INT64_MIN <= born_ts <= INT64_MAX):
        born_ts = check_int("born_timestamp", born_ts, INT64_MIN, INT64_MAX)  # raises
    if msg.born_host is None:
        born_host, born_v6 = ctx.store_host, ctx.store_v6
    else:
        born_host = parse_host(msg.born_host)
        born_v6 = len(born_host.address) == 16
    long_topic = len(topic) > MAX_V1_TOPIC_BYTES
    v2 = long_topic and ctx.auto_v2
    tail, props, cache_key = _checked_properties(msg, topic, v2, ctx.record_crc)

    # Refusals: the message is well formed but the store will not hold it.
    reason = topic_refusal(topic, ctx.auto_v2) if long_topic else None
    if reason is None:
        if body is None:
            reason = BODY_IS_NONE
        elif len(body) > ctx.max_message_bytes:
            reason = body_too_large(len(body), ctx.max_message_bytes)
    if reason is not None:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, reason)
    if tail is None:
        tail = finish_tail(topic, v2, ctx.record_crc, props, cache_key)
    if PROPERTY_INNER_NUM in props and not sysflag & SYSFLAG_INNER_BATCH:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, INNER_NUM_WITHOUT_BATCH)
    sysflag |= (SYSFLAG_BORNHOST_V6 if born_v6 else 0) | (
        SYSFLAG_STOREHOST_V6 if ctx.store_v6 else 0)
    size = HEADER_STRUCTS[(sysflag >> 4) & 3].size + len(body) + len(tail)
    if size > ctx.max_message_bytes + MAX_RECORD_OVERHEAD or size > INT32_MAX:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, record_too_large(size, ctx))
    tx = sysflag & SYSFLAG_TX_MASK
    if props:
        # waits() inlined and is_delayed() guarded: this runs for every message of every put
        wait_text = props.get(PROPERTY_WAIT)
        wait = wait_text is None or wait_text.lower() == "true"
        delay = PROPERTY_DELAY in props and is_delayed(props)
    else:
        wait, delay = True, False
    return Prepared(
        topic, queue_id, body, crc32(body), tail, MAGIC_V2 if v2 else MAGIC_V1, sysflag, flag,
        born_ts, born_host, reconsume, prepared, tx == TX_NOT or tx == TX_COMMIT, wait, delay,
        size,
    )


def _checked_ints(msg: Message) -> tuple[int, int, int | None, int, int]:
    """sysflag, flag, born_timestamp, reconsume_times and prepared_tx_offset of ``msg``,
    checked in that order (raising ValueError) and made plain ints."""
    sysflag = msg.sysflag
    if type(sysflag) is not int or sysflag:  # each default still skips its own check
        sysflag = _check_sysflag(sysflag)
    flag = msg.flag
    if type(flag) is not int or flag:
        flag = check_int("flag", flag, INT32_MIN, INT32_MAX)
    born_ts = msg.born_timestamp
    if born_ts is not None:
        born_ts = check_int("born_timestamp", born_ts, INT64_MIN, INT64_MAX)
    reconsume = msg.reconsume_times
    if type(reconsume) is not int or reconsume:
        reconsume = check_int("reconsume_times", reconsume, INT32_MIN, INT32_MAX)
    prepared = msg.prepared_tx_offset
    if type(prepared) is not int or prepared:
        prepared = check_int("prepared_tx_offset", prepared, INT64_MIN, INT64_MAX)
    return sysflag, flag, born_ts, reconsume, prepared


def _checked_properties(msg: Message, topic: str, v2: bool, crc: bool
                        ) -> tuple[bytes | None, dict[str, str], tuple | None]:
    """The checked properties of ``msg``, with its tail when one is cached already.

    Without a cached tail, the tail is left to ``finish_tail`` (under the returned cache key,
    if the message may be cached): it can be refused, which must wait until the message's own
    refusals have had their say.
    """
    tags = msg.tags
    if type(msg.properties) is EncodedProperties and msg.properties.text is not None \
            and tags is None and msg.keys is None:
        props = msg.properties  # each property checked as it was decoded
        if PROPERTY_CRC32 not in props and not any(map(record_crc.near_name, props)):
            return None, props, None
    if msg.keys is None and msg.properties is None and (tags is None or type(tags) is str):
        cache_key = (topic, tags, v2, crc)
        cached = _simple_tails.get(cache_key)
        if cached is not None:
            return cached[0], cached[1], cache_key
        return None, message_properties(tags, None, None), cache_key
    return None, message_properties(tags, msg.keys, msg.properties), None


def at_message(index: int, exc: Exception) -> Exception:
    """The same complaint about message ``index`` of a batch (as ValueError or TypeError)."""
    # not type(exc): subclasses such as UnicodeError take other constructor arguments
    return (ValueError if isinstance(exc, ValueError) else TypeError)(f"message {index}: {exc}")


def prepare_batch(messages: Sequence[Message], ctx: PutContext) -> list[Prepared]:
    """``prepare`` every message of a batch; transactions and delays are refused in batches.

    A bad argument anywhere raises, even after a refused message; otherwise the first refused
    message refuses the batch.
    """
    # A batch allocates a few small objects per message. With the cyclic GC on, every few
    # hundred allocations trigger a scan whose cost grows with all live objects (a producer's
    # own message list included), which costs more than the encoding itself.
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        items = []
        refused: Rejected | None = None
        for i, msg in enumerate(messages):
            try:
                p = prepare(msg, ctx)
                if not p.queued or p.sysflag & SYSFLAG_TX_MASK:
                    raise Rejected(PutStatus.MESSAGE_ILLEGAL, TX_IN_BATCH)
                if p.delay:
                    raise Rejected(PutStatus.MESSAGE_ILLEGAL, DELAY_IN_BATCH)
                if msg.properties and is_timed(msg.properties):
                    raise Rejected(PutStatus.MESSAGE_ILLEGAL, TIMED_IN_BATCH)
                if msg.properties and is_half(msg.properties):
                    raise Rejected(PutStatus.MESSAGE_ILLEGAL, HALF_IN_BATCH)
            except Rejected as rej:
                if refused is None:
                    rej.index = i
                    refused = rej
                continue
            except (ValueError, TypeError) as exc:
                raise at_message(i, exc) from None
            if refused is None:
                items.append(p)
        if refused is not None:
            raise refused
        return items
    finally:
        if gc_was_enabled:
            gc.enable()


def encode_single(p: Prepared, store_host: Host, queue_id: int, queue_offset: int,
                  phys_offset: int, store_timestamp: int, crc: bool = False) -> bytes:
    """The record of ``p``; with ``crc`` its tail ends with the reserved record-CRC bytes,
    which are filled in here."""
    header = HEADER_STRUCTS[(p.sysflag >> 4) & 3].pack(
        p.size, p.magic, p.body_crc, queue_id, p.flag, queue_offset, phys_offset, p.sysflag,
        store_timestamp if p.born_timestamp is None else p.born_timestamp,
        p.born_host.address, p.born_host.port, store_timestamp, store_host.address,
        store_host.port, p.reconsume_times, p.prepared_tx_offset, len(p.body),
    )
    tail = p.tail
    if crc:
        value = zlib_crc32(tail[:-record_crc.RESERVED], zlib_crc32(p.body, zlib_crc32(header)))
        tail = record_crc.stamp(tail, value & 0x7FFFFFFF)
    return b"".join((header, p.body, tail))

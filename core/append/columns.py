"""Batches as columns: what put_batch writes, whichever way the caller handed it over.

A batch arrives as a ``MessageBatch`` of columns, where scalars apply to every message and only
bodies are per message in the common case, or as a list of ``Message`` objects, read into the
MessageBatch it stands for when there is one (C-level passes over their fields: one flag, born
time and host, no store-owned fields set), else prepared one by one. Either way it becomes one
``Columns`` object, encoded per block as one numpy array of whole records when the records are
alike (one tail, one body length), else as a header array plus a single join.

A ``MessageBatch`` is checked column by column, once per distinct value where it can be. That
only decides whether the batch is clean: when a check fails, its messages are spelled out and
prepared one by one, so it raises or is refused exactly as the equivalent Message list would be.
A clean batch whose messages share their tag and properties (keys may differ) runs no Python
code per message; per-message tags or properties are encoded message by message.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import chain, repeat
from operator import attrgetter
from typing import Any

import numpy as np

from mqstore.append.encoding import (
    BODY_IS_NONE, DELAY_IN_BATCH, HALF_IN_BATCH, INNER_NUM_WITHOUT_BATCH, INT32_MAX,
    INT32_MIN, INT64_MAX, INT64_MIN, TIMED_IN_BATCH, MAX_RECORD_OVERHEAD, Prepared, PutContext, Rejected, at_message,
    body_too_large, check_body, check_int, check_queue_id, check_topic, finish_tail, is_delayed,
    message_properties, prepare_batch, record_too_large, tail_for, topic_refusal, waits,
)
from mqstore.format import record_crc
from mqstore.format.hosts import Host, parse_host
from mqstore.format.properties import (
    MAX_PROPERTIES_BYTES, PROPERTY_DELAY, PROPERTY_INNER_NUM, PROPERTY_KEYS, PROPERTY_TAGS,
    check_tags,
)
from mqstore.format.record import (
    HEADER_STRUCTS, MAGIC_V1, MAGIC_V2, MAX_V1_TOPIC_BYTES, SYSFLAG_BORNHOST_V6,
    SYSFLAG_STOREHOST_V6, header_dtype, record_dtype, topic_field,
)
from mqstore.format.schedule import is_timed
from mqstore.format.transaction import is_half
from mqstore.hashing import zlib_crc32
from mqstore.message import Message, MessageBatch, PutStatus


@dataclass
class Columns:
    n: int
    topics: list[str]
    queue_ids: np.ndarray | None  # None: the queue selector picks
    bodies: list[bytes]
    tails: list[bytes]
    sizes: np.ndarray  # int64
    body_lens: np.ndarray  # int64
    body_crcs: Any  # array or list, one per message
    magics: Any  # int or per-message
    sysflags: Any
    flags: Any
    born_timestamps: Any  # int, None (= store time) or a list with None entries
    born_hosts: Host | list[Host]
    reconsume_times: Any
    prepared_tx_offsets: Any
    wait: bool
    select_inputs: Sequence[Any]  # what the queue selector sees, one per message
    shared_tail: bytes | None = None  # every message's tail, when they all have the same
    record_crc: bool = False  # tails end with the record CRC's reserved bytes (format.record_crc)


def columns_from_prepared(items: Sequence[Prepared], messages: Sequence[Message],
                          record_crc: bool = False) -> Columns:
    ids = [p.queue_id for p in items]
    hosts = {p.born_host for p in items}
    return Columns(
        n=len(items), topics=[p.topic for p in items],
        queue_ids=None if None in ids else np.array(ids, dtype=np.int64),
        bodies=[p.body for p in items], tails=[p.tail for p in items],
        sizes=np.array([p.size for p in items], dtype=np.int64),
        body_lens=np.array([len(p.body) for p in items], dtype=np.int64),
        body_crcs=[p.body_crc for p in items], magics=[p.magic for p in items],
        sysflags=[p.sysflag for p in items], flags=[p.flag for p in items],
        born_timestamps=[p.born_timestamp for p in items],
        born_hosts=hosts.pop() if len(hosts) == 1 else [p.born_host for p in items],
        reconsume_times=[p.reconsume_times for p in items],
        prepared_tx_offsets=[p.prepared_tx_offset for p in items],
        wait=any(p.wait for p in items), select_inputs=messages, record_crc=record_crc,
    )


def _per_message(value, n: int, what: str) -> list | None:
    """None for a value shared by every message, else the per-message list (checked for length)."""
    if value is None or isinstance(value, (str, bytes, bytearray, Mapping)) \
            or not isinstance(value, Sequence):
        return None
    if len(value) != n:
        raise ValueError(f"{what} has {len(value)} entries for {n} bodies")
    return list(value)


class _Shape:
    """A MessageBatch's columns as shared values or per-message lists.

    Errors here concern the batch's own form (lengths, column kinds); they have no equivalent
    in a Message list, so they raise before any message is looked at.
    """

    def __init__(self, batch: MessageBatch) -> None:
        bodies = batch.bodies
        if isinstance(bodies, (bytes, bytearray, str)) or not isinstance(bodies, Sequence):
            raise ValueError(f"MessageBatch.bodies must be a sequence of bodies, "
                             f"got {type(bodies).__name__}")
        self.n = n = len(bodies)
        if not n:
            raise ValueError("MessageBatch.bodies is empty")
        self.batch = batch
        self.bodies = bodies
        self.topics = _per_message(batch.topic, n, "topic") or [batch.topic] * n
        self.tags = _per_message(batch.tags, n, "tags")
        self.properties = _per_message(batch.properties, n, "properties")
        self.keys = None if batch.keys is None else _per_message(batch.keys, n, "keys")
        if batch.keys is not None and self.keys is None:
            raise ValueError("MessageBatch.keys must hold one key list (or None) per body")
        queue_ids = batch.queue_ids
        if isinstance(queue_ids, np.ndarray) and queue_ids.ndim:
            if queue_ids.shape != (n,):
                raise ValueError(f"MessageBatch.queue_ids has shape {queue_ids.shape} "
                                 f"for {n} bodies")
        elif not isinstance(queue_ids, np.ndarray):
            per_message = _per_message(queue_ids, n, "queue_ids")
            queue_ids = queue_ids if per_message is None else per_message
        self.queue_ids = queue_ids
        self.shared_tail = self.tags is None and self.properties is None and self.keys is None

    def _queue_id(self, i: int):
        q = self.queue_ids
        return q[i] if isinstance(q, (list, np.ndarray)) and np.ndim(q) else q

    def message(self, i: int) -> Message:
        """Message ``i`` of the batch, as a Message."""
        b = self.batch
        return Message(topic=self.topics[i], body=self.bodies[i],
                       tags=b.tags if self.tags is None else self.tags[i],
                       keys=None if self.keys is None else self.keys[i],
                       properties=b.properties if self.properties is None else self.properties[i],
                       queue_id=self._queue_id(i), flag=b.flag, born_timestamp=b.born_timestamp,
                       born_host=b.born_host)

    def messages(self) -> list[Message]:
        """The batch as the Message list it stands for."""
        return [self.message(i) for i in range(self.n)]


def columns_from_batch(batch: MessageBatch, ctx: PutContext) -> Columns:
    shape = _Shape(batch)
    try:
        return _columns(shape, ctx)
    except (Rejected, ValueError, TypeError) as exc:
        found = exc
    # Out of the except block, so the answer does not carry the columnar complaint along.
    prepare_batch(shape.messages(), ctx)
    raise found  # a complaint the message list does not share would be a checking gap


# Message fields read column by column...
_PER_MESSAGE = tuple(map(attrgetter, ("topic", "body", "tags", "keys", "queue_id")))
# ...and those a batch nearly always shares, read as one tuple per message.
_SHARED = attrgetter("flag", "sysflag", "reconsume_times", "prepared_tx_offset",
                     "born_timestamp", "born_host", "properties")
_PROPERTIES = attrgetter("properties")
# A value of one of these types equals no value of another (bool and float are not int), so
# tuples of them that are equal hold the same types field by field.
_PLAIN_TYPES = frozenset({int, str, dict, type(None)})


def columns_from_messages(messages: list[Message], ctx: PutContext) -> Columns:
    """A list of Messages as columns: through the MessageBatch it stands for when there is one
    (the usual case), else, or when that batch has any complaint, prepared one by one, which
    gives the answer (raise or refusal) a Message list gets."""
    batch = _as_batch(messages)
    if batch is not None:
        try:
            cols = _columns(_Shape(batch), ctx)
        except (Rejected, ValueError, TypeError):
            pass
        else:
            cols.select_inputs = messages  # a selector sees the caller's own messages
            return cols
    return columns_from_prepared(prepare_batch(messages, ctx), messages, ctx.record_crc)


def _shared(column: Sequence) -> tuple[bool, Any]:
    """(True, value) when every entry of ``column`` is the same value of the same type."""
    first = column[0]
    return (column.count(first) == len(column) and len(set(map(type, column))) == 1), first


def _as_batch(messages: list[Message]) -> MessageBatch | None:
    """The MessageBatch a Message list stands for, or None when none does: a field the store
    owns (sysflag, reconsume times, prepared offset) not left at 0, a flag, born time, born
    host or properties that differ between messages (or are of an unusual type), or explicit
    queue ids next to None ones. Only C-level passes over the fields (map, count, set), no
    Python code per message."""
    n = len(messages)
    try:
        if set(map(type, messages)) != {Message}:
            return None
        shared = list(map(_SHARED, messages))
        first = shared[0]
        if shared.count(first) != n or not _PLAIN_TYPES.issuperset(
                map(type, chain.from_iterable(shared))):
            return None
        flag, sysflag, reconsume, prepared, born_ts, born_host, props = first
        if type(sysflag) is not int or sysflag or type(reconsume) is not int or reconsume \
                or type(prepared) is not int or prepared:
            return None
        topics, bodies, tags, keys, queue_ids = [list(map(get, messages))
                                                 for get in _PER_MESSAGE]
        tags_same, tag = _shared(tags)
        no_keys = keys.count(None) == n and set(map(type, keys)) == {type(None)}
        no_ids = queue_ids.count(None)
        if no_ids == n:
            no_ids = set(map(type, queue_ids)) == {type(None)}
        elif no_ids:
            return None  # the selector picks for some: each explicit id is checked on its own
    except Exception:  # an odd field (one whose == does not answer a bool): one by one
        return None
    # A shared value must read as one value in a MessageBatch, not as a column of them.
    tags_same = tags_same and (tag is None or type(tag) is str)
    if props is not None:  # equal dicts may still differ in order, and so in their bytes
        props = list(map(_PROPERTIES, messages))
    return MessageBatch(
        topic=topics, bodies=bodies, queue_ids=None if no_ids else queue_ids,
        tags=tag if tags_same else tags, keys=None if no_keys else keys, properties=props,
        flag=flag, born_timestamp=born_ts, born_host=born_host)


def _bodies(shape: _Shape, ctx: PutContext) -> tuple[list[bytes], np.ndarray]:
    bodies = shape.bodies
    if set(map(type, bodies)) != {bytes}:
        bodies = [check_body(b) for b in bodies]
        if None in bodies:
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, BODY_IS_NONE, bodies.index(None))
    lens = np.fromiter(map(len, bodies), dtype=np.int64, count=shape.n)
    too_big = np.flatnonzero(lens > ctx.max_message_bytes)
    if len(too_big):
        i = int(too_big[0])
        raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                       body_too_large(int(lens[i]), ctx.max_message_bytes), i)
    return list(bodies), lens


def _check_topics(topics: list[str], ctx: PutContext) -> dict[str, bool]:
    """Each distinct topic checked once; whether it takes a V2 record."""
    v2 = {}
    for t in dict.fromkeys(topics):
        check_topic(t)
        if len(t) > MAX_V1_TOPIC_BYTES:
            reason = topic_refusal(t, ctx.auto_v2)
            if reason is not None:
                raise Rejected(PutStatus.MESSAGE_ILLEGAL, reason, topics.index(t))
        v2[t] = ctx.auto_v2 and len(t) > MAX_V1_TOPIC_BYTES
    return v2


def _tails(shape: _Shape, v2: dict[str, bool], crc: bool
           ) -> tuple[list[bytes], list[dict], bytes | None]:
    """Each message's tail, the distinct property sets they carry, and the one tail all
    messages share (or None)."""
    b, topics = shape.batch, shape.topics
    if shape.shared_tail:
        props = message_properties(b.tags, None, b.properties)  # checked once for the batch
        by_topic = {t: finish_tail(t, v2[t], crc, props, None) for t in v2}
        if len(by_topic) == 1:
            tail = by_topic[topics[0]]
            return [tail] * shape.n, [props], tail
        return list(map(by_topic.__getitem__, topics)), [props], None
    keyed = _keyed_tails(shape, v2, crc)
    if keyed is not None:
        return keyed, [{}], None  # TAGS and KEYS only: nothing a batch may not hold, no WAIT
    tags, keys, properties = shape.tags, shape.keys, shape.properties
    tails, seen = [], []
    for i, t in enumerate(topics):
        tail, props = tail_for(t, v2[t], crc, b.tags if tags is None else tags[i],
                               None if keys is None else keys[i],
                               b.properties if properties is None else properties[i])
        tails.append(tail)
        seen.append(props)
    return tails, seen, None


_SHORT_PACK = struct.Struct(">h").pack
_CRC_PLACEHOLDER = record_crc.PLACEHOLDER.decode("ascii")
_NONE = type(None)


def _keyed_tails(shape: _Shape, v2: dict[str, bool], crc: bool) -> list[bytes] | None:
    """Tails of a batch whose messages differ only in their keys (one tag or none, no other
    properties), built with C-level passes over all keys at once; None when the batch does
    not fit this (or a key needs a closer look: non-ASCII, a separator, a space, empty),
    and ``tail_for`` then checks and builds message by message."""
    b = shape.batch
    if shape.tags is not None or shape.properties is not None or b.properties is not None:
        return None
    entries = shape.keys
    kinds = set(map(type, entries))
    if not kinds <= {list, tuple, _NONE}:
        return None
    if _NONE in kinds:
        entries = [() if e is None else e for e in entries]
    tokens = list(chain.from_iterable(entries))
    if tokens:
        if set(map(type, tokens)) != {str} or not all(tokens):
            return None
        text = " ".join(tokens)
        # every space is a separator: no token holds one
        if not text.isascii() or "\x01" in text or "\x02" in text \
                or text.count(" ") != len(tokens) - 1:
            return None
    head = "" if b.tags is None else f"{PROPERTY_TAGS}\x01{check_tags(b.tags)}\x02"
    end = _CRC_PLACEHOLDER if crc else ""  # every block ends with a separator, or is empty
    texts = list(map(" ".join, entries))
    blocks = list(map(f"{head}{PROPERTY_KEYS}\x01{{}}\x02{end}".format, texts))
    if "" in texts:  # messages without keys carry no KEYS property
        blocks = [block if t else head + end for block, t in zip(blocks, texts)]
    raw = list(map(str.encode, blocks))
    lens = list(map(len, raw))
    if max(lens) > MAX_PROPERTIES_BYTES:
        return None
    fields = {t: topic_field(t.encode("ascii"), v2[t]) for t in v2}
    topic_fields = repeat(fields[shape.topics[0]]) if len(fields) == 1 else map(
        fields.__getitem__, shape.topics)
    return list(map(b"".join, zip(topic_fields, map(_SHORT_PACK, lens), raw)))


def _queue_ids(shape: _Shape) -> np.ndarray | None:
    q = shape.queue_ids
    if q is None:
        return None
    if not isinstance(q, (list, np.ndarray)) or not np.ndim(q):
        return np.full(shape.n, check_queue_id(q), dtype=np.int64)
    # numpy would turn True into 1 and 2**70 into an object array: only plain ints go fast
    arr = np.asarray(q) if isinstance(q, np.ndarray) or _all_ints(q) else None
    if arr is None or arr.dtype.kind not in "iu" or ((arr < 0) | (arr > INT32_MAX)).any():
        return np.array([_queue_id_at(i, v) for i, v in enumerate(q)], dtype=np.int64)
    return arr.astype(np.int64)


def _all_ints(values: list) -> bool:
    return all(t is int or issubclass(t, np.integer) for t in set(map(type, values)))


def _queue_id_at(i: int, value) -> int:
    try:
        return check_queue_id(value)
    except ValueError as exc:
        raise at_message(i, exc) from None


def _columns(shape: _Shape, ctx: PutContext) -> Columns:
    b, n, topics = shape.batch, shape.n, shape.topics
    bodies, lens = _bodies(shape, ctx)
    v2 = _check_topics(topics, ctx)
    tails, props_seen, shared_tail = _tails(shape, v2, ctx.record_crc)
    wait = _check_batch_properties(props_seen)

    born_host = ctx.store_host if b.born_host is None else parse_host(b.born_host)
    sysflag = (SYSFLAG_BORNHOST_V6 if born_host.is_v6 else 0) | (
        SYSFLAG_STOREHOST_V6 if ctx.store_v6 else 0)
    magics = MAGIC_V1 if not any(v2.values()) else [
        MAGIC_V2 if v2[t] else MAGIC_V1 for t in topics]
    sizes = _record_sizes(sysflag, lens, tails, shared_tail, ctx)

    queue_ids = _queue_ids(shape)
    flag = check_int("flag", b.flag, INT32_MIN, INT32_MAX)
    born_ts = b.born_timestamp
    if born_ts is not None:
        born_ts = check_int("born_timestamp", born_ts, INT64_MIN, INT64_MAX)
    crcs = np.fromiter(map(zlib_crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
    return Columns(
        n=n, topics=topics, queue_ids=queue_ids, bodies=bodies, tails=tails, sizes=sizes,
        body_lens=lens, body_crcs=crcs, magics=magics, sysflags=sysflag, flags=flag,
        born_timestamps=born_ts, born_hosts=born_host, reconsume_times=0,
        prepared_tx_offsets=0, wait=wait, select_inputs=_SelectInputs(shape),
        shared_tail=shared_tail, record_crc=ctx.record_crc,
    )


def _check_batch_properties(props_seen: list[dict]) -> bool:
    """Refuses what a batch may not carry; whether sync flush waits for the batch."""
    wait = False
    for i, p in enumerate(props_seen):  # one shared set stands for message 0
        if PROPERTY_INNER_NUM in p:
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, INNER_NUM_WITHOUT_BATCH, i)
        if PROPERTY_DELAY in p and is_delayed(p):
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, DELAY_IN_BATCH, i)
        if is_timed(p):
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, TIMED_IN_BATCH, i)
        if is_half(p):
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, HALF_IN_BATCH, i)
        wait = wait or waits(p)
    return wait


def _record_sizes(sysflag: int, lens: np.ndarray, tails: list[bytes], shared_tail: bytes | None,
                  ctx: PutContext) -> np.ndarray:
    """Each record's size; the largest alone is checked, since it decides for the batch."""
    tail_lens = len(shared_tail) if shared_tail is not None else np.fromiter(
        map(len, tails), dtype=np.int64, count=len(tails))
    sizes = HEADER_STRUCTS[(sysflag >> 4) & 3].size + lens + tail_lens
    biggest = int(sizes.max())
    if biggest > ctx.max_message_bytes + MAX_RECORD_OVERHEAD or biggest > INT32_MAX:
        raise Rejected(PutStatus.MESSAGE_ILLEGAL, record_too_large(biggest, ctx),
                       int(np.argmax(sizes)))
    return sizes


class _SelectInputs(Sequence):
    """Message views for the queue selector, built only when it is asked for one."""

    def __init__(self, shape: _Shape) -> None:
        self._shape = shape

    def __len__(self) -> int:
        return self._shape.n

    def __getitem__(self, i):
        return self._shape.message(i)


def _column(value, lo: int, hi: int):
    if isinstance(value, (list, np.ndarray)):
        return value[lo:hi]
    return value


def encode_columns(cols: Columns, lo: int, hi: int, store_host: Host, queue_ids: np.ndarray,
                   queue_offsets: np.ndarray, phys_offsets: np.ndarray, store_timestamp: int
                   ) -> bytes:
    """Records ``lo:hi`` of ``cols`` back to back; offsets and the store time already chosen."""
    n = hi - lo
    hosts = cols.born_hosts
    if isinstance(hosts, Host):
        layout = (hosts.is_v6, store_host.is_v6)
    else:
        families = {h.is_v6 for h in hosts[lo:hi]}
        if len(families) > 1:
            return b"".join(
                encode_columns(cols, i, i + 1, store_host, queue_ids, queue_offsets,
                               phys_offsets, store_timestamp) for i in range(lo, hi))
        layout = (families.pop(), store_host.is_v6)
    lens = cols.body_lens[lo:hi]
    tail = cols.shared_tail
    # Records alike (one topic and tail, bodies of one length) are one array of whole records:
    # every field, the bodies and the tail are each one array assignment, with no join.
    alike = tail is not None and lens.min() == lens.max()
    arr = np.empty(n, dtype=record_dtype(*layout, int(lens[0]), len(tail)) if alike
                   else header_dtype(*layout))
    arr["total_size"] = cols.sizes[lo:hi]
    arr["magic"] = _column(cols.magics, lo, hi)
    arr["body_crc"] = _column(cols.body_crcs, lo, hi)
    arr["queue_id"] = queue_ids[lo:hi]
    arr["flag"] = _column(cols.flags, lo, hi)
    arr["queue_offset"] = queue_offsets[lo:hi]
    arr["phys_offset"] = phys_offsets[lo:hi]
    arr["sysflag"] = _column(cols.sysflags, lo, hi)
    born = cols.born_timestamps
    if isinstance(born, list):
        arr["born_timestamp"] = [store_timestamp if b is None else b for b in born[lo:hi]]
    else:
        arr["born_timestamp"] = store_timestamp if born is None else born
    if isinstance(hosts, Host):
        arr["born_addr"] = np.void(hosts.address)
        arr["born_port"] = hosts.port
    else:
        arr["born_addr"] = np.array([h.address for h in hosts[lo:hi]], dtype=arr.dtype["born_addr"])
        arr["born_port"] = [h.port for h in hosts[lo:hi]]
    arr["store_timestamp"] = store_timestamp
    arr["store_addr"] = np.void(store_host.address)
    arr["store_port"] = store_host.port
    arr["reconsume_times"] = _column(cols.reconsume_times, lo, hi)
    arr["prepared_tx_offset"] = _column(cols.prepared_tx_offsets, lo, hi)
    arr["body_len"] = lens
    if alike:
        if lens[0]:
            arr["body"] = cols.bodies[lo:hi]
        arr["tail"] = np.void(tail)
        out = arr.view(np.uint8)
    else:
        width = arr.dtype.itemsize
        raw = arr.tobytes()
        pieces: list = [None] * (3 * n)
        pieces[0::3] = map(raw.__getitem__, _header_slices(n, width))  # a C loop, not Python's
        pieces[1::3] = cols.bodies[lo:hi]
        pieces[2::3] = cols.tails[lo:hi]
        if not cols.record_crc:
            return b"".join(pieces)
        out = np.frombuffer(bytearray(b"".join(pieces)), dtype=np.uint8)
    if cols.record_crc:
        record_crc.stamp_records(out, cols.sizes[lo:hi])
    return memoryview(out)


@lru_cache(maxsize=16)
def _header_slices(n: int, width: int) -> list[slice]:
    """Where each of ``n`` packed headers lies (batches repeat their sizes: cached)."""
    return list(map(slice, range(0, n * width, width), range(width, (n + 1) * width, width)))


def encode_batch(items: Sequence[Prepared], store_host: Host, queue_ids: np.ndarray,
                 queue_offsets: np.ndarray, phys_offsets: np.ndarray, store_timestamp: int,
                 record_crc: bool = False) -> bytes:
    """Records for prepared messages laid out back to back (offsets already assigned)."""
    cols = columns_from_prepared(items, items, record_crc)
    return bytes(encode_columns(cols, 0, cols.n, store_host, queue_ids, queue_offsets,
                                phys_offsets, store_timestamp))

"""Batches as columns: what put_batch writes, whichever way the caller handed it over.

A batch arrives as a list of ``Message`` objects (each prepared and checked on its own) or as a
``MessageBatch`` of columns, where scalars apply to every message and only bodies are per
message in the common case. Either way it becomes one ``Columns`` object, and records are
encoded from it with one numpy header array per block plus a single join.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from mqstore.appender import (
    INT32_MAX, Prepared, PutContext, Rejected, _encode_tail, _int_field, check_queue_id,
    check_topic,
)
from mqstore.format.hosts import Host, parse_host
from mqstore.format.properties import PROPERTY_DELAY, PROPERTY_INNER_NUM, PROPERTY_WAIT
from mqstore.format.record import (
    HEADER_STRUCTS, MAGIC_V1, MAGIC_V2, MAX_TOPIC_BYTES, MAX_V1_TOPIC_BYTES,
    SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, header_dtype,
)
from mqstore.message import Message, MessageBatch, PutStatus


@dataclass
class Columns:
    n: int
    topics: list[str]
    queue_ids: np.ndarray | None  # None: the queue selector picks
    bodies: list[bytes]
    tails: list[bytes]
    sizes: np.ndarray  # int64
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


def columns_from_prepared(items: Sequence[Prepared], messages: Sequence[Message]) -> Columns:
    ids = [p.queue_id for p in items]
    hosts = {p.born_host for p in items}
    return Columns(
        n=len(items), topics=[p.topic for p in items],
        queue_ids=None if None in ids else np.array(ids, dtype=np.int64),
        bodies=[p.body for p in items], tails=[p.tail for p in items],
        sizes=np.array([p.size for p in items], dtype=np.int64),
        body_crcs=[p.body_crc for p in items], magics=[p.magic for p in items],
        sysflags=[p.sysflag for p in items], flags=[p.flag for p in items],
        born_timestamps=[p.born_timestamp for p in items],
        born_hosts=hosts.pop() if len(hosts) == 1 else [p.born_host for p in items],
        reconsume_times=[p.reconsume_times for p in items],
        prepared_tx_offsets=[p.prepared_tx_offset for p in items],
        wait=any(p.wait for p in items), select_inputs=messages,
    )


def _per_message(value, n: int, what: str) -> list | None:
    """None for a scalar (shared) value, else the per-message list (checked for length)."""
    if value is None or isinstance(value, (str, dict)) or not isinstance(value, Sequence):
        return None
    if len(value) != n:
        raise ValueError(f"{what} has {len(value)} entries for {n} bodies")
    return list(value)


def columns_from_batch(batch: MessageBatch, ctx: PutContext) -> Columns:
    bodies = batch.bodies
    n = len(bodies)
    if not n:
        raise ValueError("MessageBatch.bodies is empty")
    kinds = set(map(type, bodies))
    if kinds != {bytes}:
        if type(None) in kinds:
            i = next(i for i, b in enumerate(bodies) if b is None)
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, "message body is None", i)
        bad = next(b for b in bodies if type(b) is not bytes)
        raise ValueError(f"MessageBatch.bodies must hold bytes, got {type(bad).__name__}")
    lens = np.fromiter(map(len, bodies), dtype=np.int64, count=n)
    too_big = np.flatnonzero(lens > ctx.max_message_bytes)
    if len(too_big):
        i = int(too_big[0])
        raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                       f"body of {int(lens[i])} bytes exceeds commit_log.max_message_bytes "
                       f"({ctx.max_message_bytes})", i)

    topics = _per_message(batch.topic, n, "topic") or [batch.topic] * n
    for t in set(topics):
        check_topic(t)
        if len(t) > MAX_V1_TOPIC_BYTES and (len(t) > MAX_TOPIC_BYTES or not t.startswith("%RETRY%")):
            i = topics.index(t)
            raise Rejected(PutStatus.MESSAGE_ILLEGAL, f"topic of {len(t)} bytes is too long", i)
    tags = _per_message(batch.tags, n, "tags")
    props = _per_message(batch.properties, n, "properties")
    keys = None if batch.keys is None else _per_message(batch.keys, n, "keys")
    if batch.keys is not None and keys is None:
        raise ValueError("MessageBatch.keys must hold one key list (or None) per body")

    shared = tags is None and props is None and keys is None
    tails: list[bytes] = []
    props_seen: list[dict] = []
    for i in range(n) if not shared else ():
        probe = Message(topic=topics[i], body=b"", tags=tags[i] if tags else batch.tags,
                        keys=keys[i] if keys else None,
                        properties=props[i] if props else batch.properties)
        try:
            p, tail = _encode_tail(probe, topics[i], len(topics[i]), ctx.auto_v2)
        except Rejected as rej:
            rej.index = i
            raise
        tails.append(tail)
        props_seen.append(p)
    if shared:
        by_topic = {}
        for t in set(topics):
            probe = Message(topic=t, body=b"", tags=batch.tags, properties=batch.properties)
            try:
                by_topic[t] = _encode_tail(probe, t, len(t), ctx.auto_v2)
            except Rejected as rej:
                rej.index = topics.index(t)
                raise
        tails = [by_topic[t][1] for t in topics]
        props_seen = [by_topic[t][0] for t in set(topics)]
    wait = False
    for i, p in enumerate(props_seen):
        delay = p.get(PROPERTY_DELAY)
        if delay is not None and delay.strip().isdigit() and int(delay) > 0:
            raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                           "a batch may not hold delayed messages (DELAY > 0)", i if not shared else 0)
        if PROPERTY_INNER_NUM in p:
            raise Rejected(PutStatus.MESSAGE_ILLEGAL,
                           "INNER_NUM property without the INNER_BATCH sysflag", i if not shared else 0)
        w = p.get(PROPERTY_WAIT)
        wait = wait or w is None or w.lower() == "true"

    born_host = ctx.store_host if batch.born_host is None else parse_host(batch.born_host)
    sysflag = (SYSFLAG_BORNHOST_V6 if born_host.is_v6 else 0) | (
        SYSFLAG_STOREHOST_V6 if ctx.store_v6 else 0)
    v2 = [ctx.auto_v2 and len(t) > MAX_V1_TOPIC_BYTES for t in set(topics)]
    magics = MAGIC_V1 if not any(v2) else [
        MAGIC_V2 if ctx.auto_v2 and len(t) > MAX_V1_TOPIC_BYTES else MAGIC_V1 for t in topics]
    tail_lens = np.fromiter(map(len, tails), dtype=np.int64, count=n)
    sizes = HEADER_STRUCTS[(sysflag >> 4) & 3].size + lens + tail_lens

    queue_ids = batch.queue_ids
    if queue_ids is not None:
        if isinstance(queue_ids, (int, np.integer)) and not isinstance(queue_ids, bool):
            queue_ids = np.full(n, check_queue_id(queue_ids), dtype=np.int64)
        else:
            queue_ids = np.asarray(queue_ids)
            if queue_ids.shape != (n,) or queue_ids.dtype.kind not in "iu":
                raise ValueError(f"MessageBatch.queue_ids must be one int or {n} ints")
            queue_ids = queue_ids.astype(np.int64)
            bad = np.flatnonzero((queue_ids < 0) | (queue_ids > INT32_MAX))
            if len(bad):
                raise ValueError(f"queue_id {int(queue_ids[bad[0]])} (message {int(bad[0])}) "
                                 f"must be an int in [0, {INT32_MAX}]")
    flag = _int_field("flag", batch.flag, -(1 << 31), INT32_MAX)
    born_ts = batch.born_timestamp
    if born_ts is not None:
        born_ts = _int_field("born_timestamp", born_ts, -(1 << 63), (1 << 63) - 1)
    crcs = np.fromiter(map(zlib.crc32, bodies), dtype=np.int64, count=n) & 0x7FFFFFFF
    return Columns(
        n=n, topics=topics, queue_ids=queue_ids, bodies=list(bodies), tails=tails, sizes=sizes,
        body_crcs=crcs, magics=magics, sysflags=sysflag, flags=flag, born_timestamps=born_ts,
        born_hosts=born_host, reconsume_times=0, prepared_tx_offsets=0, wait=wait,
        select_inputs=_SelectInputs(topics, keys),
    )


class _SelectInputs(Sequence):
    """Message views for the queue selector, built only when it is asked for one."""

    def __init__(self, topics: list[str], keys: list | None) -> None:
        self._topics = topics
        self._keys = keys

    def __len__(self) -> int:
        return len(self._topics)

    def __getitem__(self, i):
        return Message(topic=self._topics[i], body=b"", keys=self._keys[i] if self._keys else None)


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
    arr = np.empty(n, dtype=header_dtype(*layout))
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
    tails = cols.tails[lo:hi]
    arr["body_len"] = cols.sizes[lo:hi] - arr.dtype.itemsize - np.fromiter(
        map(len, tails), dtype=np.int64, count=n)
    raw = arr.tobytes()
    width = arr.dtype.itemsize
    pieces: list = [None] * (3 * n)
    pieces[0::3] = [raw[i:i + width] for i in range(0, n * width, width)]
    pieces[1::3] = cols.bodies[lo:hi]
    pieces[2::3] = tails
    return b"".join(pieces)


def encode_batch(items: Sequence[Prepared], store_host: Host, queue_ids: np.ndarray,
                 queue_offsets: np.ndarray, phys_offsets: np.ndarray, store_timestamp: int
                 ) -> bytes:
    """Records for prepared messages laid out back to back (offsets already assigned)."""
    cols = columns_from_prepared(items, items)
    return encode_columns(cols, 0, cols.n, store_host, queue_ids, queue_offsets, phys_offsets,
                          store_timestamp)

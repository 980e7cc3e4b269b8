"""A plain pull's usual case, answered without the walk's machinery.

``get`` with no filter and no byte cap is what a consumer calls in its loop, a few dozen
messages at a time. When every unit of such a pull is an ordinary reference into a readable
commit-log segment and every record checks out, the answer follows from the units alone:
the messages of consecutive offsets until getMessage's batch counts as full. ``get_plain``
serves exactly that case from the unit bytes, in one loop (a one-message get, a point read,
without it); anything else (a filler, a damaged unit or record, a removed segment) makes it
answer None, and the general pull (``pull``), which says what is wrong and how it moves past
it, answers instead.
"""

from __future__ import annotations

import struct

from mqstore.format import record_crc
from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.record import HEADER_STRUCTS, MAGIC_V1, POS_SYSFLAG, RecordLayout
from mqstore.format.verify import verify_queue_record
from mqstore.hashing import zlib_crc32 as crc32
from mqstore.message import CHECKED_V1, GetResult, GetStatus, StoredMessage
from mqstore.read.served_rows import MIN_RECORD

_UNIT = struct.Struct(">qiq")  # a consume-queue unit: commit-log offset, size, tag code
_UNIT_HEAD = struct.Struct(">qi8x")  # a unit's commit-log offset and size
_TWO_UNITS = struct.Struct(">qiqqiq")
_FOUND = GetStatus.FOUND
_HOSTS_BYTE = POS_SYSFLAG + 3  # the big-endian sysflag's low byte holds the host-family bits
_HEADS = tuple((hs, hs.size) for hs in HEADER_STRUCTS)  # the header and where the body starts
# Per host family, the header fields a plain get checks (TOTALSIZE, MAGICCODE, BODYCRC,
# QUEUEID, QUEUEOFFSET, PHYSICALOFFSET, BODYLENGTH) and where the body starts: the whole
# header is read only when the message's other fields are (``message.CHECKED_V1``).
_CHECKED = tuple((struct.Struct(f">iiii4xqq{hs.size - 40}xi"), hs.size) for hs in HEADER_STRUCTS)
_CRC_BYTES = record_crc.RESERVED
_FIRST, _SECOND, _THIRD = record_crc.THIRDS
_THIRDS = struct.Struct("3s3s3s")  # where a record CRC property's name would lie, in thirds
_new_layout = tuple.__new__
_NO_RANGE = (0, 0)  # no commit-log range where records must carry the record CRC
_TOO_LONG = b""  # the topic field of a topic too long for V1 records
_topic_fields: dict[str, bytes] = {}  # topic -> its V1 topic field (topics of open queues)
# NOTE [ shapes ]
# A queue's records mostly repeat a few shapes: the same size, body length, topic and host
# families. A shape (per topic, the record's size) seen twice gets one struct that reads
# every field a plain get checks: the size and magic as one number, the body CRC, queue id,
# queue and commit-log offsets, the sysflag (for its host bits), the body length, the topic
# field with the properties' length after the body as one string, and the three thirds of
# where a record CRC property would lie. A record of the shape's size but another split or
# other host families fails those checks and takes the field-by-field path, as does every
# record of a new shape; both paths check the same things. Records too short for a record
# CRC property to fit are always read field by field.
# topic field -> size -> (unpack_from, size and magic, body length, host bits, topic field
# and properties length, body_at, body_end)
_shapes: dict[bytes, dict[int, tuple]] = {}
_seen: set[tuple[bytes, int]] = set()  # shapes met once
# A bound only, on the topics and on the shapes in all: the tables start over when a store's
# sizes vary widely.
_MAX_SHAPES = 4096
_learned = [0]  # shapes given a struct since the tables last started over
_HOST_BITS = 0x30
_SIZE_MAGIC = struct.Struct(">ii")
_Q = struct.Struct(">q")
_H = struct.Struct(">H")


def _shapes_of(key: bytes) -> dict[int, tuple]:
    """The shapes of the topic whose V1 topic field is ``key``."""
    shapes = _shapes.get(key)
    if shapes is None:
        if len(_shapes) >= _MAX_SHAPES:
            _shapes.clear()
        shapes = _shapes[key] = {}
    return shapes


def _learn(key: bytes, size: int, sysflag_byte: int, body_at: int, body_len: int,
           gap: int) -> None:
    """Remember a shape the first time it is met, give it a struct the second time."""
    if (key, size) not in _seen:
        if len(_seen) >= _MAX_SHAPES:
            _seen.clear()
        _seen.add((key, size))
        return
    if _learned[0] >= _MAX_SHAPES:
        _shapes.clear()
        _learned[0] = 0
    shapes = _shapes_of(key)
    unpack = struct.Struct(f">qii4xqqi{body_at - 44}xi{body_len}x{len(key) + 2}s{gap}x3s3s3s"
                           ).unpack_from
    size_magic = _Q.unpack(_SIZE_MAGIC.pack(size, MAGIC_V1))[0]
    shapes[size] = (unpack, size_magic, body_len, sysflag_byte & _HOST_BITS,
                    key + _H.pack(gap + _CRC_BYTES), body_at, body_at + body_len)
    _learned[0] += 1


# A V1 record's tail up to its properties: the topic field of the given length, then the
# properties' length.
_TAILS = {n: struct.Struct(f">{n}sH") for n in range(1, 257)}


def get_plain(commit_log, cq, offset: int, max_msgs: int, limits) -> GetResult | None:
    """getMessage's answer for up to ``max_msgs`` (>= 1) messages of ``cq`` from ``offset``,
    unfiltered; None unless every unit it reads is ordinary and every record intact."""
    if cq is None:
        return None
    min_off, max_off = cq.min_offset, cq.max_offset
    if not min_off <= offset < max_off:
        return None
    seg = cq.segments.find(offset * CQ_UNIT_SIZE)
    if seg is None:
        return None
    at = offset * CQ_UNIT_SIZE - seg.start
    # One consume-queue file at a time, as the general pull. The unit after max_msgs ends
    # the batch unless it is a filler or damaged, which the general pull passes over even
    # then (so it answers); later units are not looked at.
    count = (seg.wrote - at) // CQ_UNIT_SIZE
    if count > max_off - offset:
        count = max_off - offset
    if count > max_msgs:
        count = max_msgs + 1
    elif count <= 0:
        return None
    # The log's end after the queue's bounds: every unit below max_offset names bytes below it.
    max_py = commit_log.max_offset
    if max_msgs == 1:
        return _one(commit_log, cq, seg.mm, at, count == 2, offset, min_off, max_off,
                    max_py - limits.batch[0])
    try:
        units = seg.mm[at:at + count * CQ_UNIT_SIZE]
    except ValueError:  # the file was closed since the lookup
        return None
    topic, queue_id, crc_range = cq.topic.encode(), cq.queue_id, commit_log.crc_range
    key, topic_len = _topic_fields.get(cq.topic) or _topic_field(cq.topic), len(topic)
    tail = _TAILS[len(key)].unpack_from if key else None
    shape_of = _shapes_of(key).get
    crc_lo, crc_hi = crc_range or _NO_RANGE
    find = commit_log.segments.find
    in_memory, mem_bytes, mem_count, disk_bytes, disk_count = limits.batch
    messages: list = []
    append = messages.append
    log_start = log_end = n = total = 0
    last = -1
    for pos, size in _UNIT_HEAD.iter_unpack(units):
        # A shape's size is a record's (NOTE [ shapes ]): no filler, no damaged size.
        shape = shape_of(size)
        if shape is None and (size < MIN_RECORD or size == FILLER_SIZE) or pos < 0:
            return None
        if n:
            # RocketMQ's isTheBatchFull; the first message is always served.
            with_it = total + size
            if n == max_msgs or (with_it > mem_bytes or n >= mem_count
                                 if max_py - pos <= in_memory
                                 else with_it > disk_bytes or n >= disk_count):
                break
        if not log_start <= pos < log_end:
            log_seg = find(pos)
            if log_seg is None:
                return None
            mm, log_start = log_seg.mm, log_seg.start
            log_end = log_start + log_seg.committed
        if pos + size > log_end:
            return None
        rel = pos - log_start
        try:
            raw = mm[rel:rel + size]
        except ValueError:  # the segment closed meanwhile
            return None
        # _intact inlined (this runs once per message), to the same effect; the message
        # keeps the body the CRC was taken of, and reads the rest of its header when asked.
        # A record of a shape seen before is read with one struct call (NOTE [ shapes ]).
        if shape is not None:
            unpack, size_magic, shape_body_len, hosts, tail_bytes, body_at, body_end = shape
            (stated, body_crc, qid, qoff, phys, sysflag, body_len, field, c0, c1,
             c2) = unpack(raw)
            if (stated == size_magic and body_len == shape_body_len and phys == pos
                    and qoff == offset + n and qid == queue_id and sysflag & _HOST_BITS == hosts
                    and field == tail_bytes and c0 != _FIRST and c1 != _SECOND
                    and c2 != _THIRD and not crc_lo <= pos < crc_hi
                    and crc32(body := raw[body_at:body_end]) & 0x7FFFFFFF == body_crc):
                append(StoredMessage(raw, CHECKED_V1, body))
                n += 1
                total += size
                last = pos
                continue
        head, body_at = _CHECKED[(raw[_HOSTS_BYTE] >> 4) & 3]
        if size >= body_at + 3 and key:
            stated, magic, body_crc, qid, qoff, phys, body_len = head.unpack_from(raw)
            topic_at = body_at + body_len + 1
            props_at = topic_at + topic_len + 2
            crc_at = size - _CRC_BYTES
            if (stated == size and magic == MAGIC_V1 and phys == pos and qid == queue_id
                    and qoff == offset + n and body_len >= 0 and props_at <= size
                    and (t := tail(raw, topic_at - 1))[0] == key and props_at + t[1] == size
                    and (crc_at < props_at or (c := _THIRDS.unpack_from(raw, crc_at))[0]
                         != _FIRST and c[1] != _SECOND and c[2] != _THIRD)
                    and not crc_lo <= pos < crc_hi
                    and crc32(body := raw[body_at:body_at + body_len]) & 0x7FFFFFFF
                    == body_crc):
                if shape is None and crc_at >= props_at:
                    _learn(key, size, raw[_HOSTS_BYTE], body_at, body_len,
                           crc_at - props_at)
                append(StoredMessage(raw, CHECKED_V1, body))
                n += 1
                total += size
                last = pos
                continue
        try:
            lay = verify_queue_record(raw, pos, size, topic, queue_id, offset + n, crc_range)
        except ValueError:  # damaged (CorruptRecordError)
            return None
        append(StoredMessage(raw, lay))
        n += 1
        total += size
        last = pos
    return GetResult(_FOUND, offset + n, min_off, max_off, messages, max_py - last > in_memory,
                     0, [])


def _one(commit_log, cq, mm, at: int, peek: bool, offset: int, min_off: int, max_off: int,
         in_memory_from: int) -> GetResult | None:
    """``get_plain`` of one message: the loop's first round and the look at the unit after
    it (``peek``: one is stored in the same file), without the loop."""
    try:
        if peek:
            pos, size, _code, after_pos, after_size, _ = _TWO_UNITS.unpack_from(mm, at)
            if after_size < MIN_RECORD or after_size == FILLER_SIZE or after_pos < 0:
                return None
        else:
            pos, size, _code = _UNIT.unpack_from(mm, at)
    except ValueError:  # the file was closed since the lookup
        return None
    if size < MIN_RECORD or size == FILLER_SIZE or pos < 0:
        return None
    log_seg = commit_log.segments.find(pos)
    if log_seg is None:
        return None
    rel = pos - log_seg.start
    if rel + size > log_seg.committed:
        return None
    crc_range = commit_log.crc_range
    try:
        raw = log_seg.mm[rel:rel + size]
        lay = _intact(raw, pos, size, offset, _topic_fields.get(cq.topic)
                      or _topic_field(cq.topic), cq.queue_id, crc_range or _NO_RANGE) \
            or verify_queue_record(raw, pos, size, cq.topic.encode(), cq.queue_id, offset,
                                   crc_range)
    except ValueError:  # damaged (CorruptRecordError), or the segment closed meanwhile
        return None
    return GetResult(_FOUND, offset + 1, min_off, max_off, [StoredMessage(raw, lay)],
                     pos < in_memory_from, 0, [])


def _topic_field(topic: str) -> bytes:
    """A V1 record's topic as stored: its length byte and its bytes (``_TOO_LONG`` for a topic
    only V2 records hold), kept for the next pull of the queue."""
    raw = topic.encode()
    field = bytes((len(raw),)) + raw if len(raw) < 256 else _TOO_LONG
    if len(_topic_fields) < 100_000:  # a store holds far fewer topics: only a bound
        _topic_fields[topic] = field
    return field


def _intact(raw, pos: int, size: int, queue_offset: int, key: bytes, queue_id: int,
            crc_range: tuple[int, int]) -> RecordLayout | None:
    """The layout ``verify_queue_record`` gives ``raw`` (``size`` >= MIN_RECORD bytes, as its
    unit says) when it is a V1 record of the usual shape that passes its checks (``key``: the
    topic as stored, ``_topic_field``; ``crc_range``: (0, 0) for none); None for anything
    else, which it is then left to."""
    head, body_at = _HEADS[(raw[_HOSTS_BYTE] >> 4) & 3]
    if size < body_at + 3 or not key:
        return None
    f = head.unpack_from(raw)
    body_len = f[16]
    topic_at = body_at + body_len + 1
    props_at = topic_at + len(key) + 1
    # record_crc.state's first test: the record ends with nothing like the record CRC
    # property, not even a damaged one (a record carrying it is left to verify_queue_record).
    crc_at = size - _CRC_BYTES
    if (f[0] == size and f[1] == MAGIC_V1 and f[6] == pos and f[3] == queue_id
            and f[5] == queue_offset and body_len >= 0 and props_at <= size
            and (t := _TAILS[len(key)].unpack_from(raw, topic_at - 1))[0] == key
            and props_at + t[1] == size
            and (crc_at < props_at or (c := _THIRDS.unpack_from(raw, crc_at))[0] != _FIRST
                 and c[1] != _SECOND and c[2] != _THIRD)
            and not crc_range[0] <= pos < crc_range[1]
            and crc32(raw[body_at:body_at + body_len]) & 0x7FFFFFFF == f[2]):
        return _new_layout(RecordLayout, (f, body_at, topic_at, len(key) - 1, props_at,
                                          size - props_at))
    return None

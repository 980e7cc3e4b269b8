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

from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.verify import verify_queue_record
from mqstore.message import GetResult, GetStatus, StoredMessage
from mqstore.read.served_rows import MIN_RECORD

_UNIT = struct.Struct(">qiq")  # a consume-queue unit: commit-log offset, size, tag code
_TWO_UNITS = struct.Struct(">qiqqiq")
_FOUND = GetStatus.FOUND


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
    find = commit_log.segments.find
    in_memory, mem_bytes, mem_count, disk_bytes, disk_count = limits.batch
    messages: list = []
    append = messages.append
    log_start = log_end = n = total = 0
    last = -1
    for pos, size, _code in _UNIT.iter_unpack(units):
        if size < MIN_RECORD or size == FILLER_SIZE or pos < 0:
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
            lay = verify_queue_record(raw, pos, size, topic, queue_id, offset + n, crc_range)
        except ValueError:  # damaged (CorruptRecordError), or the segment closed meanwhile
            return None
        append(StoredMessage(raw, lay))
        n += 1
        total += size
        last = pos
    return GetResult(_FOUND, offset + n, min_off, max_off, messages, max_py - last > in_memory)


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
    try:
        raw = log_seg.mm[rel:rel + size]
        lay = verify_queue_record(raw, pos, size, cq.topic.encode(), cq.queue_id, offset,
                                  commit_log.crc_range)
    except ValueError:
        return None
    return GetResult(_FOUND, offset + 1, min_off, max_off, [StoredMessage(raw, lay)],
                     pos < in_memory_from)

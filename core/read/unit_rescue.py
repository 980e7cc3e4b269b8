"""Finding the record of a damaged consume-queue unit in the commit log, without the unit.

A queue's records lie in log order, so the record of queue offset X lies after the record of
the nearest intact unit before X and before that of the nearest intact unit after it. A pull
that meets a damaged unit (``pull._Scan._rescue``) walks the records between (chained by
their sizes, bounded) and serves the one that checks out as that queue's record at X; the
damaged unit is still reported. Reads only, so read-only followers do the same.
"""

from __future__ import annotations

import logging
import struct

from mqstore.read import served_rows
from mqstore.errors import CorruptRecordError
from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.record import BLANK_MAGIC, BLANK_RECORD, MAGIC_V1, MAGIC_V2
from mqstore.format.verify import verify_queue_record

# A damaged unit's record is looked for in at most this many commit-log bytes, after the
# nearest intact unit found within RESCUE_MAX_UNITS before it.
RESCUE_MAX_BYTES = 4 * 1024 * 1024
RESCUE_MAX_UNITS = 64
_UNIT = struct.Struct(">qiq")  # a consume-queue unit: commit-log offset, size, tag code
_HEAD_IDS = struct.Struct(">i4xq")  # a record's queue id and queue offset, at byte 12
_MIN_RECORD = served_rows.MIN_RECORD
log = logging.getLogger(__name__)
_warned: set = set()  # (queue directory, queue offset, unit's offset): warned once each


def warn_once(cq, offset: int, pos: int, why: str) -> None:
    """Log a damaged unit whose record was found, once per unit (a consumer may pull it
    again and again)."""
    key = (cq.directory, offset, pos)
    if key in _warned:
        return
    if len(_warned) > 100_000:
        _warned.clear()
    _warned.add(key)
    log.warning("pull of %s/%d: consume-queue unit %d is damaged (%s); serving its record "
                "from the commit log (mqstore check --fix rebuilds the queue)",
                cq.topic, cq.queue_id, offset, why)


def _unit_at(cq, offset: int):
    """``(phys, size, tags code)`` of the written unit at queue ``offset``, or None."""
    seg = cq.segments.find(offset * CQ_UNIT_SIZE)
    if seg is None:
        return None
    at = offset * CQ_UNIT_SIZE - seg.start
    if at + CQ_UNIT_SIZE > seg.wrote:
        return None
    try:
        return _UNIT.unpack_from(seg.mm, at)
    except (ValueError, struct.error):  # closed since the lookup
        return None


def _intact_unit(commit_log, cq, topic: bytes, offset: int):
    """``(phys, size)`` of the unit at ``offset`` when its record checks out, else None."""
    unit = _unit_at(cq, offset)
    if unit is None:
        return None
    pos, size, _code = unit
    if size == FILLER_SIZE or size < _MIN_RECORD or pos < 0:
        return None
    seg = commit_log.segments.find(pos)
    if seg is None or pos - seg.start + size > seg.committed:
        return None
    try:
        raw = seg.mm[pos - seg.start:pos - seg.start + size]
        verify_queue_record(raw, pos, size, topic, cq.queue_id, offset, commit_log.crc_range)
    except ValueError:
        return None
    return pos, size


def rescue(commit_log, cq, topic: bytes, offset: int, max_bytes: int = RESCUE_MAX_BYTES):
    """The record of queue ``offset`` of ``cq`` whose unit is damaged, found in the commit log
    without the unit: ``(raw, layout, phys offset)``, or None.

    A queue's records lie in log order, so it lies after the record of the nearest intact unit
    before it and before that of the nearest intact unit after it. The records between are
    walked (chained by their sizes, at most ``max_bytes``) and the one that checks out as this
    queue's record at ``offset`` (CRC, position, topic, queue id, queue offset) is returned.
    Reads only."""
    lo = hi = None
    for o in range(offset - 1, max(cq.min_offset, offset - RESCUE_MAX_UNITS) - 1, -1):
        got = _intact_unit(commit_log, cq, topic, o)
        if got is not None:
            lo = got[0] + got[1]
            break
    for o in range(offset + 1, min(cq.max_offset, offset + RESCUE_MAX_UNITS + 1)):
        got = _intact_unit(commit_log, cq, topic, o)
        if got is not None:
            hi = got[0]
            break
    end = commit_log.max_offset
    if hi is None:
        hi = end
    if lo is None:  # nothing intact before it: only when the log's start is close enough
        lo = commit_log.min_offset
        if hi - lo > max_bytes:
            return None
    hi = min(hi, end, lo + max_bytes)
    queue_id = cq.queue_id
    seg_bytes = commit_log.segment_bytes
    pos = lo
    while pos < hi:
        seg = commit_log.segments.find(pos)
        if seg is None:
            return None
        rel = pos - seg.start
        try:
            if rel + 8 > seg.committed:
                pos = seg.start + seg_bytes  # the rest of the segment is not written
                continue
            total, magic = BLANK_RECORD.unpack_from(seg.mm, rel)
            if magic == BLANK_MAGIC:
                pos = seg.start + seg_bytes
                continue
            if (magic != MAGIC_V1 and magic != MAGIC_V2) or total < _MIN_RECORD \
                    or rel + total > seg.committed:
                return None  # the chain is broken here: the walk cannot go on
            qid, qoff = _HEAD_IDS.unpack_from(seg.mm, rel + 12)
            if qid == queue_id and qoff == offset:
                raw = seg.mm[rel:rel + total]
                try:
                    return raw, verify_queue_record(raw, pos, total, topic, queue_id, offset,
                                                    commit_log.crc_range), pos
                except CorruptRecordError:
                    pass  # another queue's record, or damaged: walk on
        except (ValueError, struct.error):  # closed by cleanup since the lookup
            return None
        pos += total
    return None

"""Queue offset by store time (RocketMQ 5.x, spec 10.7), with LOWER / UPPER boundaries.

LOWER: the first offset whose message was stored at or after ``ts``; UPPER: the last offset
stored at or before ``ts``. Store times are read from the commit log (a unit whose record is
gone counts as older than any ``ts``); the answer is clamped to ``[min_offset, max_offset]``.

``probing_offset_by_time`` is the search as the spec describes it, one commit-log read per
probe; it defines every answer. ``offset_by_time`` answers from ``time_index`` where that
gives the same answer, and probes where it cannot tell.
"""

from __future__ import annotations

import struct

from mqstore.read import time_cache
from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.record import POS_SYSFLAG, store_timestamp_pos

_INT = struct.Struct(">i")
_LONG = struct.Struct(">q")
LOWER = "lower"
UPPER = "upper"


def store_time_at(commit_log, phys_offset: int) -> int:
    """Store time of the record at ``phys_offset``, or -1 when it is not readable."""
    if not commit_log.min_offset <= phys_offset < commit_log.max_offset:
        return -1
    head = commit_log.read(phys_offset, POS_SYSFLAG + 4)
    if head is None:
        return -1
    sysflag = _INT.unpack_from(head, POS_SYSFLAG)[0]
    ts_pos = store_timestamp_pos(sysflag)
    raw = commit_log.read(phys_offset + ts_pos, 8)
    return -1 if raw is None else _LONG.unpack(raw)[0]


def offset_by_time(commit_log, cq, ts: int, boundary: str) -> int:
    found = time_cache.search(commit_log, cq, ts, boundary == UPPER)
    return probing_offset_by_time(commit_log, cq, ts, boundary) if found is None else found


def probing_offset_by_time(commit_log, cq, ts: int, boundary: str) -> int:
    if cq is None or not cq.segments.segments:
        return 0
    min_off, max_off = cq.min_offset, cq.max_offset
    files = [s for s in cq.segments.segments if s.wrote >= CQ_UNIT_SIZE]
    if not files:
        return max(min_off, min(0, max_off))
    min_phys = commit_log.min_offset

    def unit_time(seg, idx: int) -> int:
        units = cq.units_of(seg)
        # A filler holds the place of a message lost to damage: it takes the time of the
        # message before it, which keeps the times in queue order non-decreasing.
        while idx >= 0 and int(units[idx]["size"]) == FILLER_SIZE:
            idx -= 1
        if idx < 0:
            return -2
        pos = int(units[idx]["phys_offset"])
        if pos < min_phys:
            return -2  # removed: older than any ts
        return store_time_at(commit_log, pos)

    def first_idx(seg) -> int:
        return max(0, cq.min_logic_offset - seg.start) // CQ_UNIT_SIZE

    chosen = None
    if boundary == LOWER:
        for seg in files[:-1]:
            if unit_time(seg, seg.wrote // CQ_UNIT_SIZE - 1) >= ts:
                chosen = seg
                break
        if chosen is None:
            chosen = files[-1]
    else:
        for seg in reversed(files):
            low = first_idx(seg)
            if low * CQ_UNIT_SIZE < seg.wrote and unit_time(seg, low) <= ts:
                chosen = seg
                break
    result = 0 if chosen is None else _search(chosen, ts, boundary, first_idx(chosen),
                                              unit_time)
    return max(min_off, min(result, max_off))


def _search(seg, ts: int, boundary: str, low: int, unit_time) -> int:
    base = seg.start // CQ_UNIT_SIZE
    high = seg.wrote // CQ_UNIT_SIZE - 1
    if high < low:
        return 0
    t_high = unit_time(seg, high)
    if t_high == -1:
        return 0
    if t_high < ts:
        return base + high + 1 if boundary == LOWER else base + high
    t_low = unit_time(seg, low)
    if t_low > ts:
        return base if boundary == LOWER else 0
    # Invariants: time(lo) < ts (or lo = low-1), time(hi) >= ts for LOWER / > ts for UPPER.
    lo, hi = low - 1, high + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        t = unit_time(seg, mid)
        if t == -1:
            return 0
        if t < ts or (boundary == UPPER and t == ts):
            lo = mid
        else:
            hi = mid
    return base + (hi if boundary == LOWER else lo)

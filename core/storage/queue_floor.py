"""A consume queue's units read for the offset floors (NOTE [ Offset floors ] in
``offset_floor``): where a queue ended before recovery cut it, and which of its offsets lead to
no message once the open has given it its fillers."""

from __future__ import annotations

import numpy as np

from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE


def end_below_phys(cq, limit: int) -> int:
    """The queue offset after the last unit of ``cq`` that is a filler or names a record
    ending at or below ``limit``: the end the queue had with only the records below it."""
    if cq.max_phys <= limit:
        return cq.max_offset
    segs = cq.segments.segments
    for seg in reversed(segs):
        units = cq.units_of(seg)[:seg.wrote // CQ_UNIT_SIZE]
        ends = units["phys_offset"].astype(np.int64) + units["size"].astype(np.int64)
        kept = np.flatnonzero((units["size"] == FILLER_SIZE) | (ends <= limit))
        if len(kept):
            return seg.start // CQ_UNIT_SIZE + int(kept[-1]) + 1
    return segs[0].start // CQ_UNIT_SIZE if segs else 0


def offsets_without_message(cq, begin: int, *, after_first: bool = False
                            ) -> list[tuple[int, int]]:
    """``[first, last]`` runs of the offsets of ``cq`` from ``begin`` to its end that lead to
    no message: filler units, and offsets below its first file; ``after_first``: from its
    first message on, if it has one (before it, a queue rebuilt from the log holds the
    offsets of records cleanup removed)."""
    end = cq.max_offset
    segs = cq.segments.segments
    if after_first:
        for seg in segs:
            units = cq.units_of(seg)[:seg.wrote // CQ_UNIT_SIZE]
            real = np.flatnonzero(units["size"] != FILLER_SIZE)
            if len(real):
                begin = max(begin, seg.start // CQ_UNIT_SIZE + int(real[0]))
                break
    held = [np.arange(begin, min(end, segs[0].start // CQ_UNIT_SIZE) if segs else end,
                      dtype=np.int64)]
    for seg in segs:
        first = seg.start // CQ_UNIT_SIZE
        units = cq.units_of(seg)[:seg.wrote // CQ_UNIT_SIZE]
        lo = max(0, begin - first)
        if lo < len(units):
            held.append(first + lo + np.flatnonzero(units["size"][lo:] == FILLER_SIZE))
    offsets = np.concatenate(held)
    if not len(offsets):
        return []
    breaks = np.flatnonzero(np.diff(offsets) != 1)
    starts = np.r_[offsets[0], offsets[breaks + 1]]
    ends = np.r_[offsets[breaks], offsets[-1]]
    return list(zip(starts.tolist(), ends.tolist()))

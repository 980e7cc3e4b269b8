"""Consume-queue unit: 20 bytes per message of one topic/queue, big-endian.

    +------------------------+--------------+--------------------+
    | commit-log offset (8)  | msg size (4) | tags code (8)      |  = 20 bytes
    +------------------------+--------------+--------------------+

Unit ``i`` of a queue sits at stream offset ``i*20``, in file ``floor(i*20 / file_bytes)``.
A unit is valid while ``offset >= 0 and size > 0``; the filler ``(0, 0x7FFFFFFF, 0)`` pads the
head of a queue whose first offset is not 0. A tags code of ``-2147483649`` or less is a
consume-queue-extension address, never a hash.
"""

from __future__ import annotations

import numpy as np

CQ_UNIT_SIZE = 20
FILLER_SIZE = 0x7FFFFFFF
EXT_ADDRESS_MAX = -2147483649

CQ_DTYPE = np.dtype([("phys_offset", ">i8"), ("size", ">i4"), ("tags_code", ">i8")])
assert CQ_DTYPE.itemsize == CQ_UNIT_SIZE


def round_file_bytes(file_bytes: int) -> int:
    """A configured consume-queue file size, rounded up to whole units."""
    return -(-file_bytes // CQ_UNIT_SIZE) * CQ_UNIT_SIZE


def encode_units(phys_offsets, sizes, tags_codes) -> bytes:
    units = np.empty(len(phys_offsets), dtype=CQ_DTYPE)
    units["phys_offset"] = phys_offsets
    units["size"] = sizes
    units["tags_code"] = tags_codes
    return units.tobytes()


def decode_units(buf) -> np.ndarray:
    """View ``buf`` (a multiple of 20 bytes) as units, without copying."""
    return np.frombuffer(buf, dtype=CQ_DTYPE)


def valid_prefix(units: np.ndarray, prev_end: int = -1) -> int:
    """Number of leading valid units: offset >= 0, size > 0, and (fillers aside) each record
    starting at or after the end of the one before (``prev_end`` for the first), as dispatch
    writes them in commit-log order. A unit copied in from elsewhere or a torn write breaks
    the order and ends the prefix, before the unit whose order breaks or the one ahead of it
    (either may be the stray one; what is cut is rebuilt from the commit log)."""
    return valid_run(units, prev_end)[0]


def valid_run(units: np.ndarray, prev_end: int = -1) -> tuple[int, int]:
    """``valid_prefix`` and where the records of that prefix end: the largest record end in
    it, or ``prev_end`` when it is larger (or the prefix names no record)."""
    phys = units["phys_offset"].astype(np.int64)
    size = units["size"].astype(np.int64)
    real = size != FILLER_SIZE
    ends = np.where(real, phys + size, -1)
    upto = np.maximum.accumulate(ends)  # upto[i]: the largest end among units 0..i
    np.maximum(upto, prev_end, out=upto)
    before = np.empty_like(upto)  # the largest end before unit i
    if len(before):
        before[0] = prev_end
        before[1:] = upto[:-1]
    broken = (phys < 0) | (size <= 0)
    unordered = real & (phys < before) & ~broken
    bad = np.flatnonzero(broken | unordered)
    if not len(bad):
        n = len(units)
    else:
        first = int(bad[0])
        # Out of order, the unit before may be the stray one (it jumped ahead): it goes too.
        n = first - 1 if unordered[first] and first > 0 and real[first - 1] else first
    return n, (int(upto[n - 1]) if n else prev_end)


def unwritten(unit) -> bool:
    """Whether ``unit`` reads as one dispatch has not written yet (a written one never has
    size 0)."""
    return unit["size"] == 0 and unit["phys_offset"] == 0


def written_count(units: np.ndarray) -> int:
    """Units that hold anything (a never-written unit is all zeros)."""
    return int(np.count_nonzero((units["size"] != 0) | (units["phys_offset"] != 0)))


def last_end(units: np.ndarray) -> int:
    """The commit-log end of the last record ``units`` name (-1: none)."""
    size = units["size"].astype(np.int64)
    real = (size != FILLER_SIZE) & (size > 0)
    if not real.any():
        return -1
    return int((units["phys_offset"].astype(np.int64) + size)[real].max())


def joined(*parts: np.ndarray) -> np.ndarray:
    """Units end to end, in the file's byte order (``np.concatenate`` would go native)."""
    return np.concatenate(parts).astype(CQ_DTYPE)


def fillers(count: int) -> np.ndarray:
    """RocketMQ's filler units: offset 0, size 0x7FFFFFFF, tags code 0."""
    fill = np.zeros(count, dtype=CQ_DTYPE)
    fill["size"] = FILLER_SIZE
    return fill

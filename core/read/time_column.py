"""One consume-queue file's sparse store-time column, as ``time_cache`` keeps it: the time of
every ``STRIDE``-th unit and, per stride, its run (and whether the units after the run have
the next stride's time), extended as units are gathered.

Only the column's bookkeeping lives here: ``time_cache`` reads the records' times, decides
what a file's column may answer and searches with it (its docstring says why the column
stays true).
"""

from __future__ import annotations

import struct
from array import array

import numpy as np

from mqstore.format.cq_unit import CQ_UNIT_SIZE

STRIDE = 32
# Set on a stride's run when every unit after the run has the next stride's first time: a
# search for a time between the stride's first and the next one's ends at the run's end, and
# reads no record (runs are 1..STRIDE, below this bit).
REACHES_NEXT = 0x80
# The phys offset of a filler with no real unit before it in its file: it reads as removed
# whatever the log's minimum (-1 at least).
NO_PHYS = -(1 << 62)
REMOVED = -2  # the probing search's time for a removed record (or none)
_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1
_UNIT = struct.Struct(">qi")


class FileTimes:
    """Units ``[0, n)`` of one consume-queue file, each naming a record that was readable, or
    already removed, when gathered. ``first``/``last``: (phys offset, time) giving units 0 and
    n-1 their times; ``monotone``: phys offsets and times never decrease, every time is -2 or
    a record's time >= 0; ``times``: the column (monotone files only), ``base`` added to its
    int32 entries (-2 is _I32_MIN; 0 once it holds int64 times); ``runs``: per stride, how
    many of its units from the first on share the first one's time (of those gathered), with
    ``REACHES_NEXT`` once the next stride's first unit shows that the units after the run all
    have its time; ``after_run``: the time of the last stride's first unit after its run (None
    while the run lasts); ``kept``: (log minimum, strides, the first stride not removed)."""

    __slots__ = ("seg", "n", "whole", "first", "last", "last_unit", "monotone", "times", "base",
                 "runs", "after_run", "kept")

    def __init__(self, seg) -> None:
        self.seg = seg
        self.n = 0
        self.whole = False  # n reached the file's written units at the last sync
        self.first = self.last = (NO_PHYS, REMOVED)
        self.last_unit = None
        self.monotone = True
        self.times = array("i")
        self.base = None
        self.runs = bytearray()
        self.after_run: int | None = None
        self.kept = (None, -1, 0)

    def unchanged(self, seg) -> bool:
        """Whether ``seg`` still holds the units gathered (not replaced, cut or rewritten)."""
        if self.seg is not seg or self.n > seg.wrote // CQ_UNIT_SIZE:
            return False
        return not self.n or _UNIT.unpack_from(
            seg.mm, (self.n - 1) * CQ_UNIT_SIZE) == self.last_unit

    def stride_time(self, j: int) -> int:
        v = self.times[j]
        return REMOVED if v == _I32_MIN else v + (self.base or 0)

    def add_strides(self, values: np.ndarray) -> None:
        """Append the times of the next strides (never decreasing)."""
        if not len(values):
            return
        if self.times.typecode == "i":
            real = values >= 0
            if self.base is None and real.any():
                self.base = int(values[real][0])
            if values[-1] < 0 or int(values[-1]) - self.base < _I32_MAX:
                rel = np.where(real, values - (self.base or 0), _I32_MIN)
                self.times.frombytes(rel.astype(np.int32).tobytes())
                return
            # Times spanning more than int32 milliseconds: int64 from here on.
            self.times = array("q", [self.stride_time(j) for j in range(len(self.times))])
            self.base = 0
        self.times.frombytes(values.astype(np.int64).tobytes())

    def add_runs(self, a: int, times: np.ndarray, before: int) -> None:
        """Extend ``runs`` over units ``[a, a + len(times))`` of effective ``times`` (after
        ``add_strides`` for them); ``before``: the time of unit a - 1."""
        m = len(times)
        new = np.flatnonzero(times[1:] != times[:-1]) + 1  # where a unit's time is not the last's
        if a % STRIDE:
            # The last stride's run goes on if it reached unit a - 1 and unit a's time is that.
            j = a // STRIDE
            if self.runs[-1] == a - j * STRIDE and times[0] == before:
                self.runs[-1] += min(int(new[0]) if len(new) else m, (j + 1) * STRIDE - a)
        starts = np.arange(-(-a // STRIDE) * STRIDE - a, m, STRIDE)
        ends = np.append(new, m)[np.searchsorted(new, starts, side="right")]
        self.runs += (np.minimum(ends, starts + STRIDE) - starts).astype(np.uint8).tobytes()

    def mark_reaching(self, a: int, times: np.ndarray) -> None:
        """Flag ``REACHES_NEXT`` on the strides that units ``[a, a + len(times))`` complete
        (their next stride's first unit is among them), after ``add_runs`` for those units;
        keep ``after_run``. Times never decrease here, so the units after a run all have the
        next stride's first time when the first of them has it."""
        m = len(times)
        heads = np.arange(max(1, -(-a // STRIDE)) * STRIDE, a + m, STRIDE)  # next strides' firsts
        if len(heads):
            k0, k1 = int(heads[0]) // STRIDE - 1, int(heads[-1]) // STRIDE
            runs = np.frombuffer(bytes(self.runs[k0:k1]), dtype=np.uint8).astype(np.int64)
            ends = heads - STRIDE + runs  # each completed stride's first unit after its run
            after = times[np.maximum(ends - a, 0)]
            known = ends >= a
            if not known[0] and self.after_run is not None:  # the run ended in an earlier pass
                after[0], known[0] = self.after_run, True
            reach = known & (runs < STRIDE) & (after == times[heads - a])
            self.runs[k0:k1] = (runs | np.where(reach, REACHES_NEXT, 0)).astype(
                np.uint8).tobytes()
        last = (a + m - 1) // STRIDE
        end = last * STRIDE + self.runs[last]
        if end >= a + m:
            self.after_run = None  # the last stride's run goes on
        elif end >= a:
            self.after_run = int(times[end - a])

    def drop_column(self) -> None:
        """Times went backwards: the file is left to the probing search."""
        self.monotone, self.times, self.runs = False, array("i"), bytearray()

"""A sparse store-time column per consume queue, so a search by time (spec 10.7) reads a
handful of records instead of one per binary-search probe.

The probing search in ``time_search`` defines the answers; this one gives the same answer or
none (``search`` returns None and the caller probes). A unit's time is the one the probing
search sees: a filler takes the time of the unit before it in its file (-2 for none), a record
below the log's minimum is -2. Per consume-queue file the column holds the time of every
``STRIDE``-th unit, gathered with vectorised reads of the mapped files. Where a file's times
never decrease and every record in it was readable when gathered, any search for the point
where times reach ``ts`` ends where the binary search ends, so the answer comes from a
bisection of the column and a few probes within one stride. A file whose times go backwards,
or with a unit whose record could not be read, is left to the probing search: its path through
such a file is what defines the answer. So is a timestamp below 0, which -2 does not precede.

Why the column stays true: the units below a file's written position and the records they name
do not change at run time, except that cleanup removes records from the front, which turns a
prefix of the times into -2 (phys offsets never decrease along a file: checked). Appends are
gathered at the next search; a file replaced, cut or cut and written again (its last unit
differs) is gathered again, and so is every file when a commit-log segment other than the
oldest goes.

Cost: a search bisects the column, then probes within one stride (a probe reads a unit and its
record's timestamp; the probing search reads ~log2(n) of each). Per stride the column keeps
its run, how many units from the first share its time: they come before ts. Where times
repeat (a batch is stored at one time) the units after the run mostly have the next stride's
first time; once that stride is gathered the run says so (``REACHES_NEXT``) and a search
that ends in the stride reads no record. Else the unit after the run, which has the stride's
next time, is probed first, and a search reads one record where times repeat; else the stride
is bisected, 5 probes at most (6 after a first probe that missed). What a search needs is
worked out once per state of the queue (``_Plan``) and read without the lock. Memory: 4 bytes
per STRIDE units (0.6 % of the 20-byte units they stand for) while a file's times span less
than 24 days, else 8; a byte of run (and flag) per STRIDE units (0.16 %), the last file's
twice; a few fields per file.
"""

from __future__ import annotations

import struct
import threading
import weakref
from bisect import bisect_left, bisect_right

import numpy as np

from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.record import POS_BORN_HOST, POS_SYSFLAG, SYSFLAG_BORNHOST_V6, host_width
from mqstore.read.time_column import NO_PHYS, REACHES_NEXT, REMOVED, STRIDE, FileTimes

# Units gathered per vectorised pass: bounds the temporary arrays (~50 bytes a unit).
_GATHER_UNITS = 1 << 16
# Up to this many new units are gathered one by one: a vectorised pass costs ~100 us before
# its first unit, a unit alone ~1.5 us (a queue asked often while it grows gains them).
_FEW_UNITS = 48
_HEAD = POS_SYSFLAG + 4  # what the probing search reads to find the timestamp
_TS_V4 = POS_BORN_HOST + host_width(False)
_TS_V6 = POS_BORN_HOST + host_width(True)
_FLAG_BYTE = POS_SYSFLAG + 3  # the big-endian sysflag's low byte holds the v6 bit
_UNIT = struct.Struct(">qi")
_LONG = struct.Struct(">q")

# id(queue) -> (weak reference, its times): a queue object is dropped when its files are
# reloaded, and its times with it.
_indexes: dict[int, tuple] = {}
_indexes_lock = threading.Lock()


def search(commit_log, cq, ts: int, upper: bool) -> int | None:
    """The offset the probing search answers for ``ts`` (clamped as it is), or None when
    the column cannot tell it and the probing search must run."""
    if cq is None or ts < 0:
        return None
    entry = _indexes.get(id(cq))
    index = entry[1] if entry is not None and entry[0]() is cq else _index_of(cq)
    # A plan is never changed once made, so it is read without the lock (see _Plan); the
    # lock keeps two threads from gathering and planning at once.
    plan = index.plan
    if (plan is None or cq.segments.segments is not plan.segs
            or commit_log.segments.segments is not plan.log
            or cq.min_logic_offset != plan.min_logic or plan.last.wrote != plan.wrote
            or (plan.tail_at >= 0
                and _UNIT.unpack_from(plan.last.mm, plan.tail_at) != plan.tail_unit)):
        with index.lock:
            plan = index.replan(commit_log, cq)
        if plan is None:
            return None
    files = plan.files
    if not upper:
        # The first file but the last whose last time reaches ts, else the last file.
        lasts = plan.lasts
        if plan.lasts_sorted:
            i = bisect_left(lasts, ts)
        else:
            i = 0
            while i < len(lasts) and lasts[i] < ts:
                i += 1
        if i == len(lasts) and plan.lasts_cut:
            return None  # the next file is not gathered whole
        chosen = files[i]
    else:
        # The last file whose first time (from the min offset on) is at or before ts.
        heads = plan.heads
        if plan.heads_sorted:
            k = bisect_right(heads, ts) - 1
        else:
            k = len(heads) - 1
            while k >= 0 and not (heads[k] is not None and heads[k] <= ts):
                if heads[k] is None:
                    return None
                k -= 1
        if k < 0:
            return plan.min_off
        chosen = files[plan.heads_at[k]]
    found = _in_file(chosen, ts, upper, plan.min_phys, commit_log)
    if found is None:
        return None
    return plan.min_off if found < plan.min_off else (
        found if found <= plan.max_off else max(plan.min_off, plan.max_off))


def _index_of(cq) -> _QueueTimes:
    key = id(cq)

    def forget(ref) -> None:
        # No lock: the collector may run this while this thread holds it.
        if _indexes.get(key, (None,))[0] is ref:
            _indexes.pop(key, None)

    with _indexes_lock:
        entry = _indexes.get(key)
        if entry is None or entry[0]() is not cq:
            entry = _indexes[key] = (weakref.ref(cq, forget), _QueueTimes())
        return entry[1]


class _QueueTimes:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.files: list[FileTimes] = []  # the files holding units, in order
        self._segs = None  # the queue's segment list when synced
        self._tail = (-1, None)  # its last segment's written bytes and last unit then
        self._complete = False
        self._log = None  # the commit log's segment list when synced
        self.plan: _Plan | None = None  # read without the lock, replaced under it

    def _sync(self, commit_log, cq, min_phys: int) -> None:
        """Gather what was appended; forget files that are gone, replaced or cut. Of the
        commit log's segments only the oldest may go and only new ones come: else every time
        is gathered again."""
        segs = cq.segments.segments
        tail = _tail(segs)
        log = commit_log.segments.segments
        if log is not self._log and not _log_moved_on(self._log, log):
            self.files = []
        self._log = log
        known = {ft.seg.start: ft for ft in self.files}
        files = []
        complete = True
        for seg in segs:
            end = seg.wrote // CQ_UNIT_SIZE
            if not end:
                continue
            ft = known.get(seg.start)
            if ft is None or not ft.unchanged(seg):
                ft = FileTimes(seg)
            if ft.n < end:
                _gather(ft, cq.units_of(seg), end, commit_log, min_phys)
            ft.whole = ft.n == end
            complete = complete and ft.whole
            files.append(ft)
        self.files, self._segs, self._tail, self._complete = files, segs, tail, complete

    def replan(self, commit_log, cq) -> _Plan | None:
        """Gather what is new if anything moved, and work out the plan anew (None when no file
        holds units). A plan is kept only while every unit is gathered: else the next search
        gathers again, as each must. The caller holds the lock."""
        segs = cq.segments.segments
        log = commit_log.segments.segments  # before the minimum: a plan keyed on a newer
        min_phys = commit_log.min_offset    # list than its minimum would go on unnoticed
        if not (self._complete and segs is self._segs and log is self._log
                and _tail(segs) == self._tail):
            self._sync(commit_log, cq, min_phys)
        self.plan = None
        if not self.files:
            return None
        plan = _Plan(self, log, min_phys, cq, commit_log)
        if self._complete:
            self.plan = plan
        return plan


class _Plan:
    """A search's figures for one state of a queue: per file its first offset, the first
    unit at or after the min offset, the times of that unit and of the last one, and where
    the column's bisection starts. It holds while the queue's and the commit log's segment
    lists are the lists it was made from (every file replaced, added or deleted, in either,
    makes a new list), the last file's written end and last unit are unchanged (a cut
    written over again), and the queue's min offset stands: the log's minimum is its first
    segment's start, and gathered units and the records they name do not change otherwise.
    It is kept only when every written unit is gathered; a plan of files not all gathered
    (a record not readable yet) serves one search, as the next gathers again.

    Nothing in a plan changes once it is made: a search reads it while another thread may
    be gathering into the same files. Their columns only grow (each file's plan keeps its
    length) or are replaced; the runs of the last file grow in place, so its plan keeps a
    copy (the other files are full)."""

    __slots__ = ("segs", "log", "last", "wrote", "tail_at", "tail_unit", "min_logic", "min_off",
                 "max_off", "min_phys", "files", "lasts", "lasts_cut", "lasts_sorted", "heads",
                 "heads_at", "heads_sorted")

    def __init__(self, times: _QueueTimes, log, min_phys: int, cq, commit_log) -> None:
        self.segs, self.log, self.min_phys = times._segs, log, min_phys
        self.last = times._segs[-1]
        self.wrote, tail_unit = times._tail
        n = self.wrote // CQ_UNIT_SIZE
        self.tail_at, self.tail_unit = (n - 1) * CQ_UNIT_SIZE if n else -1, tail_unit
        self.min_logic = min_logic = cq.min_logic_offset
        self.min_off = min_logic // CQ_UNIT_SIZE
        self.max_off = cq.max_offset
        last = len(times.files) - 1
        self.files = [_file_plan(ft, min_logic, min_phys, commit_log, i == last)
                      for i, ft in enumerate(times.files)]
        # A lower search walks the files but the last up to the first not gathered whole
        # (where it cannot tell); an upper one, from the last, the files holding units from
        # the min offset on.
        whole = [ft.whole for ft in times.files[:-1]] + [False]
        self.lasts = [fp[4] for fp in self.files[:whole.index(False)]]
        self.lasts_cut = len(self.lasts) < len(self.files) - 1
        self.lasts_sorted = all(a <= b for a, b in zip(self.lasts, self.lasts[1:]))
        self.heads_at = [i for i, (fp, ft) in enumerate(zip(self.files, times.files))
                         if fp[2] * CQ_UNIT_SIZE < ft.seg.wrote]
        self.heads = [self.files[i][5] for i in self.heads_at]
        self.heads_sorted = None not in self.heads and all(
            a <= b for a, b in zip(self.heads, self.heads[1:]))


def _file_plan(ft: FileTimes, min_logic: int, min_phys: int, commit_log, last: bool) -> tuple:
    """A gathered file in a plan, as what ``_in_file`` reads (one tuple, unpacked at once):
    whether the column searches it (monotone, gathered whole), its first offset, the units
    searched (``low`` from the min offset, ``high``), the time of the last and of ``low``
    (None: not known, a probe failed or ``low`` is not gathered yet), the column's first
    stride not removed from ``low`` on and its length now, the column, the runs (a copy for
    the ``last`` file, whose runs grow in place) and the file's map."""
    start = ft.seg.start
    low, high = max(0, min_logic - start) // CQ_UNIT_SIZE, ft.n - 1
    last_phys, last_time = ft.last
    return (ft.monotone and ft.whole, start // CQ_UNIT_SIZE, low, high,
            last_time if last_phys >= min_phys else REMOVED,
            _time(ft, low, min_phys, commit_log) if low * CQ_UNIT_SIZE < ft.seg.wrote else None,
            max(_first_kept(ft, min_phys)[2], -(-low // STRIDE)) if ft.monotone else 0,
            len(ft.times), ft.times, ft.base or 0, bytes(ft.runs) if last else ft.runs,
            ft.seg.mm)


def _log_moved_on(old, new) -> bool:
    """Whether the commit-log segment list ``new`` is ``old`` less some of its first segments
    and with segments added after its last (cleanup and appends, as opposed to a segment
    replaced, cut or missing)."""
    if not old:
        return True
    if not new:
        return False
    for j, seg in enumerate(old):
        if seg is new[0]:
            kept = old[j:]
            return len(new) >= len(kept) and all(a is b for a, b in zip(kept, new))
    return new[0].start >= old[-1].end  # every old segment is gone


def _tail(segs) -> tuple:
    if not segs:
        return -1, None
    last = segs[-1]
    n = last.wrote // CQ_UNIT_SIZE
    return last.wrote, _UNIT.unpack_from(last.mm, (n - 1) * CQ_UNIT_SIZE) if n else None


def _in_file(fp: tuple, ts: int, upper: bool, min_phys: int, commit_log) -> int | None:
    """``time_search._search`` in the chosen file (``_file_plan``): its edge cases, then the
    first unit whose time is >= ts (upper: > ts), where its binary search ends on times that
    never decrease (only such files are searched here)."""
    searched, base, low, high, last_time, t_low, first, strides, times, t_base, runs, mm = fp
    if not searched:
        return None
    if high < low:
        return 0
    if last_time < ts:
        return base + high if upper else base + high + 1
    if t_low is None:
        return None
    if t_low > ts:
        return 0 if upper else base
    # Strides before `first` are removed (-2, below any ts); from there on the column holds
    # the times, so bisecting it finds the stride where ts is reached. Stride j - 1 starts
    # below ts (upper: at or below), and so do the units of its run; stride j starts at or
    # above ts (upper: above), and so do the units after the run when they have its time
    # (flagged): the answer is where the run ends. Else, when times repeat, the unit after
    # the run has the stride's next time, mostly its last: it is probed first.
    j = (bisect_right if upper else bisect_left)(times, ts - t_base, first, strides)
    run = runs[j - 1] if j > first else 0
    if run > STRIDE:
        lo = max(low, (j - 1) * STRIDE + run - REACHES_NEXT)
        if j < strides:  # the next stride's first unit was gathered when the plan was made
            return base + lo - 1 if upper else base + lo
        run -= REACHES_NEXT
    lo = max(low, (j - 1) * STRIDE + (run or 1))
    hi = min(j * STRIDE, high + 1)
    # _probe inlined, keeping the log segment from one probe to the next: these few probes
    # are most of a search's time.
    unit, stamp = _UNIT.unpack_from, _LONG.unpack_from
    bound = ts + 1 if upper else ts  # times are ints: t <= ts is t < ts + 1
    log_mm, log_start, log_end = None, 0, 0
    mid = lo if run > 1 else (lo + hi) // 2  # run 1: times change unit by unit, bisect
    while lo < hi:
        phys, size = unit(mm, mid * CQ_UNIT_SIZE)
        if size == FILLER_SIZE or phys < min_phys:
            t = _probe(mm, mid, min_phys, commit_log)
            if t is None:
                return None
        else:
            if not log_start <= phys < log_end:
                seg = _log_segment(commit_log, phys)
                if seg is None:
                    return None
                log_mm, log_start, log_end = seg.mm, seg.start, seg.start + seg.size
            at = phys - log_start
            t = stamp(log_mm, at + (_TS_V6 if log_mm[at + _FLAG_BYTE] & SYSFLAG_BORNHOST_V6
                                    else _TS_V4))[0]
        if t < bound:
            lo = mid + 1
        else:
            hi = mid
        mid = (lo + hi) // 2
    return base + lo - 1 if upper else base + lo


def _time(ft: FileTimes, idx: int, min_phys: int, commit_log) -> int | None:
    """The time of gathered unit ``idx`` of a file, from what is kept when it can be."""
    if idx >= ft.n:
        return None
    if idx == ft.n - 1 or idx == 0:
        phys, t = ft.last if idx else ft.first
        return t if phys >= min_phys else REMOVED
    if ft.monotone and idx % STRIDE == 0:
        j = idx // STRIDE
        return ft.stride_time(j) if j >= _first_kept(ft, min_phys)[2] else REMOVED
    return _probe(ft.seg.mm, idx, min_phys, commit_log)


def _first_kept(ft: FileTimes, min_phys: int) -> tuple:
    """``ft.kept``: the first stride of a monotone file whose record is not below
    ``min_phys`` (phys offsets never decrease there), found again when the minimum or the
    column moved."""
    strides = len(ft.times)
    if ft.kept[0] == min_phys and ft.kept[1] == strides:
        return ft.kept
    lo, hi = 0, strides
    while lo < hi:
        mid = (lo + hi) // 2
        if _phys_of(ft.seg.mm, mid * STRIDE) < min_phys:
            lo = mid + 1
        else:
            hi = mid
    ft.kept = (min_phys, strides, lo)
    return ft.kept


# -- single units ------------------------------------------------------------------------------
def _phys_of(mm, idx: int) -> int:
    """The phys offset whose record gives unit ``idx`` its time (fillers take the one before)."""
    while idx >= 0:
        phys, size = _UNIT.unpack_from(mm, idx * CQ_UNIT_SIZE)
        if size != FILLER_SIZE:
            return phys
        idx -= 1
    return NO_PHYS


def _probe(mm, idx: int, min_phys: int, commit_log) -> int | None:
    """The time of a gathered unit: its record was readable then and stays so unless cleanup
    removes it. None if its segment is gone all the same (a cleanup under way)."""
    phys = _phys_of(mm, idx)
    if phys < min_phys:
        return REMOVED
    seg = _log_segment(commit_log, phys)
    if seg is None:
        return None
    at = phys - seg.start
    pos = _TS_V6 if seg.mm[at + _FLAG_BYTE] & SYSFLAG_BORNHOST_V6 else _TS_V4
    return _LONG.unpack_from(seg.mm, at + pos)[0]


def _log_segment(commit_log, phys: int):
    """``SegmentQueue.find`` for the commit log, its usual case inlined."""
    log = commit_log.segments
    segs = log.segments
    i = (phys - segs[0].start) // log.segment_bytes if segs else -1
    if 0 <= i < len(segs) and segs[i].start <= phys < segs[i].start + segs[i].size:
        return segs[i]
    return log.find(phys)


# -- gathering ---------------------------------------------------------------------------------
def _gather(ft: FileTimes, units: np.ndarray, end: int, commit_log, min_phys: int) -> None:
    """Extend ``ft`` over units ``[ft.n, end)``, stopping before the first whose record cannot
    be read (a later sync tries it again)."""
    if end - ft.n <= _FEW_UNITS:
        _gather_few(ft, end, commit_log, min_phys)
        return
    while ft.n < end:
        a = ft.n
        chunk = units[a:min(end, a + _GATHER_UNITS)]
        phys = chunk["phys_offset"].astype(np.int64)
        real = chunk["size"] != FILLER_SIZE
        times = np.full(len(chunk), REMOVED, dtype=np.int64)
        readable = np.ones(len(chunk), dtype=bool)
        needed = np.flatnonzero(real & (phys >= min_phys))
        if len(needed):
            times[needed], readable[needed] = _record_times(commit_log, phys[needed])
        bad = np.flatnonzero(~readable)
        m = int(bad[0]) if len(bad) else len(chunk)
        if m == 0:
            return
        real, phys, times = real[:m], phys[:m], times[:m]
        # Each unit's time comes from the last real unit at or before it (-1: one before
        # this chunk, whose phys offset and time are `last`).
        src = np.where(real, np.arange(m), -1)
        np.maximum.accumulate(src, out=src)
        carried = src < 0
        eff_phys = np.where(carried, ft.last[0], phys[src])
        eff_time = np.where(carried, ft.last[1], times[src])
        if ft.monotone:
            ft.monotone = bool(
                eff_phys[0] >= ft.last[0] and eff_time[0] >= ft.last[1]
                and (times[real & (phys >= min_phys)] >= 0).all()
                and (np.diff(eff_phys) >= 0).all() and (np.diff(eff_time) >= 0).all())
            if ft.monotone:
                ft.add_strides(eff_time[-(-a // STRIDE) * STRIDE - a::STRIDE])
                ft.add_runs(a, eff_time, ft.last[1])
                ft.mark_reaching(a, eff_time)
            else:
                ft.drop_column()  # only monotone files are searched with it
        if a == 0:
            ft.first = (int(eff_phys[0]), int(eff_time[0]))
        ft.last = (int(eff_phys[-1]), int(eff_time[-1]))
        ft.last_unit = (int(chunk["phys_offset"][m - 1]), int(chunk["size"][m - 1]))
        ft.n = a + m
        if m < len(chunk):
            return


def _gather_few(ft: FileTimes, end: int, commit_log, min_phys: int) -> None:
    """``_gather`` one unit at a time, to the same effect."""
    mm = ft.seg.mm
    last_phys, last_time = ft.last
    for i in range(ft.n, end):
        unit = _UNIT.unpack_from(mm, i * CQ_UNIT_SIZE)
        phys, size = unit
        before = last_time
        if size != FILLER_SIZE:
            t = REMOVED
            if phys >= min_phys:
                t = _record_time(commit_log, phys)
                if t is None:
                    return
            if ft.monotone and (phys < last_phys or t < last_time or (phys >= min_phys and t < 0)):
                ft.drop_column()
            last_phys, last_time = phys, t
        if ft.monotone:
            if i % STRIDE == 0:
                if i and ft.after_run == last_time:
                    ft.runs[-1] |= REACHES_NEXT
                ft.add_strides(np.array([last_time], dtype=np.int64))
                ft.runs.append(1)
                ft.after_run = None
            elif ft.runs[-1] == i % STRIDE and last_time == before:
                ft.runs[-1] += 1
            elif ft.after_run is None:
                ft.after_run = last_time
        if i == 0:
            ft.first = (last_phys, last_time)
        ft.last, ft.last_unit, ft.n = (last_phys, last_time), unit, i + 1


def _record_time(commit_log, phys: int) -> int | None:
    """``_record_times`` for one record: its time, or None when it cannot be read so."""
    if not commit_log.min_offset <= phys < commit_log.max_offset:
        return None
    seg = _log_segment(commit_log, phys)
    if seg is None:
        return None
    at = phys - seg.start
    try:
        limit = min(seg.committed, len(seg.mm))
        if at + _HEAD > limit:
            return None
        pos = at + (_TS_V6 if seg.mm[at + _FLAG_BYTE] & SYSFLAG_BORNHOST_V6 else _TS_V4)
        return _LONG.unpack_from(seg.mm, pos)[0] if pos + 8 <= limit else None
    except ValueError:  # cleanup closed the segment meanwhile
        return None


def _record_times(commit_log, phys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Store times of the records at ``phys``, and which could be read as ``store_time_at``
    reads them: within ``[min, max)``, the head and the timestamp within one segment's
    readable bytes (a timestamp in the next segment, as any failure, leaves the unit to the
    probing search)."""
    times = np.full(len(phys), -1, dtype=np.int64)
    ok = np.zeros(len(phys), dtype=bool)
    segs = commit_log.segments.segments
    if not segs:
        return times, ok
    starts = np.fromiter((s.start for s in segs), dtype=np.int64, count=len(segs))
    which = np.searchsorted(starts, phys, side="right") - 1
    inside = np.flatnonzero(
        (phys >= commit_log.min_offset) & (phys < commit_log.max_offset) & (which >= 0))
    inside = inside[np.argsort(which[inside], kind="stable")]
    for sel in np.split(inside, np.flatnonzero(np.diff(which[inside])) + 1):
        if not len(sel):
            continue
        seg = segs[int(which[sel[0]])]
        at = phys[sel] - seg.start
        try:
            limit = min(seg.committed, len(seg.mm))
            head = at + _HEAD <= limit
            sel, at = sel[head], at[head]
            flags = np.frombuffer(seg.mm, dtype=np.uint8)[at + _FLAG_BYTE]
            pos = at + np.where(flags & SYSFLAG_BORNHOST_V6, _TS_V6, _TS_V4)
            whole = pos + 8 <= limit
            sel, pos = sel[whole], pos[whole]
            # Records sit at any byte: an int64 view stepping one byte reads each in place.
            wide = np.ndarray((max(0, len(seg.mm) - 7),), dtype=">i8", buffer=seg.mm,
                              strides=(1,))
            times[sel] = wide[pos]
        except ValueError:  # cleanup closed the segment meanwhile: not readable after all
            continue
        ok[sel] = True
    return times, ok

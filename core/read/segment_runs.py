"""A pull's chunk of consume-queue units served column-wise, one commit-log segment at a time.

Consecutive units of a queue point into the same commit-log segment until the log rolls to
the next one; ``_pieces`` cuts a chunk there (and around units no record can be read for), so
that every run inside one segment is checked and gathered in bulk (``served_rows.Rows``), and
only the odd units in between, and the unit of a record that fails the checks, go through the
unit-by-unit walk, which reports each problem.
A run served column-wise follows the walk's rules exactly: it serves the rows the walk would,
stops where the walk would, and leaves the scan's state as the walk would leave it.
"""

from __future__ import annotations

import numpy as np

from mqstore.read import served_rows
from mqstore.plugin_api.filtering import MATCH_ALL
from mqstore.format.cq_unit import FILLER_SIZE
from mqstore.message import GetStatus

# Below this many messages a pull walks unit by unit: the column-wise checks cost a fixed
# few dozen numpy calls, which only pay for themselves over longer batches.
COLUMNS_FROM = 64
# The shortest run served column-wise; shorter ones are walked, for the same reason.
RUN_FROM = 8


class ColumnRuns:
    """The column-wise half of ``pull._Scan`` (whose slots it uses)."""

    # The row of the last run ``_take_columns`` handed back whose record fails the checks
    # (-1: none named): the walk then takes only that unit, not the whole run.
    __slots__ = ("bad_row",)

    def _pieces(self, units) -> tuple:
        """``(pos, sizes, pieces)``: the chunk's commit-log offsets and sizes, and its pieces
        ``(i, j, columns)`` in order: runs of units ``[i, j)`` whose records lie in one
        segment (``columns``) and the units between them, to walk (pos and sizes are None
        when the whole chunk is walked)."""
        k = len(units)
        if self.next_phys_file_start >= 0 or k < 2 or self.max_msgs - self.n < COLUMNS_FROM:
            return None, None, [(0, k, False)]
        pos = units["phys_offset"].astype(np.int64)
        sizes = units["size"].astype(np.int64)
        seg_bytes = self.seg_bytes
        if (int(pos[0]) // seg_bytes == (int(pos[-1]) + int(sizes[-1]) - 1) // seg_bytes
                and int(sizes.min()) >= served_rows.MIN_RECORD and sizes.max() != FILLER_SIZE):
            # The usual chunk, inside one segment: ``_take_columns`` checks every unit's bounds.
            return pos, sizes, [(0, k, True)]
        seg = pos // seg_bytes
        # No record lies across a segment end, so such a unit is damaged: the walk says so.
        odd = ((sizes < served_rows.MIN_RECORD) | (sizes == FILLER_SIZE) | (pos < 0)
               | ((pos + sizes - 1) // seg_bytes != seg))
        seg[odd] = -1  # consecutive odd units make one piece
        cuts = [0, *(np.flatnonzero(seg[1:] != seg[:-1]) + 1).tolist(), k]
        out: list = []
        for i, j in zip(cuts, cuts[1:]):
            columns = seg[i] >= 0 and j - i >= RUN_FROM
            if not columns and out and not out[-1][2]:
                out[-1] = (out[-1][0], j, False)  # one walk over neighbouring odd pieces
            else:
                out.append((i, j, columns))
        return pos, sizes, out

    def _take_columns(self, units, pos, sizes, mask) -> bool | None:
        """Serve the run column-wise (``mask``: its units that may match, None for all); None
        (nothing changed) when it needs the walk, ``bad_row`` naming the row whose record
        fails the checks when that is why."""
        self.bad_row = -1
        if (self.next_phys_file_start >= 0 or len(units) < 2
                or self.max_msgs - self.n < COLUMNS_FROM):
            return None
        log_seg = self.log_seg
        first = int(pos[0])
        if log_seg is None or not self.log_start <= first < self.log_end:
            log_seg = self._segment_of(first)
        if (log_seg is None or int(pos.min()) < self.log_start
                or int((pos + sizes).max()) > self.log_end):
            return None
        try:
            # Held from here on, the array keeps the map readable if cleanup closes it.
            data = served_rows.segment_bytes(log_seg.mm)
        except ValueError:  # closed since the lookup: the walk says so
            return None
        offsets = self.base + np.arange(len(pos), dtype=np.int64)
        rows = served_rows.Rows(log_seg.start, data, pos, sizes, offsets, units["tags_code"],
                              len(self.topic))
        accepted = np.ones(len(pos), dtype=bool) if mask is None else np.array(mask, bool)
        in_mem = (self.max_py - pos) <= self.mem_limit
        checked = np.zeros(len(pos), dtype=bool)
        flt = None if self.flt is MATCH_ALL else self.flt
        filtered = 0
        while True:
            stop = self._full_at(accepted, sizes, in_mem)
            todo = np.flatnonzero(accepted[:stop] & ~checked[:stop])
            if not len(todo):
                break
            if not rows.check(todo, self.topic, self.queue_id, self.req.verify_crc,
                              self.commit_log.crc_range):
                self.bad_row = self._first_bad(rows, todo)
                return None  # the walk names what is wrong with which record
            checked[todo] = True
            rejected = rows.reject(todo, flt) if flt is not None else ()
            if not len(rejected):
                break
            accepted[rejected] = False
            filtered += len(rejected)
        served = np.flatnonzero(accepted[:stop])
        result = self.result
        result.filtered_count += filtered
        if len(served):
            self.parts.append(rows.take(served))
            self.n += len(served)
            self.total += int(sizes[served].sum())
            result.status = GetStatus.FOUND
        if stop:
            self.max_phys_pulling = int(pos[stop - 1])
            self.nxt = self.base + stop
            if not self.n:
                result.status = GetStatus.NO_MATCHED_MESSAGE
        return stop == len(pos)

    def _first_bad(self, rows, todo) -> int:
        """The first row of ``todo`` (which fails the checks) whose record fails them, found
        by halving: about one more check of the rows, far less than walking them."""
        lo, hi = 0, len(todo)  # todo[lo:hi] holds the first failing row
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if rows.check(todo[lo:mid], self.topic, self.queue_id, self.req.verify_crc,
                          self.commit_log.crc_range):
                lo = mid
            else:
                hi = mid
        return int(todo[lo])

    def _full_at(self, accepted, sizes, in_mem) -> int:
        """The first unit at which the batch counts as full (isTheBatchFull) when exactly the
        ``accepted`` units are served; the run's length when none."""
        lim = self.limits
        k = len(accepted)
        if accepted.all() and (in_mem.all() or not in_mem.any()):
            # Every unit served, one set of limits: full where the count or the bytes reach it.
            mem = bool(in_mem[0])
            n = self.n
            count_at = min(self.max_msgs, lim.mem_count if mem else lim.disk_count) - n
            room = min(self.max_pull, lim.mem_bytes if mem else lim.disk_bytes) - self.total
            bytes_at = int(np.searchsorted(np.cumsum(sizes), room, side="right"))
            stop = min(max(count_at, 0), bytes_at, k)
            if n or stop:
                return stop
            # The first message of a pull is always served, whatever its size.
            return min(max(count_at, 1), max(bytes_at, 1), k) if count_at > 0 else 1
        a = accepted.astype(np.int64)
        n_before = self.n + np.cumsum(a) - a
        sized = a * sizes
        with_it = self.total + np.cumsum(sized) - sized + sizes
        full = (n_before > 0) & ((n_before + 1 > self.max_msgs) | (with_it > self.max_pull) | (
            np.where(in_mem, (with_it > lim.mem_bytes) | (n_before >= lim.mem_count),
                     (with_it > lim.disk_bytes) | (n_before >= lim.disk_count))))
        hit = np.flatnonzero(full)
        return int(hit[0]) if len(hit) else len(accepted)

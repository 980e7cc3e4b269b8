"""One topic/queue's consume queue: a segmented array of 20-byte units (see ``cq_unit``).

Lives in ``consumequeue/<topic>/<queueId>/<20-digit stream offset>``; files are created at full
size when the first unit lands in them. Positions are byte offsets in the unit stream, queue
offsets are ``position / 20``.

Written only by dispatch (single writer); readers take numpy views of ``[min, max)``.

With a ``MappedBudget`` a queue nobody used lately may be parked (its files unmapped, its
positions kept) and is mapped again when next used: NOTE [ Mapped budget ] in
``storage.mapped_budget``. Every method that touches the maps is bracketed (``maps``).
"""

from __future__ import annotations

import os
import struct
import time

import numpy as np

from mqstore.format.cq_unit import (
    CQ_DTYPE, CQ_UNIT_SIZE, FILLER_SIZE, fillers, joined, last_end, unwritten, valid_prefix,
    valid_run, written_count,
)
from mqstore.storage.mapped_budget import Parkable, maps
from mqstore.storage.queue_cuts import QueueCuts
from mqstore.storage.mapped_file import MappedFile, segment_name
from mqstore.storage.segment_queue import SegmentQueue

CONSUME_QUEUE_DIR = "consumequeue"
RECOVER_LAST_FILES = 3
_UNIT = struct.Struct(">qiq")  # one unit, as CQ_DTYPE lays it out


class ConsumeQueue(Parkable, QueueCuts):
    def __init__(self, root: str, topic: str, queue_id: int, file_bytes: int | None, *,
                 read_only: bool = False, on_warning=None, known_bytes: int | None = None,
                 budget=None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, CONSUME_QUEUE_DIR, topic, str(queue_id))
        self.segments = SegmentQueue(self.directory, file_bytes, read_only=read_only,
                                     on_warning=on_warning, growing=False, known_bytes=known_bytes)
        self._warn = on_warning or (lambda _m: None)
        self.min_logic_offset = 0  # bytes; raised by cleanup and pre-blank fill
        self.max_phys = -1  # end (offset + size) of the last real unit
        self._arrays: dict[int, np.ndarray] = {}
        self._doubt: tuple[int, float] | None = None  # a follower's unit that disagreed, since
        self._budget = budget  # a MappedBudget, or None: always mapped
        self.parked = False
        self._first: tuple | None = None  # first_phys, and where it was found

    # -- positions -------------------------------------------------------------------------
    @property
    def file_bytes(self) -> int:
        return self.segments.segment_bytes

    @property
    def max_offset(self) -> int:
        return self.segments.max_offset // CQ_UNIT_SIZE

    @property
    def min_offset(self) -> int:
        return self.min_logic_offset // CQ_UNIT_SIZE

    def first_phys(self) -> int | None:
        """Commit-log offset of the queue's first stored message, or None when it has none.
        Remembered once found, while the files before it and its unit stand (units are only
        appended; cleanup drops whole files, a cut lowers ``wrote``): the manifest asks every
        queue each time it is written, and a parked queue answers without being mapped."""
        known = self._first
        if known is not None:
            first_seg, seg, end, phys = known
            segs = self.segments.segments
            if segs and segs[0] is first_seg and seg.wrote >= end and (
                    seg is first_seg or seg in segs):
                return phys
        return self._find_first()

    @maps
    def _find_first(self) -> int | None:
        segs = self.segments.segments
        for seg in segs:
            units = self.units_of(seg)[:seg.wrote // CQ_UNIT_SIZE]
            real = np.flatnonzero((units["size"] != FILLER_SIZE) & (units["size"] > 0))
            if len(real):
                phys = int(units[real[0]]["phys_offset"])
                self._first = (segs[0], seg, (int(real[0]) + 1) * CQ_UNIT_SIZE, phys)
                return phys
        return None

    @maps
    def stored_units(self, seg: MappedFile) -> np.ndarray:
        """The units of ``seg`` up to its first hole (the rest of a sparse file is zeros and
        must not be read through the map: see ``MappedFile.data_end``)."""
        return self.units_of(seg)[:seg.data_end() // CQ_UNIT_SIZE]

    @maps
    def units_of(self, seg: MappedFile) -> np.ndarray:
        arr = self._arrays.get(seg.start)
        if arr is None:
            # Whole units only: a file cut short mid-unit (read-only opens map it as it is).
            arr = self._arrays[seg.start] = np.frombuffer(
                seg.mm, dtype=CQ_DTYPE, count=len(seg.mm) // CQ_UNIT_SIZE)
        return arr

    # -- load / recover --------------------------------------------------------------------
    def load(self) -> list[str]:
        return self.segments.load()

    @maps
    def recover(self) -> int:
        """Cut the queue after its last valid unit (see ``valid_prefix``, checked over the last
        RECOVER_LAST_FILES files); returns how many written units were cut."""
        segs = self.segments.segments
        if not segs:
            return 0
        first = max(0, len(segs) - RECOVER_LAST_FILES)
        prev_end = -1
        if first:
            # Where the unchecked files' records end, up to any damage in them: a damaged
            # unit's garbage end there would put every checked unit out of order.
            _n, prev_end = valid_run(self.stored_units(segs[first - 1]))
        end_seg, end_pos = segs[first], 0
        for seg in segs[first:]:
            n, prev_end = valid_run(self.stored_units(seg), prev_end)
            end_seg, end_pos = seg, n * CQ_UNIT_SIZE
            if n < seg.size // CQ_UNIT_SIZE:
                break
        dropped = written_count(self.stored_units(end_seg)[end_pos // CQ_UNIT_SIZE:])
        for seg in segs:
            if seg.start > end_seg.start:
                dropped += written_count(self.stored_units(seg))
        self._zero_tail(end_seg, end_pos)
        self.segments.truncate_to(end_seg.start + end_pos)
        self._prune_arrays()
        self._refresh_max_phys()
        return dropped

    @maps
    def tail(self) -> tuple[int, int]:
        """``(max offset, max phys)`` as the files stand, unchecked: the write position is
        after the last unit ever written (an unwritten unit is zeros; a written one never has
        size 0). For the clean-shutdown marker (``storage.clean_marker``), describing files
        whose only writer, dispatch, has stopped."""
        max_offset, max_phys = 0, -1
        for seg in reversed(self.segments.segments):
            units = self.stored_units(seg)
            written = np.flatnonzero(units["size"] != 0)
            if not len(written):
                continue
            if not max_offset:
                max_offset = (seg.start + (int(written[-1]) + 1) * CQ_UNIT_SIZE) // CQ_UNIT_SIZE
            real = written[units["size"][written] != FILLER_SIZE]
            if len(real):
                last = units[int(real[-1])]
                max_phys = int(last["phys_offset"]) + int(last["size"])
                break
        return max_offset, max_phys

    def restore(self, max_offset: int, max_phys: int) -> None:
        """Take the positions a trusted clean-shutdown marker recorded instead of checking
        the units (``recover``): the files are as they were when the marker described them."""
        self.segments.truncate_to(max_offset * CQ_UNIT_SIZE)
        self._prune_arrays()
        self.max_phys = max_phys

    def _refresh_max_phys(self) -> None:
        self.max_phys = -1
        for seg in reversed(self.segments.segments):
            n = seg.wrote // CQ_UNIT_SIZE
            if n:
                units = self.units_of(seg)[:n]
                real = np.flatnonzero(units["size"] != FILLER_SIZE)
                if len(real):
                    last = units[real[-1]]
                    self.max_phys = int(last["phys_offset"]) + int(last["size"])
                    return

    @maps
    def _zero_tail(self, seg: MappedFile, end: int) -> None:
        """Zero cut units so a later recovery cannot take them for valid ones again."""
        if self.segments.read_only:
            return
        units = self.stored_units(seg)
        live = np.flatnonzero(units["size"][end // CQ_UNIT_SIZE:] != 0)
        if len(live):
            seg.zero(end, end + (int(live[-1]) + 1) * CQ_UNIT_SIZE)

    def _prune_arrays(self) -> None:
        live = {seg.start for seg in self.segments.segments}
        for start in [s for s in self._arrays if s not in live]:
            del self._arrays[start]

    # -- following another writer ----------------------------------------------------------
    # Units a follower's look examines at a time; it goes on only while a window fills.
    _REFRESH_WINDOW = 1024
    # The last units a look admits are where a copy in progress could have been caught.
    _TAIL_CHECK = 4
    # A unit at the tail that keeps disagreeing with its record is damaged, not being copied:
    # it is admitted after this long and the pull reports it, as the writer's own pulls do.
    _DOUBT_S = 1.0

    def follow(self) -> None:
        """Turn this object into a read view of a queue written by another process: positions
        restart at its first file and ``refresh`` advances them over units it can trust."""
        for seg in self.segments.segments:
            seg.wrote = seg.flushed = 0
        self.max_phys = -1
        self.min_logic_offset = max(self.segments.min_offset, 0)

    @maps
    def refresh(self, limit_phys: int, commit_log=None) -> None:
        """Advance over units appended since the last look whose records end at or below
        ``limit_phys`` (the writer's published position). A unit counts only if it is sane
        (``valid_prefix``: fillers anywhere, records in increasing order), so a unit caught
        half-copied is seen on a later look. ``commit_log``: the limit is only how far the
        log checks out, which says nothing about the units, so the last units admitted are
        also compared with the records they name.

        A look examines a window of units at a time and takes the next only when the window
        was admitted whole: its cost is what is new, not the rest of the file."""
        while True:
            seg = self._filling()
            if seg is None or not self._admit(seg, limit_phys, commit_log):
                return

    @maps
    def follow_min_offset(self, min_phys: int) -> None:
        """Raise the min offset to the first unit whose record is still stored, as the writer
        raises its own (it is in no file). A look reads the unit at the min offset; only when
        that one is a filler or names a deleted record does a search run, from there on."""
        seg = self.segments.find(self.min_logic_offset)
        if seg is None or self.min_logic_offset - seg.start >= seg.wrote:
            return  # nothing admitted there yet
        at = (self.min_logic_offset - seg.start) // CQ_UNIT_SIZE
        unit = self.units_of(seg)[at]
        if unit["size"] != FILLER_SIZE and unit["phys_offset"] >= min_phys:
            return
        for seg in self.segments.segments[self.segments.segments.index(seg):]:
            units = self.units_of(seg)[at:seg.wrote // CQ_UNIT_SIZE]
            kept = np.flatnonzero((units["phys_offset"] >= min_phys)
                                  & (units["size"] != FILLER_SIZE))
            if len(kept):
                self.min_logic_offset = seg.start + (at + int(kept[0])) * CQ_UNIT_SIZE
                return
            at = 0
        self.min_logic_offset = self.segments.max_offset  # every admitted record is gone

    def _filling(self) -> MappedFile | None:
        """The first segment not yet admitted whole (earlier ones are), after mapping new
        files and forgetting deleted ones when there is none."""
        segs = self.segments.segments
        i = len(segs)
        while i and segs[i - 1].wrote < segs[i - 1].size:
            i -= 1
        if i < len(segs):
            return segs[i]
        added = self.segments.refresh(prune=True, most=1)
        self._prune_arrays()
        # Cleanup deleted the files before the first one left: their offsets are gone.
        self.min_logic_offset = max(self.min_logic_offset, self.segments.min_offset)
        return self.segments.segments[-1] if added else None

    def _admit(self, seg: MappedFile, limit_phys: int, commit_log) -> bool:
        """Admit the next window of ``seg``'s units that checks out; True when all of it did
        (there may be more)."""
        first = seg.wrote // CQ_UNIT_SIZE
        live = self.units_of(seg)[first:first + self._REFRESH_WINDOW]
        if not len(live) or (live["size"][0] == 0 and (
                commit_log is None or (len(live) > 1 and unwritten(live[1])))):
            # Nothing new: an idle look reads a unit or two. A zeroed unit with something
            # after it may be damage that later units vouch for (see below).
            return False
        units = live.copy()  # every check below sees the same bytes
        n = valid_prefix(units, self.max_phys)
        real = units["size"][:n] != FILLER_SIZE
        ends = units["phys_offset"][:n].astype(np.int64) + units["size"][:n].astype(np.int64)
        beyond = np.flatnonzero(real & (ends > limit_phys))
        if len(beyond):
            n = int(beyond[0])
        sane = n
        if n and commit_log is not None:
            n = self._confirmed(seg, first, units, live, n, commit_log)
        if n == sane < len(units) and commit_log is not None:
            # Stopped at a unit that is not sane: a tail being written or torn, or damage.
            # Only the log tells which (without it, this is the writer's own process: its
            # dispatch recovered the queue and rebuilt what was damaged).
            prev_end = max(self.max_phys, last_end(units[:n]))
            damaged = self._damage_run(seg, first + n, units[n:n + 1], prev_end, limit_phys,
                                       commit_log)
            if damaged is not None:
                self._take(seg, first, joined(units[:n], damaged), prev_end)
                return True
        if n:
            self._take(seg, first, units[:n])
        return n == len(live)

    # Damaged units in a row a look passes on to pulls; a longer run is taken for a tail.
    _DAMAGE_RUN = 16

    def _damage_run(self, seg: MappedFile, at: int, seen: np.ndarray, prev_end: int,
                    limit_phys: int, commit_log) -> np.ndarray | None:
        """The units of ``seg`` from index ``at`` (not sane; ``seen`` as the look read it) that
        are damage: a run followed, within _DAMAGE_RUN, by a unit that is sane, in order after
        ``prev_end``, names a record below ``limit_phys`` and is that record's unit. Dispatch
        writes units in order, so the run was written before that unit and what it holds now
        is final. The writer's open keeps such a queue's length as well (recovery rebuilds
        it); pulls serve the run's records from the log and report them. None when no unit
        vouches for the run: units past the end after the last intact one are a tail (torn,
        or still being copied), kept hidden."""
        ahead = self.units_of(seg)[at + 1:at + 1 + self._DAMAGE_RUN].copy()
        if len(ahead) < self._DAMAGE_RUN:  # the run may end in the next file
            ahead = joined(ahead, self._first_units_after(seg, self._DAMAGE_RUN - len(ahead)))
        base = seg.start // CQ_UNIT_SIZE + at + 1  # queue offset of ahead[0]
        for i, unit in enumerate(ahead):
            phys, size = int(unit["phys_offset"]), int(unit["size"])
            if phys == 0 and size == 0:
                return None  # not written yet: what comes before is the tail so far
            if (size == FILLER_SIZE or size <= 0 or phys < prev_end or phys + size > limit_phys
                    or not self._record_is(commit_log, phys, size, base + i)):
                continue
            run = joined(seen, ahead[:i])[:seg.size // CQ_UNIT_SIZE - at]
            if self.units_of(seg)[at:at + len(run)].tobytes() != run.tobytes():
                return None  # read while being written: the next look decides
            self._warn(f"consume queue {self.topic}/{self.queue_id}: unit(s) {base - 1}.."
                       f"{base + len(run) - 2} damaged, followed by intact units; passed on "
                       f"to pulls, which serve their records from the commit log and report "
                       f"them (mqstore check --fix rebuilds the queue)")
            return run
        return None

    def _first_units_after(self, seg: MappedFile, count: int) -> np.ndarray:
        """Up to ``count`` first units of the file after ``seg``, read without mapping it: a
        follower maps a file once the ones before are admitted (see ``SegmentQueue.refresh``),
        and a read-only recovery forgets the files after a cut."""
        start = seg.start + seg.size
        for later in self.segments.segments:
            if later.start == start:
                return self.units_of(later)[:count].copy()
        try:
            with open(os.path.join(self.directory, segment_name(start)), "rb") as f:
                raw = os.pread(f.fileno(), count * CQ_UNIT_SIZE, 0)
        except OSError:  # none yet, or deleted meanwhile
            raw = b""
        return np.frombuffer(raw[:len(raw) - len(raw) % CQ_UNIT_SIZE], dtype=CQ_DTYPE).copy()

    def _confirmed(self, seg: MappedFile, first: int, units: np.ndarray, live: np.ndarray,
                   n: int, commit_log) -> int:
        """How many of the ``n`` sane units to admit. Copies append in order, so a unit caught
        half-written is among the last: those are compared with their records, then with the
        file again (a tags code still being copied changes); admission stops before the
        first that differs, unless it has differed for _DOUBT_S."""
        lo = max(0, n - self._TAIL_CHECK)
        base = (seg.start // CQ_UNIT_SIZE) + first  # queue offset of units[0]
        ok = lo
        while ok < n and (units["size"][ok] == FILLER_SIZE or self._record_is(
                commit_log, int(units["phys_offset"][ok]), int(units["size"][ok]), base + ok)):
            ok += 1
        changed = np.flatnonzero(live[lo:ok] != units[lo:ok])
        if len(changed):
            ok = lo + int(changed[0])
        if ok == n:
            self._doubt = None
            return n
        return ok + self._doubted(base + ok)

    def _record_is(self, commit_log, phys: int, size: int, queue_offset: int) -> bool:
        """Whether the record at ``phys`` is the one a unit of this queue says is there."""
        if phys < commit_log.min_offset:
            return True  # cleanup removed it: nothing to compare, the pull says so
        head = commit_log.read(phys, 36)
        if head is None:
            return False
        head = bytes(head)
        # TOTALSIZE @0, QUEUEID @12, QUEUEOFFSET @20, PHYSICALOFFSET @28 (format.record)
        return (int.from_bytes(head[0:4], "big", signed=True) == size
                and int.from_bytes(head[12:16], "big", signed=True) == self.queue_id
                and int.from_bytes(head[20:28], "big", signed=True) == queue_offset
                and int.from_bytes(head[28:36], "big", signed=True) == phys)

    def _doubted(self, queue_offset: int) -> int:
        """1 once the unit at ``queue_offset`` has disagreed for _DOUBT_S, else 0."""
        now = time.monotonic()
        doubt = self._doubt
        if doubt is None or doubt[0] != queue_offset:
            self._doubt = (queue_offset, now)
            return 0
        if now - doubt[1] < self._DOUBT_S:
            return 0
        self._doubt = None
        self._warn(f"consume queue {self.topic}/{self.queue_id}: unit {queue_offset} does not "
                   f"match the record it names; passed on to pulls, which report it")
        return 1

    def _take(self, seg: MappedFile, first: int, units: np.ndarray,
              max_phys: int | None = None) -> None:
        """Admit ``units`` from index ``first`` of ``seg``; ``max_phys``: the end of the last
        record they name, when the last ones are damaged (their own ends are garbage)."""
        pos = seg.start + first * CQ_UNIT_SIZE
        filler = units["size"] == FILLER_SIZE
        if self.max_phys < 0 and pos == self.min_logic_offset:
            # Fillers ahead of a queue's first message pad offsets it never had: below its min.
            lead = int(np.argmin(filler)) if not filler.all() else len(units)
            self.min_logic_offset = pos + lead * CQ_UNIT_SIZE
        seg.wrote = (first + len(units)) * CQ_UNIT_SIZE
        real = units[~filler]
        if max_phys is not None:
            self.max_phys = max_phys
        elif len(real):
            self.max_phys = int(real["phys_offset"][-1]) + int(real["size"][-1])

    # -- writing (dispatch only) -----------------------------------------------------------
    @maps
    def put_units(self, first_queue_offset: int, units: np.ndarray) -> int:
        """Append ``units`` (CQ_DTYPE) meant for queue offsets ``first_queue_offset ...``.

        Units already built (their commit-log end is not past ``max_phys``) or whose queue
        offset is below the write position are skipped, which makes re-dispatch idempotent.
        Returns the number of units written.
        """
        ends = units["phys_offset"].astype(np.int64) + units["size"].astype(np.int64)
        fresh = np.flatnonzero(ends > self.max_phys)
        if not len(fresh):
            return 0
        skip = int(fresh[0])
        dup = self._placed(first_queue_offset + skip, len(units) - skip)
        units = units[skip + dup:]
        if not len(units):
            return 0
        self._write(units.tobytes())
        last = units[-1]
        self.max_phys = int(last["phys_offset"]) + int(last["size"])
        return len(units)

    @maps
    def put_few(self, first_queue_offset: int, units: list[tuple[int, int, int]]) -> int:
        """``put_units`` for a handful of units given as ``(commit-log offset, size, tags
        code)``: the same skips, the same bytes, without arrays (whose fixed costs would be
        most of the work)."""
        max_phys = self.max_phys
        skip = next((i for i, (phys, size, _code) in enumerate(units) if phys + size > max_phys),
                    None)
        if skip is None:
            return 0
        dup = self._placed(first_queue_offset + skip, len(units) - skip)
        units = units[skip + dup:]
        if not units:
            return 0
        pack = _UNIT.pack
        self._write(b"".join([pack(*unit) for unit in units]))
        phys, size, _code = units[-1]
        self.max_phys = phys + size
        return len(units)

    def _placed(self, queue_offset: int, count: int) -> int:
        """How many of ``count`` units from ``queue_offset`` the queue holds already; fillers
        first where the queue ends below ``queue_offset``."""
        write_pos = self.segments.max_offset
        expected = queue_offset * CQ_UNIT_SIZE
        if expected < write_pos:
            return min(count, (write_pos - expected) // CQ_UNIT_SIZE)
        if expected > write_pos:
            if not self.segments.segments and write_pos == 0:
                self._pre_blank_fill(expected)
            else:
                # The records of the offsets in between are gone (quarantined, or in a lost
                # segment): fillers keep every later unit at its own queue offset.
                self._warn(
                    f"consume queue {self.topic}/{self.queue_id}: queue offsets "
                    f"{write_pos // CQ_UNIT_SIZE}..{queue_offset - 1} have no record in the "
                    f"commit log; fillers hold their places")
                self._append(fillers((expected - write_pos) // CQ_UNIT_SIZE))
        return 0

    @maps
    def hold_offsets(self, floor: int) -> int:
        """Fillers for the offsets up to ``floor`` that the queue has no unit for: their
        messages are gone, and the next unit must take ``floor`` (NOTE [ Offset floors ] in
        ``offset_floor``). Dispatch only, once it has written every unit the log still
        holds; returns how many offsets it held."""
        missing = floor - self.max_offset
        if missing <= 0:
            return 0
        self._warn(f"consume queue {self.topic}/{self.queue_id}: queue offsets "
                   f"{self.max_offset}..{floor - 1} were given out before and their messages "
                   f"are gone; fillers hold their places")
        if not self.segments.segments:
            self._pre_blank_fill(floor * CQ_UNIT_SIZE)
        else:
            self._append(fillers(missing))
        return missing

    def _pre_blank_fill(self, expected: int) -> None:
        seg = self.segments.create_next(expected)
        seg.write(fillers((expected - seg.start) // CQ_UNIT_SIZE).tobytes())
        self.min_logic_offset = expected

    def _append(self, units: np.ndarray) -> None:
        self._write(units.tobytes())

    def _write(self, raw: bytes) -> None:
        at = 0
        while at < len(raw):
            seg = self.segments.last()
            if seg is None or seg.is_full():
                seg = self.segments.create_next()
            take = min(seg.remaining, len(raw) - at)
            seg.write(raw[at:at + take])
            at += take

    @maps
    def delete_files_below(self, min_phys: int) -> list[str]:
        """Delete leading files (never the last) whose every unit points below ``min_phys``."""
        count = 0
        segs = self.segments.segments
        for seg in segs[:-1]:
            n = seg.wrote // CQ_UNIT_SIZE
            if n and int(self.units_of(seg)[n - 1]["phys_offset"]) >= min_phys:
                break
            count += 1
        for seg in segs[:count]:
            self._arrays.pop(seg.start, None)
        removed = self.segments.drop_first(count)
        if removed:
            self.min_logic_offset = max(self.min_logic_offset, self.segments.min_offset)
        return removed

    @maps
    def correct_min_offset(self, min_phys: int) -> None:
        """Raise ``min`` to the first unit whose commit-log offset is still stored."""
        segs = self.segments.segments
        if not segs:
            return
        last = segs[-1]
        units = self.units_of(last)[:last.wrote // CQ_UNIT_SIZE]
        real = np.flatnonzero(units["size"] != FILLER_SIZE)
        if len(real) and int(units[real[-1]]["phys_offset"]) < min_phys:
            self.min_logic_offset = self.segments.max_offset  # every stored unit is gone
            return
        for seg in segs:
            n = seg.wrote // CQ_UNIT_SIZE
            units = self.units_of(seg)[:n]
            ok = np.flatnonzero((units["phys_offset"] >= min_phys) & (units["size"] != FILLER_SIZE))
            if len(ok):
                self.min_logic_offset = max(self.min_logic_offset,
                                            seg.start + int(ok[0]) * CQ_UNIT_SIZE)
                return

    def flush(self) -> None:
        self.segments.flush()

    def close(self) -> None:
        self._arrays.clear()
        self.segments.close()
        self.forget()

    def destroy(self) -> None:
        self._arrays.clear()
        self.segments.destroy()
        self.forget()


def load_consume_queues(root: str, file_bytes: int, *, read_only: bool, on_warning=None,
                        known_bytes: int | None = None, notes: list[str] | None = None,
                        budget=None) -> dict[tuple[str, int], ConsumeQueue]:
    """Every ``consumequeue/<topic>/<int queueId>`` under ``root``, loaded (not recovered).

    Each queue keeps the file size its files have (``known_bytes`` when the store recorded
    one); ``file_bytes`` applies to queues with no file yet. What loading repaired or found
    wrong goes to ``notes``. ``budget``: a ``MappedBudget`` governing them from the load on,
    so a store of more queues than it allows opens without mapping them all at once.
    """
    base = os.path.join(root, CONSUME_QUEUE_DIR)
    queues: dict[tuple[str, int], ConsumeQueue] = {}
    if not os.path.isdir(base):
        return queues
    for topic in sorted(os.listdir(base)):
        tdir = os.path.join(base, topic)
        if not os.path.isdir(tdir):
            continue
        for qname in sorted(os.listdir(tdir)):
            if not qname.isdigit() or not os.path.isdir(os.path.join(tdir, qname)):
                continue
            cq = ConsumeQueue(root, topic, int(qname), None if read_only else file_bytes,
                              read_only=read_only, on_warning=on_warning,
                              known_bytes=known_bytes)
            found = cq.load()
            if notes is not None:
                notes.extend(found)
            if cq.segments.segment_bytes is None:
                cq.segments.segment_bytes = file_bytes
            if budget is not None:
                cq.govern(budget)
            queues[(topic, int(qname))] = cq
    return queues

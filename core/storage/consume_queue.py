"""One topic/queue's consume queue: a segmented array of 20-byte units (see ``cq_unit``).

Lives in ``consumequeue/<topic>/<queueId>/<20-digit stream offset>``; files are created at full
size when the first unit lands in them. Positions are byte offsets in the unit stream, queue
offsets are ``position / 20``.

Written only by dispatch (single writer); readers take numpy views of ``[min, max)``.
"""

from __future__ import annotations

import os

import numpy as np

from mqstore.format.cq_unit import CQ_DTYPE, CQ_UNIT_SIZE, FILLER_SIZE, valid_prefix
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.segment_queue import SegmentQueue

CONSUME_QUEUE_DIR = "consumequeue"
RECOVER_LAST_FILES = 3


class ConsumeQueue:
    def __init__(self, root: str, topic: str, queue_id: int, file_bytes: int | None, *,
                 read_only: bool = False, on_warning=None) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self.directory = os.path.join(root, CONSUME_QUEUE_DIR, topic, str(queue_id))
        self.segments = SegmentQueue(self.directory, file_bytes, read_only=read_only,
                                     on_warning=on_warning, whole=False)
        self._warn = on_warning or (lambda _m: None)
        self.min_logic_offset = 0  # bytes; raised by cleanup and pre-blank fill
        self.max_phys = -1  # end (offset + size) of the last real unit
        self._arrays: dict[int, np.ndarray] = {}

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

    def units_of(self, seg: MappedFile) -> np.ndarray:
        arr = self._arrays.get(seg.start)
        if arr is None:
            arr = self._arrays[seg.start] = np.frombuffer(seg.mm, dtype=CQ_DTYPE)
        return arr

    # -- load / recover --------------------------------------------------------------------
    def load(self) -> list[str]:
        return self.segments.load()

    def recover(self) -> int:
        """Cut the queue after its last valid unit; returns the number of units dropped."""
        segs = self.segments.segments
        if not segs:
            return 0
        first = max(0, len(segs) - RECOVER_LAST_FILES)
        end_seg, end_pos = segs[first], 0
        for seg in segs[first:]:
            units = self.units_of(seg)
            n = valid_prefix(units)
            end_seg, end_pos = seg, n * CQ_UNIT_SIZE
            if n < len(units):
                break
        dropped = 0
        for seg in segs:
            if seg.start > end_seg.start:
                dropped += valid_prefix(self.units_of(seg))
        self._zero_tail(end_seg, end_pos)
        self.segments.truncate_to(end_seg.start + end_pos)
        self._prune_arrays()
        self._refresh_max_phys()
        return dropped

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

    def _zero_tail(self, seg: MappedFile, end: int) -> None:
        """Zero cut units so a later recovery cannot take them for valid ones again."""
        if self.segments.read_only:
            return
        units = self.units_of(seg)
        live = np.flatnonzero(units["size"][end // CQ_UNIT_SIZE:] != 0)
        if len(live):
            seg.zero(end, end + (int(live[-1]) + 1) * CQ_UNIT_SIZE)

    def _prune_arrays(self) -> None:
        live = {seg.start for seg in self.segments.segments}
        for start in [s for s in self._arrays if s not in live]:
            del self._arrays[start]

    # -- following another writer ----------------------------------------------------------
    def follow(self) -> None:
        """Turn this object into a read view of a queue written by another process: positions
        restart at zero and ``refresh`` advances them over units it can trust."""
        for seg in self.segments.segments:
            seg.wrote = seg.flushed = 0
        self.max_phys = -1
        self._following = True

    def refresh(self, limit_phys: int) -> None:
        """Advance over units appended since the last look whose records end at or below
        ``limit_phys`` (the writer's published dispatch position). A unit counts only if its
        offset and size are sane and offsets keep increasing, so a unit caught half-copied is
        simply seen on the next refresh."""
        while True:
            segs = self.segments.segments
            seg = next((x for x in segs if x.wrote < x.size), None)
            if seg is None:
                if not self.segments.refresh():
                    return
                continue
            start = seg.wrote // CQ_UNIT_SIZE
            units = self.units_of(seg)[start:]
            phys = units["phys_offset"].astype(np.int64)
            size = units["size"].astype(np.int64)
            filler = size == FILLER_SIZE
            real = ~filler
            ends = phys + size
            ok = (phys >= 0) & (size > 0) & (~real | (ends <= limit_phys))
            # offsets increase along the queue; fillers only ever precede the first real unit
            prev_end = np.maximum.accumulate(np.where(real, ends, -1))
            prev_end = np.concatenate(([self.max_phys], prev_end[:-1]))
            prev_end = np.maximum(prev_end, self.max_phys)
            ok &= np.where(real, phys >= prev_end, prev_end < 0)
            bad = np.flatnonzero(~ok)
            n = int(bad[0]) if len(bad) else len(units)
            if n == 0:
                return
            if start == 0 and seg is segs[0] and filler[0] and self.min_logic_offset == 0:
                head = np.flatnonzero(~filler[:n])
                self.min_logic_offset = seg.start + (int(head[0]) if len(head) else n) * CQ_UNIT_SIZE
            seg.wrote = (start + n) * CQ_UNIT_SIZE
            reals = np.flatnonzero(real[:n])
            if len(reals):
                self.max_phys = int(ends[reals[-1]])
            if seg.wrote < seg.size:
                return

    # -- writing (dispatch only) -----------------------------------------------------------
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
        units = units[skip:]
        qoff = first_queue_offset + skip
        write_pos = self.segments.max_offset
        expected = qoff * CQ_UNIT_SIZE
        if expected < write_pos:
            dup = min(len(units), (write_pos - expected) // CQ_UNIT_SIZE)
            units = units[dup:]
            if not len(units):
                return 0
        elif expected > write_pos:
            if not self.segments.segments and write_pos == 0:
                self._pre_blank_fill(expected)
            else:
                self._warn(
                    f"consume queue {self.topic}/{self.queue_id}: unit for queue offset {qoff} "
                    f"arrives at position {write_pos // CQ_UNIT_SIZE}; appending there"
                )
        self._append(units)
        last = units[-1]
        self.max_phys = int(last["phys_offset"]) + int(last["size"])
        return len(units)

    def _pre_blank_fill(self, expected: int) -> None:
        seg = self.segments.create_next(expected)
        count = (expected - seg.start) // CQ_UNIT_SIZE
        fill = np.zeros(count, dtype=CQ_DTYPE)
        fill["size"] = FILLER_SIZE
        seg.write(fill.tobytes())
        self.min_logic_offset = expected

    def _append(self, units: np.ndarray) -> None:
        raw = units.tobytes()
        at = 0
        while at < len(raw):
            seg = self.segments.last()
            if seg is None or seg.is_full():
                seg = self.segments.create_next()
            take = min(seg.remaining, len(raw) - at)
            seg.write(raw[at:at + take])
            at += take

    def truncate_to_phys(self, phys: int) -> int:
        """Drop every unit pointing at ``phys`` or beyond; returns how many were dropped."""
        dropped = 0
        for seg in reversed(self.segments.segments):
            n = seg.wrote // CQ_UNIT_SIZE
            units = self.units_of(seg)[:n]
            bad = np.flatnonzero((units["phys_offset"] >= phys) & (units["size"] != FILLER_SIZE))
            if not len(bad):
                break
            cut = int(bad[0])
            dropped += n - cut
            if cut == 0 and seg is not self.segments.segments[0]:
                self._arrays.pop(seg.start, None)
                self.segments.drop_last()
                continue
            self._zero_tail(seg, cut * CQ_UNIT_SIZE)
            seg.wrote = seg.flushed = cut * CQ_UNIT_SIZE
            break
        self._prune_arrays()
        if dropped:
            self._refresh_max_phys()
        return dropped

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

    def correct_min_offset(self, min_phys: int) -> None:
        """Raise ``min`` to the first unit whose commit-log offset is still stored."""
        segs = self.segments.segments
        if not segs:
            return
        last = segs[-1]
        n_last = last.wrote // CQ_UNIT_SIZE
        if n_last and int(self.units_of(last)[n_last - 1]["phys_offset"]) < min_phys:
            self.min_logic_offset = self.segments.max_offset
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

    def destroy(self) -> None:
        self._arrays.clear()
        self.segments.destroy()


def load_consume_queues(root: str, file_bytes: int, *, read_only: bool,
                        on_warning=None) -> dict[tuple[str, int], ConsumeQueue]:
    """Every ``consumequeue/<topic>/<int queueId>`` under ``root``, loaded (not recovered).

    ``file_bytes`` applies to writers; read-only queues take their size from the files.
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
                              read_only=read_only, on_warning=on_warning)
            cq.load()
            if cq.segments.segment_bytes is None:
                cq.segments.segment_bytes = file_bytes
            queues[(topic, int(qname))] = cq
    return queues

"""Walking every commit-log record: CRC, size chain, position; what the cross-checks compare.

Records are validated with the store's own ``format.record.scan_record`` (magic, lengths that
add up to TOTALSIZE, the physical offset a record names, the body CRC) and the walk
re-synchronises after damage with ``format.quarantine.find_record``, as recovery does. Damage
followed by an intact record is bit rot (recovery quarantines it); damage with nothing intact
after it ends the log (a torn tail, which recovery cuts). Trailing segments holding only zeros
are pre-allocated files (RocketMQ makes one ahead), not damage.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from mqstore.format.quarantine import find_record
from mqstore.format.record import SCAN_BLANK, SCAN_OK, scan_record
from mqstore.ops.checking.problems import RECORD, SEGMENT, TORN_TAIL, Problem

CRC_REASON = "CRC"  # body or record CRC mismatch, a record CRC property damaged or missing
NONZERO_WINDOW = 1 << 20  # bytes looked at a time for the end of a segment's data
PROGRESS_STEP = 1 << 20  # walked bytes between progress reports


@dataclass
class LogScan:
    """What the walk found: the intact records as columns, and the problems."""

    min_offset: int = 0
    end: int = 0  # end of the last intact record
    problems: list[Problem] = field(default_factory=list)
    damaged: list[tuple[int, int]] = field(default_factory=list)  # [begin, end) commit-log ranges
    crc_bad: int = 0
    topics: list[str] = field(default_factory=list)  # names, indexed by ``topic_ids``
    # columns, one row per intact record
    phys: np.ndarray = None
    sizes: np.ndarray = None
    topic_ids: np.ndarray = None
    queue_ids: np.ndarray = None
    queue_offsets: np.ndarray = None
    sysflags: np.ndarray = None
    properties: dict[int, bytes] = field(default_factory=dict)  # row -> properties naming keys

    @property
    def records(self) -> int:
        return 0 if self.phys is None else len(self.phys)

    def in_damage(self, phys: int) -> bool:
        return any(b <= phys < e for b, e in self.damaged)


class _Columns:
    def __init__(self) -> None:
        self.phys, self.sizes, self.topic_ids = [], [], []
        self.queue_ids, self.queue_offsets, self.sysflags = [], [], []
        self.topic_index: dict[str, int] = {}
        self.properties: dict[int, bytes] = {}

    def add(self, head) -> None:
        tid = self.topic_index.setdefault(head.topic, len(self.topic_index))
        row = len(self.phys)
        self.phys.append(head.phys_offset)
        self.sizes.append(head.size)
        self.topic_ids.append(tid)
        self.queue_ids.append(head.queue_id)
        self.queue_offsets.append(head.queue_offset)
        self.sysflags.append(head.sysflag)
        if b"KEYS\x01" in head.properties or b"UNIQ_KEY\x01" in head.properties:
            self.properties[row] = head.properties

    def into(self, scan: LogScan) -> None:
        scan.phys = np.array(self.phys, dtype=np.int64)
        scan.sizes = np.array(self.sizes, dtype=np.int64)
        scan.topic_ids = np.array(self.topic_ids, dtype=np.int64)
        scan.queue_ids = np.array(self.queue_ids, dtype=np.int64)
        scan.queue_offsets = np.array(self.queue_offsets, dtype=np.int64)
        scan.sysflags = np.array(self.sysflags, dtype=np.int64)
        scan.topics = list(self.topic_index)
        scan.properties = self.properties


def _nonzero_end(seg, begin: int) -> int:
    """End of the last non-zero byte of ``seg`` at or after ``begin`` (``begin`` if none)."""
    end = seg.data_end()
    # Backwards a window at a time: the data usually ends near the end, and a whole segment
    # of non-zero bytes at once would make an index array eight times its size.
    while end > begin:
        lo = max(begin, end - NONZERO_WINDOW)
        nz = np.flatnonzero(np.frombuffer(seg.mm, dtype=np.uint8, count=end - lo, offset=lo))
        if len(nz):
            return lo + int(nz[-1]) + 1
        end = lo
    return begin


def scan_log(commit_log, root: str, progress: Callable[[int], None] = lambda n: None,
             on_total: Callable[[int], None] = lambda n: None) -> LogScan:
    """Walk every record of ``commit_log`` (loaded read-only). ``on_total(bytes)`` first, with
    the bytes the walk covers (every segment but the last whole, the last up to its data's
    end), then ``progress(bytes)`` as they are walked."""
    scan = LogScan()
    cols = _Columns()
    segq = commit_log.segments
    segs = list(segq.segments)
    size = segq.segment_bytes
    # Pre-allocated all-zero segments at the end are not part of the log.
    while segs and (last_end := _nonzero_end(segs[-1], 0)) == 0:
        segs.pop()
    if not segs:
        on_total(0)
        scan.min_offset = scan.end = max(segq.min_offset, 0)
        cols.into(scan)
        return scan
    on_total(sum(seg.size for seg in segs[:-1]) + last_end)
    scan.min_offset = segs[0].start
    prev_end = segs[0].start
    for seg in segs:
        rel = os.path.relpath(seg.path, root)
        if seg.start != prev_end:
            scan.problems.append(Problem(
                SEGMENT, os.path.relpath(os.path.join(segq.directory, f"{prev_end:020d}"), root),
                0, f"segment files for commit-log bytes [{prev_end}, {seg.start}) are missing",
                prev_end))
            scan.damaged.append((prev_end, seg.start))
        file_bytes = os.path.getsize(seg.path)
        if file_bytes < size:
            scan.problems.append(Problem(SEGMENT, rel, file_bytes,
                                         f"segment file is {file_bytes} bytes, not {size}",
                                         seg.start + file_bytes))
        walked = _Walked(progress, last_end if seg is segs[-1] else seg.size)
        _walk_segment(scan, cols, seg, rel, last=seg is segs[-1],
                      crc_range=commit_log.crc_range, walked=walked)
        walked.to(walked.end)
        prev_end = seg.start + size
    cols.into(scan)
    return scan


class _Walked:
    """How far into a segment the walk has reported, in steps of at least PROGRESS_STEP, up
    to ``end`` (the bytes of the segment the total counted)."""

    def __init__(self, progress: Callable[[int], None], end: int) -> None:
        self.progress, self.end, self.reported = progress, end, 0

    def at(self, at: int) -> None:
        if at - self.reported >= PROGRESS_STEP:
            self.to(at)

    def to(self, at: int) -> None:
        at = min(at, self.end)
        if at > self.reported:
            self.progress(at - self.reported)
            self.reported = at


def _walk_segment(scan: LogScan, cols: _Columns, seg, rel: str, last: bool,
                  crc_range: tuple[int, int] | None = None,
                  walked: _Walked | None = None) -> None:
    limit = seg.data_end()
    at = 0
    while at < seg.size:
        if walked is not None:
            walked.at(at)
        pos = seg.start + at
        if at < limit:
            kind, size, head = scan_record(seg.mm, at, limit, True, expected_phys=pos,
                                           crc_range=crc_range)
        else:
            kind, size, head = 2, "unknown magic 0x00000000", None
        if kind == SCAN_OK:
            cols.add(head)
            at += size
            scan.end = pos + size
            continue
        if kind == SCAN_BLANK and size == seg.size - at:
            scan.end = seg.start + seg.size
            return
        reason = size if kind != SCAN_BLANK else (
            f"blank record of {size} bytes does not close its segment")
        if CRC_REASON in reason:
            scan.crc_bad += 1
        extent = _nonzero_end(seg, at)
        if last and extent == at:
            return  # zeros after the last record: the end of the log
        nxt = find_record(seg.mm, at + 1, limit, seg.start, seg.size, crc_range)
        if nxt is not None:
            scan.problems.append(Problem(RECORD, rel, at, f"damaged record ({reason}); the "
                                         f"next intact record is at {seg.start + nxt}", pos))
            scan.damaged.append((pos, seg.start + nxt))
            at = nxt
            continue
        if last:
            scan.problems.append(Problem(TORN_TAIL, rel, at, f"torn tail: {extent - at} bytes "
                                         f"past the last intact record ({reason})", pos))
        else:
            scan.problems.append(Problem(RECORD, rel, at, f"damaged record ({reason}); nothing "
                                         f"intact follows to the segment's end", pos))
        scan.damaged.append((pos, seg.start + (extent if last else seg.size)))
        return

"""Recovery at open: make the commit log, consume queues and positions agree again.

Follows RocketMQ 5.x (spec 10.11) with two changes: the re-dispatch point is never later than
what the consume queues are missing (so a deleted ``consumequeue/`` is rebuilt in full), and
what was cut is returned as a :class:`RecoveryReport` instead of only logged.

Steps: recover each consume queue (cut after its last valid unit); pick the commit-log segment
to validate from (normal exit: the newest whose first record is already dispatched; abnormal
exit: the newest whose first record is older than the checkpoint's minimum time); walk records
from there (CRC checked when ``check_crc``) to the first invalid one; cut the log there, zero the
torn bytes, drop consume-queue units that point past the cut.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mqstore.format.record import SCAN_BLANK, SCAN_OK, scan_record

ZERO_PROBE_BYTES = 64 * 1024


@dataclass
class RecoveryReport:
    abnormal: bool = False
    scan_from: int = 0  # commit-log offset validation started at
    commit_log_end: int = 0  # end of the last valid record: where writes continue
    truncated_bytes: int = 0  # non-zero bytes past the end that were cut
    stop_reason: str | None = None  # why the walk stopped before the last byte, if it did
    records_checked: int = 0
    redispatch_from: int = 0
    redispatch_bytes: int = 0  # commit-log bytes dispatched again while opening
    redispatch_seconds: float = 0.0
    consume_queue_units_dropped: dict[str, int] = field(default_factory=dict)
    deleted_files: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not (self.truncated_bytes or self.consume_queue_units_dropped)


def _first_record(seg):
    kind, _size, head = scan_record(seg.mm, 0, seg.size, False, expected_phys=seg.start)
    return head if kind == SCAN_OK and head.store_timestamp != 0 else None


def _pick_start(segments, abnormal: bool, dispatch_from: int, min_timestamp: int) -> int:
    """Index of the segment to validate from (spec 10.11, plus the dispatch floor)."""
    def newest(pred) -> int:
        for i in range(len(segments) - 1, 0, -1):
            head = _first_record(segments[i])
            if head is not None and pred(head):
                return i
        return 0

    by_dispatch = newest(lambda h: h.phys_offset <= dispatch_from)
    if not abnormal:
        return by_dispatch
    return min(by_dispatch, newest(lambda h: h.store_timestamp <= min_timestamp))


def _nonzero_extent(seg, begin: int) -> int:
    """End of the non-zero bytes that follow ``begin`` in ``seg`` (probing in 64 KiB steps)."""
    end = begin
    at = begin
    while at < seg.size:
        chunk = np.frombuffer(seg.mm, dtype=np.uint8, count=min(ZERO_PROBE_BYTES, seg.size - at),
                              offset=at)
        nz = np.flatnonzero(chunk)
        if not len(nz):
            break
        end = at + int(nz[-1]) + 1
        at += len(chunk)
    return end


def recover(commit_log, consume_queues, checkpoint, *, abnormal: bool, check_crc: bool,
            read_only: bool) -> RecoveryReport:
    report = RecoveryReport(abnormal=abnormal)
    for cq in consume_queues:
        dropped = cq.recover()
        if dropped:
            report.consume_queue_units_dropped[f"{cq.topic}/{cq.queue_id}"] = dropped
    dispatch_from = max((cq.max_phys for cq in consume_queues), default=-1)
    segs = commit_log.segments.segments
    if not segs:
        for cq in consume_queues:
            if cq.max_offset:
                report.consume_queue_units_dropped[f"{cq.topic}/{cq.queue_id}"] = cq.max_offset
            if not read_only:
                cq.destroy()
        if consume_queues:
            report.notes.append("no commit-log segments: every consume queue was destroyed")
        return report

    start = _pick_start(segs, abnormal, dispatch_from, checkpoint.min_timestamp())
    pos = report.scan_from = segs[start].start
    end = segs[-1].end
    for at, kind, head, reason in commit_log.records(pos, end, check_crc=check_crc):
        if kind == SCAN_OK:
            report.records_checked += 1
            pos = at + head.size
        elif kind == SCAN_BLANK:
            pos = commit_log.segments.find(at).end
        else:
            pos = at
            report.stop_reason = reason
            break
    report.commit_log_end = pos

    # Bytes past the end: the torn tail of the stop segment plus any later segment's data.
    stop_seg = commit_log.segments.find(pos)
    if stop_seg is not None:
        extent = _nonzero_extent(stop_seg, pos - stop_seg.start)
        report.truncated_bytes += max(0, extent - (pos - stop_seg.start))
        if not read_only and extent > pos - stop_seg.start:
            stop_seg.zero(pos - stop_seg.start, extent)
    for seg in segs:
        if seg.start > pos:
            report.truncated_bytes += _nonzero_extent(seg, 0)
    if report.truncated_bytes == 0:
        report.stop_reason = None
    report.deleted_files += commit_log.segments.truncate_to(pos)

    for cq in consume_queues:
        if cq.max_phys > pos:
            dropped = cq.truncate_to_phys(pos)
            if dropped:
                key = f"{cq.topic}/{cq.queue_id}"
                report.consume_queue_units_dropped[key] = (
                    report.consume_queue_units_dropped.get(key, 0) + dropped)

    if abnormal:
        report.redispatch_from = report.scan_from
    else:
        report.redispatch_from = max(report.scan_from, min(dispatch_from, pos))
    return report

"""Recovery at open: make the commit log, consume queues and positions agree again.

Follows RocketMQ 5.x (spec 10.11) with these changes, all in the direction of losing nothing:

- The re-dispatch point is never later than what a consume queue is missing: a queue its own
  check cut short, a queue the store knows of whose directory is gone, a deleted
  ``consumequeue/`` altogether.
- Damaged bytes followed by intact records are quarantined, not cut. The walk re-synchronises
  on the next intact record (``format.quarantine.find_record``); the damaged region is copied
  to ``quarantine/<offset>`` and rewritten as a blank (to its segment's end) or a quarantine
  record, so every reader walks over it; segment files missing between others are recreated
  closed. Records after the region keep their offsets.
- Only a torn tail is cut: damage at or past the durable end, and everything after it. That end
  is the later of the checkpoint's confirmPhyOffset (the flushed offset: every byte below it
  was on disk) and its ``appended`` field (the end of the last append the writer completed:
  every byte below it was whole in the page cache); after a clean close every byte was. Past
  it lies at most the one put the crash interrupted, whose bytes may have landed in any order
  (a copy stores its first bytes last), so intact records after damage there are not kept:
  they belong to a put that was never acknowledged. Damage below the end is bit rot and is
  quarantined.
- Queue offsets never go back (NOTE [ Offset floors ] in ``offset_floor``): before it cuts
  the units of records that are gone, recovery raises the floors it is given to what each
  queue held, and the open gives the queues fillers up to them once dispatch caught up.
- What was cut, quarantined or rebuilt is returned as a :class:`RecoveryReport`.

Steps: recover each consume queue (cut after its last valid unit); if a clean-shutdown marker
(``storage.clean_marker``) is offered and matches the files, stop there: the log ends where it
says and nothing is walked. Otherwise pick the commit-log segment to validate from (normal
exit: the newest whose first record is already dispatched to every queue that needs it;
abnormal exit: also no later than the checkpoint's minimum time, RocketMQ's rule, so only what
the checkpoint does not cover is walked, at segment granularity); walk and mend the records
from there; cut the torn tail; drop consume-queue units whose records do not end by the end.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np

from mqstore.format.quarantine import (
    MIN_QUARANTINE_BYTES, QUARANTINE_DIR, blank_closes, filler_for, find_record,
)
from mqstore.format.record import SCAN_BAD, SCAN_BLANK, SCAN_OK, encode_blank, scan_record
from mqstore.plugin_api.recovery_report import Quarantined, RecoveryReport
from mqstore.storage import clean_marker
from mqstore.storage.queue_floor import end_below_phys
from mqstore.storage.queue_progress import QUEUED_FILE, DispatchMark

ZERO_PROBE_BYTES = 64 * 1024
NO_END = 1 << 62


@dataclass
class _Region:
    begin: int
    end: int
    reason: str


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
    """End of the non-zero bytes that follow ``begin`` in ``seg`` (probing in 64 KiB steps:
    a 64 KiB run of zeros ends the data)."""
    end = begin
    at = begin
    stop = seg.data_end()  # past it only holes: zeros, and not to be read through the map
    while at < stop:
        # A copy: a follower probes a segment that the writer may be filling at the same time,
        # and numpy's nonzero fails if the bytes change under it.
        chunk = np.frombuffer(seg.mm, dtype=np.uint8, count=min(ZERO_PROBE_BYTES, stop - at),
                              offset=at).copy()
        nz = np.flatnonzero(chunk)
        if not len(nz):
            break
        end = at + int(nz[-1]) + 1
        at += len(chunk)
    return end


nonzero_extent = _nonzero_extent  # for a rejoin's cut (lifecycle.rejoin)


# -- walking -----------------------------------------------------------------------------------
def _intact_at_start(seg, crc_range) -> bool:
    kind, _size, _head = scan_record(seg.mm, 0, seg.size, True, expected_phys=seg.start,
                                     crc_range=crc_range)
    return kind == SCAN_OK or (kind == SCAN_BLANK and blank_closes(seg.mm, 0, seg.size))


def _resync(segq, seg, at: int, crc_range) -> int | None:
    """Commit-log offset of the first intact record after a bad one at ``seg``/``at``."""
    segs = segq.segments
    last = segs[-1]
    limit = _nonzero_extent(seg, at) if seg is last else seg.data_end()
    found = find_record(seg.mm, at + 1, limit, seg.start, seg.size, crc_range)
    if found is not None:
        return seg.start + found
    for later in segs[segs.index(seg) + 1:]:
        if _intact_at_start(later, crc_range):
            return later.start
        limit = _nonzero_extent(later, 0) if later is last else later.data_end()
        found = find_record(later.mm, 1, limit, later.start, later.size, crc_range)
        if found is not None:
            return later.start + found
    return None


def _next_start(segq, pos: int) -> int | None:
    return next((s.start for s in segq.segments if s.start > pos), None)


def _walk(segq, pos: int, check_crc: bool, report: RecoveryReport,
          stop: int = NO_END, durable: int = NO_END,
          crc_range: tuple[int, int] | None = None) -> tuple[int, list[_Region], int]:
    """Walk records from ``pos`` to the last intact one (or ``stop``), re-synchronising after
    damage below ``durable`` (damage at or past it is a torn tail: the walk ends there);
    returns where it ended, the damaged regions passed and the records checked. In
    ``crc_range`` every record must carry the record CRC (``scan_record``)."""
    regions: list[_Region] = []
    checked = 0
    seg, readable = None, 0
    while pos < stop:
        if seg is None or not seg.start <= pos < seg.end:
            seg = segq.find(pos)
            readable = seg.data_end() if seg is not None else 0
        if seg is None:  # a segment file is missing (or cut short) before later ones
            nxt = _next_start(segq, pos)
            if nxt is None:
                return pos, regions, checked
            regions.append(_Region(pos, nxt, "segment file missing"))
            pos = nxt
            continue
        at = pos - seg.start
        # Past the allocated blocks there are only zeros (and they are not read: data_end).
        kind, size, head = (scan_record(seg.mm, at, readable, check_crc, expected_phys=pos,
                                        crc_range=crc_range)
                            if at < readable else (SCAN_BAD, "unknown magic 0x00000000", None))
        if kind == SCAN_OK:
            checked += 1
            pos += size
            continue
        if kind == SCAN_BLANK and size == seg.size - at:
            pos = seg.end
            continue
        reason = size if kind != SCAN_BLANK else f"blank record of {size} bytes at {pos} " \
            f"does not close its segment"
        nxt = _resync(segq, seg, at, crc_range) if pos < durable else None
        if nxt is None:
            report.stop_reason = reason
            return pos, regions, checked
        regions.append(_Region(pos, nxt, reason))
        pos = nxt
    return pos, regions, checked


def _structural_damage(segq, before: int) -> list[tuple[int, int]]:
    """Ranges below ``before`` to walk and mend: around segment files missing between others,
    and over files loading found short."""
    ranges = []
    segs = segq.segments
    for prev, seg in zip(segs, segs[1:]):
        if seg.start != prev.end and prev.end < before:
            ranges.append((prev.start, min(seg.end, before)))
    for start in segq.repaired:
        seg = segq.find(start)
        if seg is not None and seg.start < before:
            ranges.append((seg.start, min(seg.end, before)))
    return ranges


def mend_range(commit_log, begin: int, end: int, *, check_crc: bool, read_only: bool,
               report: RecoveryReport) -> None:
    """Walk and mend ``[begin, end)`` too: bytes below where recovery started that dispatch
    will read again (a dispatcher asks to resume earlier)."""
    segq = commit_log.segments
    _pos, regions, _checked = _walk(segq, begin, check_crc, report, stop=end,
                                    crc_range=commit_log.crc_range)
    root = os.path.dirname(segq.directory)
    for region in regions:
        _mend(segq, region, root, report, read_only)


# -- mending -------------------------------------------------------------------------------------
def _widen(segq, region: _Region) -> None:
    """A quarantine record needs MIN_QUARANTINE_BYTES: when the region's last part does not
    run to its segment's end (where a blank of any length fits) and is shorter, it takes in
    the records after it (saved and reported with it)."""
    while True:
        seg = segq.find(region.end)
        if seg is None or region.end == seg.start:
            return
        if region.end - max(region.begin, seg.start) >= MIN_QUARANTINE_BYTES:
            return
        kind, size, _head = scan_record(seg.mm, region.end - seg.start, seg.size, False)
        region.end = region.end + size if kind == SCAN_OK else seg.end


def _store_time_near(segq, pos: int) -> int:
    seg = segq.find(pos)
    if seg is not None:
        kind, _size, head = scan_record(seg.mm, pos - seg.start, seg.size, False,
                                        expected_phys=pos)
        if kind == SCAN_OK:
            return head.store_timestamp
    return 0


def _mend(segq, region: _Region, root: str, report: RecoveryReport, read_only: bool) -> None:
    """Quarantine ``region``: keep a copy, then rewrite it segment by segment."""
    _widen(segq, region)
    entry = Quarantined(region.begin, region.end - region.begin, region.reason)
    report.quarantined.append(entry)
    if read_only:
        return
    ts = _store_time_near(segq, region.end)
    qdir = os.path.join(root, QUARANTINE_DIR)
    os.makedirs(qdir, exist_ok=True)
    entry.saved_to = os.path.join(qdir, f"{region.begin:020d}")
    with open(entry.saved_to, "wb") as saved:
        pos = region.begin
        while pos < region.end:
            seg = segq.find(pos)
            if seg is None:  # recreate the missing file closed: readers step to the next
                start = pos - pos % segq.segment_bytes
                seg = segq.insert_closed(start, encode_blank)
                report.recreated_segments.append(seg.path)
                pos = seg.end
                continue
            at, stop = pos - seg.start, min(region.end, seg.end) - seg.start
            saved.write(seg.pread(at, stop - at))  # not through the map: it may hold holes
            seg.overwrite(at, filler_for(stop - at, ts, pos, stop == seg.size))
            pos = seg.start + stop
        saved.flush()
        os.fsync(saved.fileno())


def _record_at(segq, pos: int, crc_range, *, or_blank: bool = False) -> tuple | None:
    """``(size, head)`` of the intact record that starts at ``pos`` and says so itself, or
    None; with ``or_blank``, a segment's start or the blank that closes it count too
    (``(0, None)``)."""
    seg = segq.find(pos)
    if seg is None:
        return None
    at = pos - seg.start
    if or_blank and at == 0:
        return 0, None
    kind, size, head = scan_record(seg.mm, at, seg.data_end(), True, expected_phys=pos,
                                   crc_range=crc_range)
    if kind == SCAN_OK:
        return size, head
    if or_blank and kind == SCAN_BLANK and blank_closes(seg.mm, at, seg.size):
        return 0, None
    return None


def _queued_start(segq, mark: DispatchMark, dispatch_from: int, crc_range,
                  report: RecoveryReport) -> int:
    """Where an abnormal recovery may start walking and re-dispatching by ``mqstore.queued``:
    at its record, once found where it says and intact, or earlier at the newest unit of the
    consume queues when that is older and is itself an intact record's start; else -1 (the
    segment rule stands, and a note says why)."""
    name = QUEUED_FILE
    found = _record_at(segq, mark.phys_offset, crc_range)
    if found is None or found[0] != mark.size or found[1].store_timestamp != mark.store_timestamp:
        report.notes.append(f"{name} names the record at {mark.phys_offset} of {mark.size} bytes "
                            f"stored at {mark.store_timestamp}, which the commit log does not "
                            f"hold there; the walk starts at a segment's start")
        return -1
    start = mark.phys_offset
    if dispatch_from < start:
        if dispatch_from < 0 or _record_at(segq, dispatch_from, crc_range,
                                           or_blank=True) is None:
            report.notes.append(f"the consume queues end before {name}'s record, at "
                                f"{dispatch_from}, where no intact record starts; the walk "
                                f"starts at a segment's start")
            return -1
        start = dispatch_from
    report.notes.append(f"{name}: the derived files were on disk below the record at "
                        f"{mark.phys_offset}; the walk starts at {start}")
    return start


def durable_end(checkpoint, abnormal: bool) -> int:
    """Every byte below this offset was on disk before the store went down."""
    if not abnormal:
        return NO_END  # a clean close flushed everything
    return max(0, checkpoint.confirm_phy_offset, checkpoint.appended_offset)


# -- recover -------------------------------------------------------------------------------------
def _rebuild_point(consume_queues, known_queues: dict, report: RecoveryReport) -> int:
    """The commit-log offset from which dispatch must run again so that no queue misses a
    unit: queues their own check cut short or whose files were found short, and queues the
    manifest lists that are gone or hold fewer units than it records."""
    rebuild_from = NO_END
    by_key = {(cq.topic, cq.queue_id): cq for cq in consume_queues}
    for cq in consume_queues:
        dropped = cq.recover()
        if dropped:
            report.consume_queue_units_dropped[f"{cq.topic}/{cq.queue_id}"] = dropped
            rebuild_from = min(rebuild_from, max(cq.max_phys, 0))
        if cq.segments.repaired:  # whatever the manifest says: units past the cut are gone
            report.queues_rebuilt[f"{cq.topic}/{cq.queue_id}"] = (
                f"{len(cq.segments.repaired)} file(s) found short")
            rebuild_from = min(rebuild_from, max(cq.max_phys, 0))
    for (topic, queue_id), (first_phys, max_offset) in known_queues.items():
        cq = by_key.get((topic, queue_id))
        if cq is None and first_phys < 0:
            continue  # fillers alone: nothing in the log to rebuild, its floor restores them
        if cq is None:
            why = "its directory is missing"
            point = first_phys
        elif cq.max_offset < max_offset:
            why = f"it holds {cq.max_offset} units, {max_offset} were written"
            point = cq.max_phys if cq.max_phys >= 0 else first_phys
        else:
            continue
        report.queues_rebuilt[f"{topic}/{queue_id}"] = why
        rebuild_from = min(rebuild_from, max(point, 0))
    return rebuild_from


def _trust(report: RecoveryReport, commit_log, consume_queues, marker: dict) -> RecoveryReport:
    """The marker describes the files: the log ends where it says and everything below is
    dispatched, so nothing is walked, no queue is checked again, dispatch resumes at the end."""
    end = marker["end"]
    commit_log.segments.truncate_to(end)  # loaded segments count as full until told
    clean_marker.restore(marker, consume_queues)
    report.scan_from = report.commit_log_end = report.redispatch_from = end
    report.trusted_end = end
    report.notes.append(f"clean-shutdown marker {clean_marker.MARKER_FILE} trusted: the commit "
                        f"log ends at {end}, no record walked")
    return report


def recover(commit_log, consume_queues, checkpoint, *, abnormal: bool, check_crc: bool,
            read_only: bool, known_queues: dict | None = None,
            marker: dict | None = None, queued: DispatchMark | None = None,
            floors: dict | None = None, hold=None) -> RecoveryReport:
    """``known_queues``: the queue manifest (``storage.queue_manifest``), if any; ``marker``:
    a clean-shutdown marker, trusted if it matches the files (the caller checked ``abort``);
    ``queued``: the record below which the derived files were on disk
    (``storage.queue_progress``), if recorded.

    ``floors``: ``{(topic, queue_id): offset}``, each queue's end by the store's other
    records (NOTE [ Offset floors ] in ``offset_floor``); raised here to what each consume
    queue held before recovery cut units of records that are gone, emptied when there is no
    commit-log segment at all (the store starts over). ``hold()`` is called once before the
    first such unit is cut, to make the floors durable first."""
    report = RecoveryReport(abnormal=abnormal)
    floors = {} if floors is None else floors
    if marker is not None and _marker_matches(report, marker, commit_log, consume_queues):
        return _trust(report, commit_log, consume_queues, marker)
    rebuild_from = _rebuild_point(consume_queues, known_queues or {}, report)
    dispatch_from = max((cq.max_phys for cq in consume_queues), default=-1)
    dispatch_from = min(dispatch_from, rebuild_from)
    segq = commit_log.segments
    segs = segq.segments
    if not segs:
        floors.clear()
        return _without_segments(report, consume_queues, read_only)

    exact = (_queued_start(segq, queued, dispatch_from, commit_log.crc_range, report)
             if abnormal and queued is not None else -1)
    report.scan_from = exact if exact >= 0 else segs[_pick_start(
        segs, abnormal, dispatch_from, checkpoint.min_timestamp())].start
    root = os.path.dirname(segq.directory)
    # Whatever the start, files found missing or short are mended wherever they lie: that
    # costs no reading beyond them, and readers must be able to walk the whole log.
    for begin, end in _structural_damage(segq, report.scan_from):
        mend_range(commit_log, begin, end, check_crc=check_crc, read_only=read_only,
                   report=report)
    durable = durable_end(checkpoint, abnormal)
    for cq in consume_queues:
        # Valid units only (``recover`` cut the damaged ones), of records on disk: a unit of
        # a torn tail's record names an offset no put was acknowledged with.
        key = (cq.topic, cq.queue_id)
        floors[key] = max(floors.get(key, 0), end_below_phys(cq, durable))
    pos, regions, report.records_checked = _walk(segq, report.scan_from, check_crc, report,
                                                 crc_range=commit_log.crc_range,
                                                 durable=durable)
    for region in regions:
        _mend(segq, region, root, report, read_only)

    pos = _quarantine_rot(segq, pos, durable, root, report, read_only)
    _cut_torn_tail(segq, segs, pos, report, read_only)
    report.commit_log_end = pos
    report.deleted_files += segq.truncate_to(pos)
    if hold is not None and any(cq.max_phys > pos for cq in consume_queues):
        hold()
    cut_from = _drop_units_past(consume_queues, pos, report)

    if abnormal:
        report.redispatch_from = report.scan_from
    else:
        report.redispatch_from = max(report.scan_from, min(dispatch_from, pos))
    # Units naming bytes past the end may be damaged units of records the log still holds:
    # those records must get their units (and queue offsets) back. The range below the
    # walk's start is mended by the open before dispatch reads it.
    report.redispatch_from = min(report.redispatch_from, cut_from)
    return report


def _marker_matches(report: RecoveryReport, marker: dict, commit_log,
                    consume_queues) -> bool:
    """Whether the clean-shutdown marker describes the files; a note says why not."""
    try:
        why = clean_marker.mismatch(marker, commit_log, consume_queues)
    except (OSError, ValueError, TypeError, KeyError, IndexError) as exc:  # never a crash
        why = f"it cannot be checked ({exc!r})"
    if why is None:
        return True
    report.notes.append(f"clean-shutdown marker {clean_marker.MARKER_FILE} not trusted: "
                        f"{why}; full recovery")
    return False


def _without_segments(report: RecoveryReport, consume_queues,
                      read_only: bool) -> RecoveryReport:
    """No commit-log segment: every consume queue names records that are gone."""
    for cq in consume_queues:
        if cq.max_offset:
            report.consume_queue_units_dropped[f"{cq.topic}/{cq.queue_id}"] = cq.max_offset
        if not read_only:
            cq.destroy()
    if consume_queues:
        report.notes.append("no commit-log segments: every consume queue was destroyed")
    return report


def _quarantine_rot(segq, pos: int, durable: int, root: str, report: RecoveryReport,
                    read_only: bool) -> int:
    """After the last intact record at ``pos``: damaged bytes below the durable end are bit
    rot, quarantined (not cut) so that the records after them stay; returns where the log
    goes on after them (``pos`` itself when there are none)."""
    stop_seg = segq.find(pos)
    if stop_seg is None:
        return pos
    extent = stop_seg.start + _nonzero_extent(stop_seg, pos - stop_seg.start)
    rotted = min(extent, durable)
    if rotted <= pos:
        return pos
    region = _Region(pos, rotted, report.stop_reason or "damaged bytes")
    if region.end - region.begin < MIN_QUARANTINE_BYTES:  # zeros follow: room to grow
        region.end = min(region.begin + MIN_QUARANTINE_BYTES, stop_seg.end)
    if stop_seg.end - region.end < 8:  # no room left for the blank that closes it
        region.end = stop_seg.end
    _mend(segq, region, root, report, read_only)
    report.stop_reason = None
    return region.end


def _cut_torn_tail(segq, segs, pos: int, report: RecoveryReport, read_only: bool) -> None:
    """Above ``pos`` (the end of the log as recovered) the tail is torn: zero what its
    segment holds past ``pos``, and count it and every later segment's bytes as truncated
    (``segq.truncate_to`` removes those segments)."""
    stop_seg = segq.find(pos)
    if stop_seg is not None:
        at = pos - stop_seg.start
        extent = _nonzero_extent(stop_seg, at)
        report.truncated_bytes += max(0, extent - at)
        if not read_only and extent > at:
            stop_seg.zero(at, extent)
    for seg in segs:
        if seg.start > pos:
            report.truncated_bytes += _nonzero_extent(seg, 0)
    if report.truncated_bytes == 0:
        report.stop_reason = None


def _drop_units_past(consume_queues, pos: int, report: RecoveryReport) -> int:
    """Consume-queue units naming records that do not end by the recovered end go (a record
    cut by the end is not whole); returns where dispatch must run again for the queues that
    lost units (NO_END: none did)."""
    cut_from = NO_END
    for cq in consume_queues:
        if cq.max_phys > pos:
            dropped = cq.truncate_to_phys(pos)
            if dropped:
                key = f"{cq.topic}/{cq.queue_id}"
                report.consume_queue_units_dropped[key] = (
                    report.consume_queue_units_dropped.get(key, 0) + dropped)
                cut_from = min(cut_from, max(cq.max_phys, 0))
    return cut_from

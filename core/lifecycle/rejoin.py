"""A store that was master rejoins as a slave: its log is cut to what the new master has, what
it cuts is kept and reported, and its derived files are made to agree, before recovery.

NOTE [ Rejoining ]
A master that comes back after a failover holds records its successor never had (puts it
took after the slave's last copy; under SYNC_MASTER none of them was answered PUT_OK). It
cannot follow with them: a slave's log must be a prefix of its master's. Its handshake with
the new master finds the consistent point (``format.epoch_file.consistent_point``: the newest
epoch both logs hold from the same start, up to the nearer of the two ends), the store records
the decision in ``role.json`` (``storage.role_file.Cut``) and reopens; the open, before
recovery, runs ``apply_cut``:

1. the bytes from the point to the log's end go to ``quarantine/rejoin-<point>`` (fsynced),
   then a report beside it, ``rejoin-<point>.json``: offsets, bytes, the records and, per
   queue, their count and queue offsets (what was cut is never silently dropped);
2. the positions that would otherwise hold the cut offsets as floors (NOTE [ Offset floors ])
   are lowered: the checkpoint's flushed and appended ends, the queue manifest's entries (a
   queue first made by cut records is forgotten), ``mqstore.queued`` and ``mqstore.indexed``
   go; and the clean-shutdown marker is not used (the caller drops it). As a slave, a queue's offsets are its master's,
   carried in the records: fillers for the cut offsets would collide with them;
3. the store's own state files are set aside (``lifecycle.state_aside``): the new master's
   consumer and topic state is what counts now;
4. each consume queue loses its units of cut records, the commit log its bytes past the point
   (later segments removed, newest first, then the point's segment zeroed past it);
5. the epoch file loses the entries starting at or past the point, and ``role.json`` its cut.

Each step can run again: a SIGKILL anywhere leaves ``role.json`` naming the cut, and the next
open starts over at step 1 (skipped once its report exists) and finishes. The key index keeps
its entries of cut records; lookups check every record they return against the key (the index
re-indexes from the point, as after a lost segment).
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from typing import Callable

import numpy as np

from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.epoch_file import truncated
from mqstore.format.quarantine import QUARANTINE_DIR
from mqstore.format.record import SCAN_BLANK, SCAN_OK, scan_record
from mqstore.lifecycle.recovery import nonzero_extent
from mqstore.lifecycle.state_aside import set_aside
from mqstore.storage.durable_file import replace_file, sync_dir
from mqstore.storage.index_progress import progress_path
from mqstore.storage.queue_manifest import ManifestKeeper
from mqstore.storage.queue_progress import remove_queued
from mqstore.storage.role_file import Cut, RoleRecord, write_role

Step = Callable[[str], None]


def cut_paths(root: str, at: int) -> tuple[str, str]:
    """The quarantine file of a cut at ``at`` and its report."""
    base = os.path.join(root, QUARANTINE_DIR, f"rejoin-{at:020d}")
    return base, base + ".json"


def apply_cut(root: str, commit_log, queues: dict, checkpoint, manifest: ManifestKeeper,
              epochs, record: RoleRecord, step: Step = lambda name: None) -> dict:
    """NOTE [ Rejoining ]: ``record.cut`` applied to the store's files (opened, not yet
    recovered); returns the cut's report. ``step(name)`` is called after each step (tests
    end the process there)."""
    cut = record.cut
    assert cut is not None
    report = _saved(root, commit_log, cut)
    step("saved")
    _lower_positions(root, queues, checkpoint, manifest, cut.at)
    step("positions")
    report["set_aside"] = set_aside(root, f"rejoin-{cut.at:020d}")
    _write_report(root, cut.at, report)
    step("state")
    for cq in queues.values():
        cq.cut_stored(cut.at)
    step("queues")
    _truncate_log(commit_log, cut.at, step)
    epochs.replace(truncated(epochs.entries, cut.at))
    write_role(root, RoleRecord(record.role, record.master, record.epoch,
                                int(time.time() * 1000), record.why))
    step("done")
    return report


def _saved(root: str, commit_log, cut: Cut) -> dict:
    """Step 1: the cut bytes and their report, or the report of an earlier run."""
    data_path, report_path = cut_paths(root, cut.at)
    try:
        with open(report_path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    os.makedirs(os.path.dirname(data_path), exist_ok=True)
    report = {"from": cut.at, "to": cut.at, "bytes": 0, "records": 0, "queues": {},
              "unreadable": [], "master": cut.master, "master_epoch": cut.epoch,
              "file": os.path.basename(data_path), "cut_ms": int(time.time() * 1000)}
    with open(data_path, "wb") as saved:
        for seg in commit_log.segments.segments:
            if seg.end <= cut.at or seg.start >= max(cut.end, cut.at):
                continue
            lo = max(cut.at, seg.start)
            hi = seg.start + nonzero_extent(seg, lo - seg.start)
            hi = max(hi, min(cut.end, seg.end))
            data = seg.pread(lo - seg.start, hi - lo)
            saved.write(data)
            _describe(data, lo, report)
            report["to"] = hi
        saved.flush()
        os.fsync(saved.fileno())
    report["bytes"] = report["to"] - cut.at
    _write_report(root, cut.at, report)
    return report


def _write_report(root: str, at: int, report: dict) -> None:
    replace_file(cut_paths(root, at)[1], json.dumps(report, indent=1, sort_keys=True).encode(),
                 fsync=True, sync_directory=True)


def _describe(data: bytes, base: int, report: dict) -> None:
    """Count the records of ``data`` (one segment's bytes from commit-log offset ``base``)."""
    pos = 0
    queues = report["queues"]
    while pos < len(data):
        kind, size, head = scan_record(data, pos, len(data), False, expected_phys=base + pos)
        if kind == SCAN_BLANK:
            return
        if kind != SCAN_OK:
            if any(data[pos:]):
                report["unreadable"].append({"offset": base + pos, "why": size})
            return
        report["records"] += 1
        key = f"{head.topic}/{head.queue_id}"
        q = queues.setdefault(key, {"records": 0, "first_queue_offset": head.queue_offset,
                                    "last_queue_offset": head.queue_offset})
        q["records"] += 1
        q["first_queue_offset"] = min(q["first_queue_offset"], head.queue_offset)
        q["last_queue_offset"] = max(q["last_queue_offset"], head.queue_offset)
        pos += size


def _lower_positions(root: str, queues: dict, checkpoint, manifest: ManifestKeeper,
                     at: int) -> None:
    """Step 2: nothing durable says a queue or the log went past the point any more."""
    checkpoint.confirm_phy_offset = min(checkpoint.confirm_phy_offset, at)
    checkpoint.master_flushed_offset = min(checkpoint.master_flushed_offset, at)
    checkpoint.flush()
    checkpoint.note_appended(min(checkpoint.appended_offset, at))
    checkpoint.appended_offset = min(checkpoint.appended_offset, at)
    remove_queued(root)
    with contextlib.suppress(FileNotFoundError):  # it only narrows the index's re-indexing
        os.unlink(progress_path(root))
    entries = {}
    for key, (first, end, phys) in manifest.recorded.items():
        if first >= at:
            continue  # a queue the cut records made: it starts over with the master's
        cq = queues.get(key)
        kept = _kept_end(cq, at) if cq is not None else None
        if kept is not None:
            entries[key] = (first, kept[0], kept[1])
        elif phys < at:
            entries[key] = (first, end, phys)
        else:  # its files are gone: recovery rebuilds it from its first record
            entries[key] = (first, 0, -1)
    manifest.settle(entries)


def _kept_end(cq, at: int) -> tuple[int, int] | None:
    """``(queue offset after the last unit kept, its record's end)`` once the cut removes the
    units of records past ``at``; None when the queue keeps none."""
    for seg in reversed(cq.segments.segments):
        units = cq.stored_units(seg)
        sizes = units["size"]
        ends = units["phys_offset"].astype(np.int64) + sizes.astype(np.int64)
        keep = np.flatnonzero((sizes != 0) & ((sizes == FILLER_SIZE) | (ends <= at)))
        real = np.flatnonzero((sizes != 0) & (sizes != FILLER_SIZE) & (ends <= at))
        if len(keep):
            last = int(keep[-1])
            phys = int(ends[int(real[-1])]) if len(real) else -1
            return seg.start // CQ_UNIT_SIZE + last + 1, phys
    return None


def _truncate_log(commit_log, at: int, step: Step) -> None:
    """Step 4 for the log: segments past the point, newest first, then the point's own."""
    segq = commit_log.segments
    directory = segq.directory
    for seg in reversed(list(segq.segments)):
        if seg.start < at:
            break
        segq.segments.remove(seg)
        seg.destroy()
        step("segment")
    sync_dir(directory)
    last = segq.find(at) or (segq.segments[-1] if segq.segments else None)
    if last is not None and last.start <= at < last.end:
        stop = last.start + nonzero_extent(last, at - last.start)
        if stop > at:
            last.zero(at - last.start, stop - last.start)
            last.force()
    segq.truncate_to(at)


__all__ = ["apply_cut", "cut_paths"]

"""Cross-checking consume queues against the commit log.

Dispatch gives every record that is not a prepared or rolled-back transaction (quarantine
records are prepared ones) the unit at its own queue offset, ``(phys, size, tags code)``. So,
for each queue: every such record of the walked log has that unit, and every unit whose
record is still stored (at or after the log's first byte) names exactly such a record. A
filler (``size 0x7FFFFFFF``) holds the place of an offset whose record is gone. A deleted
topic's records stored before it was deleted (``storage.deleted_topics``) have no unit.
"""

from __future__ import annotations

import os

import numpy as np

from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.record import SYSFLAG_TX_MASK, TX_COMMIT, TX_NOT
from mqstore.ops.checking.log_walk import LogScan
from mqstore.ops.checking.problems import CONSUME_QUEUE, Problem, runs
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR
from mqstore.storage.mapped_file import segment_name


def expected_units(scan: LogScan, deleted: dict[str, int] | None = None
                   ) -> dict[tuple[str, int], tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``(topic, queue id) -> (queue offsets, phys offsets, sizes)``, ascending by queue
    offset; ``deleted``: ``{topic: commit-log offset}`` below which a topic has none."""
    if not scan.records:
        return {}
    tx = scan.sysflags & SYSFLAG_TX_MASK
    keep = (tx == TX_NOT) | (tx == TX_COMMIT)
    for topic, below in (deleted or {}).items():
        if topic in scan.topics:
            keep &= ~((scan.topic_ids == scan.topics.index(topic)) & (scan.phys < below))
    rows = np.flatnonzero(keep)
    order = np.lexsort((scan.queue_offsets[rows], scan.queue_ids[rows], scan.topic_ids[rows]))
    rows = rows[order]
    key = scan.topic_ids[rows] << 32 | (scan.queue_ids[rows] & 0xFFFFFFFF)
    cuts = np.flatnonzero(np.diff(key)) + 1
    out = {}
    for part in np.split(rows, cuts):
        if len(part):
            first = int(part[0])
            out[(scan.topics[scan.topic_ids[first]], int(scan.queue_ids[first]))] = (
                scan.queue_offsets[part], scan.phys[part], scan.sizes[part])
    return out


def _units(cq) -> tuple[int, np.ndarray]:
    """The queue offset of the first unit in its files and every unit up to the last written."""
    segs = cq.segments.segments
    if not segs:
        return 0, np.empty(0, dtype=np.dtype([("phys_offset", ">i8"), ("size", ">i4"),
                                              ("tags_code", ">i8")]))
    parts, expect = [], segs[0].start
    for seg in segs:
        if seg.start != expect:  # a file missing between others: its units read as holes
            parts.append(np.zeros((seg.start - expect) // CQ_UNIT_SIZE, dtype=parts[0].dtype
                                  if parts else cq.stored_units(seg).dtype))
        units = cq.stored_units(seg)
        full = np.zeros(seg.size // CQ_UNIT_SIZE, dtype=units.dtype)
        full[:len(units)] = units
        parts.append(full)
        expect = seg.start + seg.size
    units = np.concatenate(parts)
    written = np.flatnonzero((units["size"] != 0) | (units["phys_offset"] != 0))
    return segs[0].start // CQ_UNIT_SIZE, units[:int(written[-1]) + 1 if len(written) else 0]


def check_queues(scan: LogScan, queues: dict, root: str, file_bytes: int,
                 deleted: dict[str, int] | None = None) -> list[Problem]:
    problems: list[Problem] = []
    expected = expected_units(scan, deleted)
    for key in sorted(set(expected) | set(queues)):
        topic, queue_id = key
        directory = os.path.join(CONSUME_QUEUE_DIR, topic, str(queue_id))
        cq = queues.get(key)
        exp = expected.get(key)
        if cq is None or not cq.segments.segments:
            if exp is None:
                continue
            count = len(exp[0])
            problems.append(Problem(CONSUME_QUEUE, directory, 0,
                                    f"consume queue {topic}/{queue_id} is missing: {count} "
                                    f"record(s) have no unit", int(exp[0][0])))
            continue
        qfile = cq.segments.segment_bytes or file_bytes
        problems += _check_one(scan, topic, queue_id, directory, qfile, cq, exp)
    return problems


def _where(directory: str, file_bytes: int, queue_offset: int) -> tuple[str, int]:
    pos = queue_offset * CQ_UNIT_SIZE
    start = pos - pos % file_bytes
    return os.path.join(directory, segment_name(start)), pos - start


def _check_one(scan, topic, queue_id, directory, file_bytes, cq, exp) -> list[Problem]:
    base, units = _units(cq)
    n = len(units)
    q = base + np.arange(n, dtype=np.int64)
    phys = units["phys_offset"].astype(np.int64)
    size = units["size"].astype(np.int64)
    filler = size == FILLER_SIZE
    hole = (size == 0) & (phys == 0)
    kept = ~filler & ~hole & (phys >= scan.min_offset)
    exp_q, exp_phys, exp_size = exp if exp is not None else (np.empty(0, np.int64),) * 3
    # the record each unit's offset should name, if the walk found one
    at = np.searchsorted(exp_q, q)
    found = at < len(exp_q)
    found[found] = exp_q[at[found]] == q[found]
    safe = np.where(found, at, 0)
    matches = found & (exp_phys[safe] == phys) & (exp_size[safe] == size) if len(exp_q) else found
    bad = np.flatnonzero(kept & ~matches)
    problems = []
    for group in _grouped(bad.tolist(), lambda i: _unit_reason(scan, phys[i], size[i], found[i])):
        first, last, reason = group
        path, offset = _where(directory, file_bytes, base + first)
        span = f"unit {base + first}" if first == last else f"units {base + first}..{base + last}"
        problems.append(Problem(CONSUME_QUEUE, path, offset,
                                f"{topic}/{queue_id} {span}: {reason}", base + first))
    for first, last in runs(np.flatnonzero(hole).tolist()):
        path, offset = _where(directory, file_bytes, base + first)
        problems.append(Problem(CONSUME_QUEUE, path, offset,
                                f"{topic}/{queue_id} units {base + first}..{base + last} were "
                                f"never written (zeros) below the queue's last unit", base + first))
    covered = np.zeros(len(exp_q), dtype=bool)
    covered[at[matches]] = True
    missing = exp_q[~covered]
    inside = (missing >= base) & (missing < base + n)
    idx = np.where(inside, missing - base, 0)
    reported = inside & (hole[idx] | (kept[idx] & ~matches[idx])) if n else inside
    missing = missing[~reported]
    for first, last in runs(missing.tolist()):
        path, offset = _where(directory, file_bytes, first)
        problems.append(Problem(CONSUME_QUEUE, path, offset,
                                f"{topic}/{queue_id} queue offsets {first}..{last}: "
                                f"{last - first + 1} record(s) have no unit", first))
    return problems


def _unit_reason(scan: LogScan, phys: int, size: int, has_record: bool) -> str:
    if phys + size > scan.end:
        return f"points past the end of the commit log ({scan.end})"
    if scan.in_damage(phys):
        return "points into damaged commit-log bytes"
    if not has_record:
        return "no record of the commit log has this queue offset"
    return "does not name the record of its queue offset"


def _grouped(indices: list[int], reason_of) -> list[tuple[int, int, str]]:
    """Consecutive indices with the same reason, as ``(first, last, reason)``."""
    out: list[tuple[int, int, str]] = []
    for i in indices:
        reason = reason_of(i)
        if out and i == out[-1][1] + 1 and out[-1][2] == reason:
            out[-1] = (out[-1][0], i, reason)
        else:
            out.append((i, i, reason))
    return out

"""Decoding a consume-queue file (``format.cq_unit``) and an index file
(``format.index_layout``); a unit is also checked against the record it names when the file
lies in a store directory."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from mqstore.errors import CorruptRecordError
from mqstore.format import index_layout as L
from mqstore.format.cq_unit import CQ_UNIT_SIZE, EXT_ADDRESS_MAX, FILLER_SIZE, decode_units
from mqstore.format.verify import verify_queue_record
from mqstore.ops.inspection.table import Inspection
from mqstore.ops.messages import ms_to_iso
from mqstore.storage.commit_log import CommitLog


def _store_of(path: str) -> tuple[str, str, int] | None:
    """``(root, topic, queue id)`` when ``path`` is ``<root>/consumequeue/<topic>/<id>/<file>``."""
    parts = Path(os.path.abspath(path)).parts
    if len(parts) >= 4 and parts[-4] == "consumequeue" and parts[-2].isdigit():
        return str(Path(*parts[:-4])), parts[-3], int(parts[-2])
    return None


def _unit_type(size: int, tags_code: int) -> str:
    if size == FILLER_SIZE:
        return "filler"
    if size == 0:
        return "empty"
    return "unit (ext)" if tags_code <= EXT_ADDRESS_MAX else "unit"


def inspect_queue_file(path: str, at: int | None, limit: int) -> Inspection:
    name = os.path.basename(path)
    base = (int(name) if name.isdigit() else 0) // CQ_UNIT_SIZE
    raw = np.fromfile(path, dtype=np.uint8)
    units = decode_units(raw[:len(raw) // CQ_UNIT_SIZE * CQ_UNIT_SIZE].tobytes())
    written = np.flatnonzero((units["size"] != 0) | (units["phys_offset"] != 0))
    count = int(written[-1]) + 1 if len(written) else 0
    first = 0 if at is None else at - base
    if not 0 <= first <= max(count, 0):
        raise ValueError(f"--at {at} is outside this file's queue offsets [{base}, "
                         f"{base + count})")
    owner = _store_of(path)
    result = Inspection(path, "consumequeue",
                        columns=["queue_offset", "phys_offset", "size", "tags_code", "type",
                                 "record"])
    result.fields = {"first queue offset": base, "file bytes": len(raw),
                     "units written": count}
    if owner is not None:
        result.fields.update({"topic": owner[1], "queue_id": owner[2]})
    stop = min(count, first + limit)
    checker = _RecordChecker(owner) if owner is not None else None
    try:
        for i in range(first, stop):
            phys, size, code = (int(units[i]["phys_offset"]), int(units[i]["size"]),
                                int(units[i]["tags_code"]))
            kind = _unit_type(size, code)
            row = {"queue_offset": base + i, "phys_offset": phys, "size": size,
                   "tags_code": code, "type": kind, "record": None}
            if checker is not None and kind.startswith("unit"):
                row["record"] = checker.check(phys, size, base + i)
            result.rows.append(row)
    finally:
        if checker is not None:
            checker.close()
    result.next_at = base + stop if stop < count else None
    return result


class _RecordChecker:
    """Reads the record a unit names from the store's commit log and says whether it is the
    record of that unit's queue and offset."""

    def __init__(self, owner: tuple[str, str, int]) -> None:
        root, self.topic, self.queue_id = owner
        self.log = CommitLog(os.path.join(root, "commitlog"), None, read_only=True)
        self.log.load()

    def check(self, phys: int, size: int, queue_offset: int) -> str:
        if phys < self.log.min_offset:
            return "deleted (below the commit log's start)"
        raw = self.log.read(phys, size)
        if raw is None:
            return "missing (past the commit log's end)"
        try:
            verify_queue_record(bytes(raw), phys, size, self.topic.encode(), self.queue_id,
                                queue_offset)
        except CorruptRecordError as exc:
            return f"bad: {exc}"
        return "ok"

    def close(self) -> None:
        self.log.close()


def inspect_index_file(path: str, at: int | None, limit: int, slots: int | None = None,
                       entries: int | None = None) -> Inspection:
    size = os.path.getsize(path)
    if slots is None or L.file_size(slots, entries) != size:
        slots, entries = L.counts_for_size(size)
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    header = L.unpack_header(raw)
    count = min(max(header.index_count, L.FIRST_INDEX), entries)
    result = Inspection(path, "index", columns=["entry", "key_hash", "slot", "phys_offset",
                                                 "stored", "prev_index"])
    result.fields = {
        "begin timestamp": header.begin_timestamp, "begin": ms_to_iso(header.begin_timestamp),
        "end timestamp": header.end_timestamp, "end": ms_to_iso(header.end_timestamp),
        "begin phys offset": header.begin_phys_offset,
        "end phys offset": header.end_phys_offset,
        "hash slots used": header.hash_slot_count, "index count": header.index_count,
        "slots": slots, "entries": entries, "file bytes": size,
    }
    first = L.FIRST_INDEX if at is None else at
    if not L.FIRST_INDEX <= first <= count:
        raise ValueError(f"--at {at} is outside this file's entries [1, {count})")
    stop = min(count, first + limit)
    start = L.entry_position(slots, first)
    rows = raw[start:start + (stop - first) * L.ENTRY_SIZE].view(L.ENTRY_DTYPE)
    for n, e in enumerate(rows, start=first):
        stored = L.entry_time_ms(header.begin_timestamp, int(e["time_diff"]))
        result.rows.append({"entry": n, "key_hash": int(e["key_hash"]),
                            "slot": L.slot_of(int(e["key_hash"]), slots),
                            "phys_offset": int(e["phys_offset"]), "stored": ms_to_iso(stored),
                            "store_timestamp": stored, "prev_index": int(e["prev_index"])})
    result.next_at = stop if stop < count else None
    return result

"""Decoding one commit-log segment file record by record (``format.record``), CRC checked.

Damaged bytes are shown as one ``damaged`` row up to the next intact record, found as
recovery finds it (``format.quarantine.find_record``); zeros after the last record end the
data.
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from mqstore.format.properties import decode_properties
from mqstore.format.quarantine import find_record, is_quarantine
from mqstore.format.record import (
    SCAN_BAD, SCAN_BLANK, decode_record, offset_msg_id, scan_record,
)
from mqstore.hashing import crc32
from mqstore.ops.inspection.table import Inspection
from mqstore.ops.messages import ms_to_iso

COLUMNS = ["offset", "size", "type", "crc", "topic", "queue_id", "queue_offset", "tags",
           "keys", "stored", "msg_id"]


def _zeros_from(buf, pos: int) -> bool:
    return not np.count_nonzero(np.frombuffer(buf, dtype=np.uint8, offset=pos))


def inspect_segment(path: str, at: int | None, limit: int) -> Inspection:
    name = os.path.basename(path)
    base = int(name) if name.isdigit() else 0
    size = os.path.getsize(path)
    result = Inspection(path, "commitlog", columns=COLUMNS)
    result.fields = {"segment start": base, "file bytes": size}
    pos = 0 if at is None else at - base
    if not 0 <= pos <= size:
        raise ValueError(f"--at {at} is outside this segment [{base}, {base + size})")
    if size == 0:
        return result
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        result.fields["data ends at"] = _walk(buf, base, size, pos, limit, result)
    result.fields["rows shown"] = len(result.rows)
    return result


def _walk(buf, base: int, size: int, pos: int, limit: int, result: Inspection) -> int:
    """Rows from ``pos``; returns where the data ends (or where the rows stopped)."""
    while pos < size:
        if len(result.rows) >= limit:
            result.next_at = base + pos
            return base + pos
        kind, length, _head = scan_record(buf, pos, size, False, expected_phys=base + pos)
        if kind == SCAN_BLANK:
            result.rows.append({"offset": base + pos, "size": length, "type": "blank"})
            if length == size - pos:
                return base + size
            kind, length = SCAN_BAD, f"blank record of {length} bytes does not close the file"
        if kind == SCAN_BAD:
            if _zeros_from(buf, pos):
                return base + pos
            nxt = find_record(buf, pos + 1, size, base, size)
            end = nxt if nxt is not None else size
            result.rows.append({"offset": base + pos, "size": end - pos, "type": "damaged",
                                "crc": None, "topic": length})
            pos = end
            continue
        result.rows.append(_record_row(buf, pos))
        pos += length
    return base + pos


def _record_row(buf, pos: int) -> dict:
    rec = decode_record(buf, pos)
    props = decode_properties(rec.properties_text)
    keys = [k for k in props.get("KEYS", "").split(" ") if k]
    quarantined = is_quarantine(rec.flag, rec.sysflag, rec.topic)
    return {
        "offset": rec.phys_offset, "size": rec.size,
        "type": "quarantine" if quarantined else "record",
        "crc": "ok" if crc32(rec.body) == rec.body_crc else "bad",
        "topic": rec.topic, "queue_id": rec.queue_id, "queue_offset": rec.queue_offset,
        "tags": props.get("TAGS"), "keys": keys, "stored": ms_to_iso(rec.store_timestamp),
        "store_timestamp": rec.store_timestamp, "sysflag": rec.sysflag,
        "msg_id": offset_msg_id(rec.store_host, rec.phys_offset),
        "uniq_key": props.get("UNIQ_KEY"),
    }

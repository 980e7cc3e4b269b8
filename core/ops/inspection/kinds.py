"""``mqstore inspect PATH``: what a file is (from its place in a store directory, or as
told) and its decoded content."""

from __future__ import annotations

import os
from pathlib import Path

from mqstore.format.record import SCAN_BAD, scan_record
from mqstore.ops.inspection.commit_log import inspect_segment
from mqstore.ops.inspection.queue_files import inspect_index_file, inspect_queue_file
from mqstore.ops.inspection.small_files import inspect_abort, inspect_checkpoint, inspect_json
from mqstore.ops.inspection.table import Inspection

KINDS = ("commitlog", "consumequeue", "index", "checkpoint", "abort", "json")
INDEX_NAME_DIGITS = 17  # yyyyMMddHHmmssSSS


def detect_kind(path: str) -> str:
    p = Path(path)
    name = p.name
    if name in ("checkpoint", "abort"):
        return name
    if name.endswith(".json") or name == "mqstore.clean":
        return "json"
    if name.isdigit():
        parents = [q.name for q in p.resolve().parents][:3]
        if parents[:1] == ["commitlog"]:
            return "commitlog"
        if len(parents) >= 3 and parents[2] == "consumequeue":
            return "consumequeue"
        if parents[:1] == ["index"] or len(name) == INDEX_NAME_DIGITS:
            return "index"
        if _starts_with_record(path):
            return "commitlog"
    raise ValueError(f"cannot tell what {path!r} is from its name and place; pass --kind "
                     f"({', '.join(KINDS)})")


def _starts_with_record(path: str) -> bool:
    with open(path, "rb") as f:
        head = f.read(1 << 16)
    kind, _size, _head = scan_record(head, 0, len(head), False)
    return kind != SCAN_BAD


def inspect_path(path: str, kind: str | None = None, at: int | None = None,
                 limit: int = 100, index_counts: tuple[int, int] | None = None) -> Inspection:
    if os.path.isdir(path):
        raise ValueError(f"{path!r} is a directory: inspect takes one file (a segment, "
                                f"consume-queue file, index file, checkpoint, abort or JSON file)")
    kind = kind or detect_kind(path)
    if kind == "commitlog":
        return inspect_segment(path, at, limit)
    if kind == "consumequeue":
        return inspect_queue_file(path, at, limit)
    if kind == "index":
        slots, entries = index_counts or (None, None)
        return inspect_index_file(path, at, limit, slots, entries)
    if kind == "checkpoint":
        return inspect_checkpoint(path)
    if kind == "abort":
        return inspect_abort(path)
    return inspect_json(path)

"""Decoding the store's small files: checkpoint, abort marker, and the JSON files (RocketMQ's
``config/consumerOffset.json`` and ``delayOffset.json`` offset tables, ``mqstore.json``, the
queue manifest, the clean-shutdown marker)."""

from __future__ import annotations

import json
import os

from mqstore.ops.inspection.table import Inspection
from mqstore.ops.messages import ms_to_iso
from mqstore.ops.store_files import pid_alive
from mqstore.storage.checkpoint import CHECKPOINT_BYTES, CHECKPOINT_FILE, Checkpoint


def inspect_checkpoint(path: str) -> Inspection:
    if os.path.basename(path) != CHECKPOINT_FILE:
        raise ValueError(f"a checkpoint is read by its name: {path!r} is not named "
                         f"{CHECKPOINT_FILE!r}")
    cp = Checkpoint(os.path.dirname(path) or ".", read_only=True)
    size = os.path.getsize(path)
    fields = {"file bytes": size}
    for name, value in (("physicMsgTimestamp", cp.physic_msg_timestamp),
                        ("logicsMsgTimestamp", cp.logics_msg_timestamp),
                        ("indexMsgTimestamp", cp.index_msg_timestamp)):
        fields[name] = value
        fields[f"{name} (local time)"] = ms_to_iso(value)
    fields.update({"masterFlushedOffset": cp.master_flushed_offset,
                   "confirmPhyOffset": cp.confirm_phy_offset,
                   "appended (mqstore)": cp.appended_offset,
                   "min timestamp for recovery": cp.min_timestamp()})
    if size != CHECKPOINT_BYTES:
        fields["problem"] = f"a checkpoint is {CHECKPOINT_BYTES} bytes, this one {size}"
    return Inspection(path, "checkpoint", fields)


def inspect_abort(path: str) -> Inspection:
    with open(path, encoding="ascii", errors="replace") as f:
        text = f.read().strip()
    pid = int(text) if text.isdigit() else None
    alive = pid is not None and pid_alive(pid)
    return Inspection(path, "abort", {
        "pid": pid, "writer alive": alive,
        "meaning": "a writer has the store open" if alive else
        "left by a writer that is gone: the last exit was not clean (the next open recovers "
        "abnormally)"})


def inspect_json(path: str) -> Inspection:
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    if not isinstance(data, dict):
        raise ValueError(f"{path!r} holds JSON, but not an object")
    if isinstance(data.get("offsetTable"), dict):
        return _offset_table(path, data["offsetTable"])
    if isinstance(data.get("queues"), dict):
        return _queue_table(path, data)
    return Inspection(path, "json", {k: json.dumps(v) if isinstance(v, (dict, list)) else v
                                     for k, v in data.items()})


def _offset_table(path: str, table: dict) -> Inspection:
    """``{"topic@group": {"0": 12}}`` (consumer offsets) or ``{"level": offset}`` (delay)."""
    # An empty table tells nothing: the broker's file names say which one it is.
    nested = (all(isinstance(v, dict) for v in table.values()) if table
              else "consumer" in os.path.basename(path).lower())
    if not nested:
        rows = [{"key": k, "offset": v} for k, v in sorted(table.items())]
        return Inspection(path, "offset-table", {"entries": len(rows)}, ["key", "offset"], rows)
    rows = []
    for key, offsets in sorted(table.items()):
        topic, _, group = key.partition("@")
        for queue_id, offset in sorted(offsets.items(), key=lambda kv: int(kv[0])):
            rows.append({"topic": topic, "group": group, "queue_id": int(queue_id),
                         "offset": offset})
    groups = sorted({r["group"] for r in rows})
    return Inspection(path, "consumer-offsets", {"groups": len(groups), "entries": len(rows)},
                      ["topic", "group", "queue_id", "offset"], rows)


def _queue_table(path: str, data: dict) -> Inspection:
    """The queue manifest, or the clean-shutdown marker's queue list."""
    rows = []
    for key, value in sorted(data["queues"].items()):
        topic, _, queue_id = key.rpartition("/")
        row = {"topic": topic, "queue_id": int(queue_id)}
        if isinstance(value, dict):
            row.update(value)
        else:  # the marker: [max offset, end of the last unit's record, files]
            row.update({"max_offset": value[0], "max_phys": value[1], "files": len(value[2])})
        rows.append(row)
    fields = {k: json.dumps(v) if isinstance(v, (dict, list)) else v
              for k, v in data.items() if k != "queues"}
    columns = list(dict.fromkeys(k for row in rows for k in row))
    return Inspection(path, "queue-table", fields, columns, rows)

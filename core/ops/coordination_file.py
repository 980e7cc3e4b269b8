"""``coordination.json`` in the store root: what a served store's coordination last said (its
leader, epoch, whether it may write, why it waits), written by ``ops.failover`` every renewal
interval, so ``mqstore stats`` shows it from another process. Replaced by rename; never
mirrored (it describes this node, not the master's state)."""

from __future__ import annotations

import json
import os

FILE = "coordination.json"


def write_coordination(root: str, status: dict) -> None:
    path = os.path.join(root, FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(status, f, sort_keys=True)
    os.replace(tmp, path)


def read_coordination(root: str) -> dict | None:
    """The last status written, or None (none written, or unreadable)."""
    try:
        with open(os.path.join(root, FILE), encoding="utf-8") as f:
            status = json.load(f)
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


__all__ = ["FILE", "write_coordination", "read_coordination"]

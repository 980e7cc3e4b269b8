"""``replication.json``: the replication's state as the store process last saw it, for tools
in other processes (``mqstore stats``).

The running store rewrites it (by rename, never in place) at most once a second while the state
changes, and once more when replication stops; nothing is forced to disk, since it describes
the moment, not data. A reader takes it as a hint, dated by its ``updated_ms``.
"""

from __future__ import annotations

import json
import os

STATUS_FILE = "replication.json"


def write_status(root: str, status: dict) -> None:
    path = os.path.join(root, STATUS_FILE)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(status, f, sort_keys=True)
    os.replace(tmp, path)


def read_status(root: str) -> dict | None:
    """The last status written, or None when there is none (or it cannot be read)."""
    try:
        with open(os.path.join(root, STATUS_FILE), encoding="utf-8") as f:
            status = json.load(f)
    except (OSError, ValueError):
        return None
    return status if isinstance(status, dict) else None


__all__ = ["STATUS_FILE", "write_status", "read_status"]

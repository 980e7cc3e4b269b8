"""``replication.json``: the replication's state as the store process last saw it, for tools
in other processes (``mqstore stats``).

The running store rewrites it (by rename, never in place) at most once a second while the state
changes, and once more when replication stops; nothing is forced to disk, since it describes
the moment, not data. A reader takes it as a hint, dated by its ``updated_ms``.
"""

from __future__ import annotations

import os

from mqstore.storage.durable_file import read_hint, write_hint

STATUS_FILE = "replication.json"


def write_status(root: str, status: dict) -> None:
    write_hint(os.path.join(root, STATUS_FILE), status)


def read_status(root: str) -> dict | None:
    """The last status written, or None when there is none (or it cannot be read)."""
    return read_hint(os.path.join(root, STATUS_FILE))


__all__ = ["STATUS_FILE", "write_status", "read_status"]

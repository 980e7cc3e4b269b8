"""``coordination.json`` in the store root: what a served store's coordination last said (its
leader, epoch, whether it may write, why it waits), written by ``ops.failover`` every renewal
interval, so ``mqstore stats`` shows it from another process. Replaced by rename; never
mirrored (it describes this node, not the master's state)."""

from __future__ import annotations

import os

from mqstore.storage.durable_file import read_hint, write_hint

FILE = "coordination.json"


def write_coordination(root: str, status: dict) -> None:
    write_hint(os.path.join(root, FILE), status)


def read_coordination(root: str) -> dict | None:
    """The last status written, or None (none written, or unreadable)."""
    return read_hint(os.path.join(root, FILE))


__all__ = ["FILE", "write_coordination", "read_coordination"]

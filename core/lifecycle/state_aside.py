"""A store's own consumer and topic state, set aside when the store rejoins a new master as a
slave (NOTE [ Rejoining ] in ``lifecycle.rejoin``): from then on the master's state is the one
that counts, and the store's old state would be taken for it (a promoted store reads its
state files as its own; committed offsets are evidence for the offset floors).

The files go, with their paths under the root kept, to ``replica-previous/<tag>/``; a file
moved already is not moved again, so the step can run again after a crash. ``STATE_PATHS``
names them (glob patterns under the root): the state a consumer or producer relies on, the
same files a state mirror copies from a master (derived files, locks and membership are not
state).
"""

from __future__ import annotations

import glob
import os

from mqstore.storage.durable_file import sync_dir

ASIDE_DIR = "replica-previous"
STATE_PATHS = (
    "config/topics.json", "config/topics.json.bak", "config/mqstore_deleted_topics.json",
    "config/consumerOffset.json", "config/consumerOffset.json.journal",
    "config/consumerOffset.json.bak", "subscriptions.json",
    "consumer/pop/*", "consumer/groups/*/*/recorded",
)


def state_files(root: str) -> list[str]:
    """The state files the store holds now, relative to ``root``, sorted."""
    found = set()
    for pattern in STATE_PATHS:
        for path in glob.glob(os.path.join(glob.escape(root), pattern)):
            if os.path.isfile(path):
                found.add(os.path.relpath(path, root))
    return sorted(found)


def set_aside(root: str, tag: str) -> dict:
    """Move every state file to ``replica-previous/<tag>/`` (same relative paths); returns
    ``{"directory": ..., "files": [...]}`` (the files there, moved now or before)."""
    target = os.path.join(root, ASIDE_DIR, tag)
    for rel in state_files(root):
        dest = os.path.join(target, rel)
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        os.replace(os.path.join(root, rel), dest)
        sync_dir(os.path.dirname(dest))
    moved = []
    if os.path.isdir(target):
        for base, _dirs, files in os.walk(target):
            moved += [os.path.relpath(os.path.join(base, f), target) for f in files]
        for base in {os.path.dirname(os.path.join(root, rel)) for rel in moved}:
            if os.path.isdir(base):
                sync_dir(base)
    return {"directory": os.path.relpath(target, root), "files": sorted(moved)}


__all__ = ["ASIDE_DIR", "STATE_PATHS", "state_files", "set_aside"]

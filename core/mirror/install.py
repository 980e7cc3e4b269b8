"""Promotion's step "the mirror becomes the state": a slave's mirror of its master's state
files (``replica/``) put in the place of its own (NOTE [ State mirror ]).

    1. refuse, changing nothing, unless a complete snapshot was applied (``replica_state``)
    2. the slave's own state files go aside, to ``replica-previous/<UTC time>/<path>``
    3. the mirror's files move into place, unit by unit under each unit's lock, documents
       before journals before marks (a pop checkpoint before the journal that continues it,
       offsets before the marks that say a group has some)
    4. ``replica/state.json`` goes aside too: the mirror is spent, and the next one starts
       empty (a store that becomes a slave again must receive a new snapshot)

Every step is a rename, and ``replica/installing.json`` records where the install stands, so
an install cut short (a kill) is finished by the next call rather than started over (which
would set aside files the mirror already put in place).
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field

from mqstore.errors import MQStoreError
from mqstore.mirror.replica_state import completeness, replica_dir, state_path
from mqstore.mirror.unit_read import unit_locked
from mqstore.storage.durable_file import replace_file, sync_dir
from mqstore.storage.state_files import units_in

PREVIOUS_DIR = "replica-previous"
INSTALLING = "installing.json"


class MirrorIncompleteError(MQStoreError):
    """The mirror holds no complete snapshot of the master's state: installing it would
    lose state the master had (the message says what the mirror lacks)."""


@dataclass
class InstallReport:
    """What an install did: where the store's own state files went, which they were, which
    files the mirror put in their place, and the snapshot it held."""

    aside: str
    set_aside: list[str] = field(default_factory=list)
    installed: list[str] = field(default_factory=list)
    snapshot: dict = field(default_factory=dict)

    def describe(self) -> str:
        return (f"state mirror installed: {len(self.installed)} state file(s) from snapshot "
                f"{self.snapshot.get('snapshot')}; the store's own {len(self.set_aside)} "
                f"file(s) kept in {self.aside}")


def check_complete(root: str) -> dict:
    """The complete snapshot the mirror of the store in ``root`` holds, or
    ``MirrorIncompleteError`` saying what it lacks."""
    pending = _pending(root)
    if pending is not None:
        return pending["snapshot"]
    done, why = completeness(root)
    if done is None:
        raise MirrorIncompleteError(f"the state mirror of {root} cannot be installed: {why}")
    return done


def install_mirror_files(root: str) -> InstallReport:
    """Steps 1-4 on the store in ``root``. The caller guarantees that nothing of this store
    changes its state files meanwhile: the store is closed, or its consumer side is closed
    and its dispatch covers every byte the slave received. ``MirrorIncompleteError`` (nothing
    changed) when the mirror holds no complete snapshot."""
    snapshot = check_complete(root)
    marker = os.path.join(replica_dir(root), INSTALLING)
    pending = _pending(root)
    if pending is None:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        aside = _free(os.path.join(root, PREVIOUS_DIR, stamp))
        pending = {"aside": aside, "phase": "aside", "snapshot": snapshot}
        _record(marker, pending)
    report = InstallReport(pending["aside"], snapshot=pending["snapshot"])
    if pending["phase"] == "aside":
        report.set_aside = _move_units(root, pending["aside"], lock_root=root)
        pending["phase"] = "install"
        _record(marker, pending)
    report.installed = _move_units(replica_dir(root), root, lock_root=root)
    _move(state_path(root), os.path.join(pending["aside"], "replica-state.json"))
    os.unlink(marker)
    sync_dir(replica_dir(root))
    return report


def _move_units(source: str, target: str, *, lock_root: str) -> list[str]:
    """Every state file of ``source`` renamed to the same path under ``target``, unit by
    unit under the unit's lock in the store's root ``lock_root``, in the registry's
    installing order."""
    moved = []
    for unit in units_in(source):
        files = unit.member_files(source)
        if not files:
            continue
        with unit_locked(lock_root, unit):
            for rel, _member in files:
                _move(os.path.join(source, rel), os.path.join(target, rel))
                moved.append(rel)
    return moved


def _move(src: str, dst: str) -> None:
    try:
        os.makedirs(os.path.dirname(dst), exist_ok=True)
        os.replace(src, dst)
    except FileNotFoundError:
        if os.path.exists(src):
            raise
        return
    sync_dir(os.path.dirname(dst))


def _pending(root: str) -> dict | None:
    try:
        with open(os.path.join(replica_dir(root), INSTALLING), "rb") as f:
            return json.loads(f.read())
    except FileNotFoundError:
        return None


def _record(marker: str, pending: dict) -> None:
    os.makedirs(os.path.dirname(marker), exist_ok=True)
    replace_file(marker, json.dumps(pending).encode(), fsync=True, sync_directory=True)


def _free(path: str) -> str:
    """``path``, or ``path-2``, ``-3``... when an earlier install of the same second used it."""
    candidate, n = path, 1
    while os.path.exists(candidate):
        n += 1
        candidate = f"{path}-{n}"
    return candidate


__all__ = ["InstallReport", "MirrorIncompleteError", "check_complete", "install_mirror_files"]

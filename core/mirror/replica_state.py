"""``replica/state.json``: how far a slave's mirror of its master's state is complete.

    {"format": 1,
     "begun": 1717000000000000000,      # the last snapshot whose snapshot-begin was applied
     "complete": {"snapshot": 1717000000000000000,   # the last snapshot applied whole
                  "offset": 81920,       # commit-log offset of its snapshot-end record
                  "epoch": null,         # the master's epoch it named, if any
                  "applied_ms": 1717000000123},
     "rejected": 0, "last_rejected": null,  # state records passed over, and why
     "crc32": ...}

A snapshot counts as complete only when its snapshot-end follows its own snapshot-begin in
this slave's log: a slave whose log starts inside a snapshot (a new slave starts at the
master's last segment) holds only part of it, and waits for the next one (the master ships
one whenever a slave connects). A sealed file (``storage.sealed_json``): written durably, its
CRC checked; one that cannot be trusted reads as no snapshot at all, and says why.
"""

from __future__ import annotations

import os

from mqstore.storage.sealed_json import read_sealed, write_sealed

REPLICA_DIR = "replica"
STATE_FILE = "state.json"
FORMAT = 1


def replica_dir(root: str) -> str:
    return os.path.join(root, REPLICA_DIR)


def state_path(root: str) -> str:
    return os.path.join(replica_dir(root), STATE_FILE)


def read_state(root: str) -> tuple[dict, str | None]:
    """The state (a fresh one when there is none) and, when the file is damaged, why."""
    body, problem = read_sealed(state_path(root))
    if problem is not None:
        return fresh(), problem
    if body is None:
        return fresh(), None
    if body.get("format") != FORMAT:
        return fresh(), f"{state_path(root)}: not format {FORMAT}"
    return body, None


def fresh() -> dict:
    return {"format": FORMAT, "begun": None, "complete": None, "rejected": 0,
            "last_rejected": None}


def write_state(root: str, state: dict) -> None:
    os.makedirs(replica_dir(root), exist_ok=True)
    write_sealed(state_path(root), state)


def completeness(root: str) -> tuple[dict | None, str]:
    """The last complete snapshot (None: none) and a sentence saying so."""
    state, problem = read_state(root)
    done = state.get("complete")
    if problem is not None:
        return None, f"the mirror's record of its snapshots cannot be trusted: {problem}"
    if not isinstance(done, dict):
        begun = state.get("begun")
        more = (f" (snapshot {begun} began but its end was not applied)" if begun else "")
        return None, (f"no complete snapshot of the master's state was applied to "
                      f"{replica_dir(root)}{more}: the master ships one when it starts and "
                      f"whenever a slave connects, once it has a state file (a master that "
                      f"never had one ships none, and leaves nothing to install)")
    return done, (f"snapshot {done['snapshot']} complete at commit-log offset "
                  f"{done['offset']}")


def mirror_status(root: str) -> dict:
    """What a slave's status says of its mirror: the last complete snapshot (or why there
    is none) and the state records passed over."""
    state, problem = read_state(root)
    done, why = completeness(root)
    return {"complete": done is not None, "snapshot": done, "detail": why,
            "rejected": int(state.get("rejected") or 0),
            "last_rejected": problem or state.get("last_rejected")}

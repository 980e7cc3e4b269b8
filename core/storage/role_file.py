"""``role.json``: the role a store was given at run time (a promotion, a demotion), which wins
over the configured ``store.role`` from then on, across restarts.

    {"role": "async_master" | "sync_master" | "slave", "master": "host:port" | null,
     "epoch": <int>, "since_ms": <int>, "why": "<text>",
     "cut": {"at": <offset>, "end": <offset>, "master": "host:port", "epoch": <int>}}

``master`` is the ``server.ha_listen`` a slave follows; ``cut`` a rejoin's truncation that is
decided and not finished: the next open cuts the commit log there, keeping what it cuts
(``lifecycle.rejoin``), then drops ``cut``. No file: the store has the configured role.

Sealed (``storage.sealed_json``): a damaged file is reported, never trusted.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from mqstore.storage.sealed_json import read_sealed, write_sealed

ROLE_FILE = "role.json"
ROLES = ("async_master", "sync_master", "slave")


@dataclass(frozen=True)
class Cut:
    at: int  # the consistent point: the log is cut here
    end: int  # where the log ended when the cut was decided
    master: str  # the master whose log goes on from ``at``
    epoch: int  # that master's last epoch when the cut was decided


@dataclass(frozen=True)
class RoleRecord:
    role: str
    master: str | None = None
    epoch: int = 0
    since_ms: int = 0
    why: str = ""
    cut: Cut | None = field(default=None)


def role_path(root: str) -> str:
    return os.path.join(root, ROLE_FILE)


def read_role(root: str) -> tuple[RoleRecord | None, str | None]:
    """The recorded role (None: none recorded) and a problem (None if fine): a damaged file
    gives ``(None, problem)``."""
    path = role_path(root)
    body, problem = read_sealed(path)
    if body is None:
        return None, problem
    try:
        cut = body.get("cut")
        record = RoleRecord(
            role=str(body["role"]), master=body.get("master"), epoch=int(body.get("epoch", 0)),
            since_ms=int(body.get("since_ms", 0)), why=str(body.get("why", "")),
            cut=Cut(int(cut["at"]), int(cut["end"]), str(cut["master"]), int(cut["epoch"]))
            if cut else None)
    except (KeyError, TypeError, ValueError) as exc:
        return None, f"{path} is malformed ({exc!r})"
    if record.role not in ROLES or (record.role == "slave" and not record.master):
        return None, (f"{path} names role {record.role!r} with master {record.master!r}: a "
                      f"role is one of {', '.join(ROLES)}, and a slave names its master")
    return record, None


def write_role(root: str, record: RoleRecord) -> None:
    """Durably (the rename and the directory synced)."""
    if record.role not in ROLES:
        raise ValueError(f"role {record.role!r} is not one of {', '.join(ROLES)}")
    body = asdict(record)
    if record.cut is None:
        del body["cut"]
    write_sealed(role_path(root), body)


__all__ = ["ROLE_FILE", "ROLES", "Cut", "RoleRecord", "role_path", "read_role", "write_role"]

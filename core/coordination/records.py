"""What a cluster keeps in etcd: the keys under its prefix and the JSON records they hold.

    /mqstore/<cluster>/leader             {"name", "epoch", "lease"}  on the leader's lease
    /mqstore/<cluster>/epoch              "<n>": the last epoch any election handed out
    /mqstore/<cluster>/confirmed          {"offset", "epoch", "leader"}: the last commit-log
                                          offset every PUT_OK is known to cover
    /mqstore/<cluster>/members/<node>     {"name", "role", "offset", "priority", "candidate",
                                          "addresses", "epoch"}  on that node's lease

The leader key and the epoch key change together, in the txn of an election
(``lease.LeaderLease.acquire``); the epoch key has no lease, so epochs survive every member.
The node's member record and, once it wins, the leader key ride the same lease: a holder that
dies loses both in one revision, so no candidate ever waits for a dead leader's record.

A record that does not parse (written by hand, or by another program under the prefix) is
left out of the view and logged, never a crash of the coordination thread; an epoch key that
does not parse stops elections with an error naming it (guessing an epoch could hand one out
twice).
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Mapping

from mqstore.coordination.etcd import KeyValue
from mqstore.errors import CoordinationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Keys:
    cluster: str

    @property
    def prefix(self) -> str:
        return f"/mqstore/{self.cluster}/"

    @property
    def leader(self) -> str:
        return self.prefix + "leader"

    @property
    def epoch(self) -> str:
        return self.prefix + "epoch"

    @property
    def confirmed(self) -> str:
        return self.prefix + "confirmed"

    def member(self, node: str) -> str:
        return self.prefix + "members/" + node


@dataclass(frozen=True)
class MemberInfo:
    """One node as it published itself: ``offset`` is its commit log's end, ``addresses``
    what clients and slaves dial (``{"ha": "10.0.0.2:10912", ...}``, the integration's
    names)."""

    name: str
    role: str
    offset: int
    priority: int
    candidate: bool = True
    addresses: Mapping[str, str] = field(default_factory=dict)
    epoch: int = 0  # the newest epoch this node knows of

    def encode(self) -> bytes:
        return json.dumps({"name": self.name, "role": self.role, "offset": self.offset,
                           "priority": self.priority, "candidate": self.candidate,
                           "addresses": dict(self.addresses), "epoch": self.epoch},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "MemberInfo":
        d = json.loads(data)
        addresses = d.get("addresses", {})
        if not isinstance(addresses, dict):
            raise ValueError(f"addresses {addresses!r} is not a mapping")
        return cls(_text(d["name"]), _text(d["role"]), _count(d["offset"]),
                   _count(d["priority"]), bool(d.get("candidate", True)),
                   {str(k): str(v) for k, v in addresses.items()}, _count(d.get("epoch", 0)))


@dataclass(frozen=True)
class LeaderInfo:
    """Who holds the leader key: ``member`` is its record, when it has one."""

    name: str
    epoch: int
    lease: int
    member: MemberInfo | None = None

    def encode(self) -> bytes:
        return json.dumps({"name": self.name, "epoch": self.epoch, "lease": str(self.lease)},
                          sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes) -> "LeaderInfo":
        d = json.loads(data)
        return cls(_text(d["name"]), _count(d["epoch"]), int(d["lease"]))


@dataclass(frozen=True)
class ClusterView:
    """The cluster's keys as read at one revision (``read_view``)."""

    revision: int
    leader: LeaderInfo | None
    leader_raw: bytes | None  # the leader key's bytes, for compares
    epoch: int
    epoch_mod_revision: int  # 0: no election ever happened
    members: Mapping[str, MemberInfo]
    confirmed: int
    confirmed_mod_revision: int


def parse_view(keys: Keys, revision: int, kvs: list[KeyValue]) -> ClusterView:
    by_key = {kv.key: kv for kv in kvs}
    members = {}
    for kv in kvs:
        if kv.key.startswith(keys.prefix + "members/"):
            member = _parsed(kv, MemberInfo.decode)
            if member is not None:
                members[member.name] = member
    leader_kv = by_key.get(keys.leader)
    leader = _parsed(leader_kv, LeaderInfo.decode) if leader_kv else None
    if leader is not None:
        leader = LeaderInfo(leader.name, leader.epoch, leader.lease, members.get(leader.name))
    epoch_kv, confirmed_kv = by_key.get(keys.epoch), by_key.get(keys.confirmed)
    confirmed = _parsed(confirmed_kv, lambda b: _count(json.loads(b)["offset"]))
    return ClusterView(revision, leader, leader_kv.value if leader_kv else None,
                       parse_epoch(epoch_kv), epoch_kv.mod_revision if epoch_kv else 0,
                       members, confirmed or 0,
                       confirmed_kv.mod_revision if confirmed_kv else 0)


def parse_epoch(kv: KeyValue | None) -> int:
    if kv is None:
        return 0
    text = kv.value.decode("ascii", "replace")
    if not (text.isascii() and text.isdigit()):
        raise CoordinationError(f"etcd key {kv.key} holds {text[:40]!r}, not an epoch (a "
                                f"decimal integer): elections stop until it is fixed by hand")
    return int(text)


def confirmed_record(offset: int, epoch: int, leader: str) -> bytes:
    return json.dumps({"offset": offset, "epoch": epoch, "leader": leader},
                      sort_keys=True).encode()


def _parsed(kv: KeyValue | None, decode):
    if kv is None:
        return None
    try:
        return decode(kv.value)
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("coordination: etcd key %s holds %r, which is not a record mqstore wrote "
                    "(%s); ignored", kv.key, kv.value[:80], exc)
        return None


def _text(value) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{value!r} is not a non-empty string")
    return value


def _count(value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{value!r} is not a whole number >= 0")
    return value


__all__ = ["Keys", "MemberInfo", "LeaderInfo", "ClusterView", "parse_view", "parse_epoch",
           "confirmed_record"]

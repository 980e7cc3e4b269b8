"""The registry of the state files the state mirror copies to slaves (NOTE [ State mirror ]).

Everything a consumer or producer relies on lives in these files beside the data, and a slave
must hold them to take over. Each entry is a *unit*: files that must be read together, under
their owner's lock, to be consistent (a pop group's checkpoint and journal; the offsets
document, its journal and the groups' marks). A new kind of state is one line of ``UNITS``.

A member path is a pattern relative to the store root: ``{name}`` stands for one path
component (letters, digits and ``%|_.@-``; never ``.`` or ``..``). Placeholders of the unit's
``params`` identify one unit (one pop group); the others make a member that stands for many
files (every group's offset mark).

    DOCUMENT   replaced whole by a rename; shipped whole
    JOURNAL    appended to; shipped by the bytes it grew, whole when it shrank or was replaced
    MARK       an empty file whose existence is the state

Not mirrored: locks, membership and liveness files, derived files (consume queues, index,
``mqstore.queued``, the queue manifest, the checkpoint), ``replication.json``, temporary and
damaged files.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Iterator

DOCUMENT, JOURNAL, MARK = "document", "journal", "mark"
_COMPONENT = r"[%|A-Za-z0-9_.@-]+"
_PLACEHOLDER = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Member:
    pattern: str
    kind: str
    regex: re.Pattern = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        parts = _PLACEHOLDER.split(self.pattern)
        text = "".join(re.escape(p) if i % 2 == 0 else f"(?P<{p}>{_COMPONENT})"
                       for i, p in enumerate(parts))
        object.__setattr__(self, "regex", re.compile(text))

    @property
    def components(self) -> int:
        return self.pattern.count("/") + 1

    def names(self) -> set[str]:
        return set(_PLACEHOLDER.findall(self.pattern))


@dataclass(frozen=True)
class UnitKind:
    """A kind of state: its members, the placeholders that name one unit, and the lock its
    owner changes it under (None: a document replaced by a rename is always whole)."""

    name: str
    members: tuple[Member, ...]
    params: tuple[str, ...] = ()
    lock: str | None = None
    exclusive: bool = False  # the lock's mode for a consistent read


UNITS: tuple[UnitKind, ...] = (
    UnitKind("topics", (Member("config/topics.json", DOCUMENT),)),
    UnitKind("deleted_topics", (Member("config/mqstore_deleted_topics.json", DOCUMENT),)),
    UnitKind("subscriptions", (Member("subscriptions.json", DOCUMENT),)),
    UnitKind("delay_offsets", (Member("config/delayOffset.json", DOCUMENT),)),
    UnitKind("timers", (Member("config/mqstore_timers.json", DOCUMENT),)),
    UnitKind("groups", (Member("config/subscriptionGroup.json", DOCUMENT),)),
    # Commits append to the journal under the shared lock: a read beside them takes it
    # exclusively, so no line is caught half written.
    UnitKind("offsets", (Member("config/consumerOffset.json", DOCUMENT),
                         Member("config/consumerOffset.json.journal", JOURNAL),
                         Member("consumer/groups/{group}/{topic}/recorded", MARK)),
             lock="config/consumerOffset.json.lock", exclusive=True),
    UnitKind("pop", (Member("consumer/pop/{key}.json", DOCUMENT),
                     Member("consumer/pop/{key}.journal", JOURNAL)),
             params=("key",), lock="consumer/pop/{key}.json.lock"),
)


@dataclass(frozen=True)
class Unit:
    """One unit: its kind and the values of its params."""

    kind: UnitKind
    values: tuple[tuple[str, str], ...] = ()

    @property
    def name(self) -> str:
        return self.kind.name + "".join(f":{v}" for _k, v in self.values)

    def fill(self, pattern: str) -> str:
        for k, v in self.values:
            pattern = pattern.replace("{" + k + "}", v)
        return pattern

    def lock_path(self) -> str | None:
        return None if self.kind.lock is None else self.fill(self.kind.lock)

    def member_files(self, root: str) -> list[tuple[str, Member]]:
        """The member files that exist now, as ``(relative path, member)``, in the order a
        promotion installs them (documents, then journals, then marks)."""
        out = []
        for member in _installing_order(self.kind.members):
            out += [(rel, member) for rel in _expand(root, self.fill(member.pattern))]
        return out

    def owns(self, rel: str) -> Member | None:
        """The member ``rel`` is a file of, or None."""
        for member in self.kind.members:
            if _fill_regex(member, self).fullmatch(rel):
                return member
        return None


def _installing_order(members) -> list[Member]:
    order = {DOCUMENT: 0, JOURNAL: 1, MARK: 2}
    return sorted(members, key=lambda m: order[m.kind])


def _fill_regex(member: Member, unit: Unit) -> re.Pattern:
    return re.compile(Member(unit.fill(member.pattern), member.kind).regex.pattern)


def unit_of(rel: str) -> tuple[Unit, Member] | None:
    """The unit and member the relative path ``rel`` belongs to, or None (not state)."""
    for kind in UNITS:
        for member in kind.members:
            found = member.regex.fullmatch(rel)
            if found is not None and all(v not in (".", "..") for v in found.groupdict().values()):
                values = tuple((p, found.group(p)) for p in kind.params)
                return Unit(kind, values), member
    return None


@functools.lru_cache(maxsize=4096)  # changes repeat their paths (a group's journal)
def split_path(path: str) -> tuple[str, str] | None:
    """``(store root, relative path)`` of an absolute path of a state file, or None."""
    parts = path.split(os.sep)
    for kind in UNITS:
        for member in kind.members:
            n = member.components
            if len(parts) <= n:
                continue
            rel = "/".join(parts[-n:])
            if member.regex.fullmatch(rel) and unit_of(rel) is not None:
                return os.sep.join(parts[:-n]) or os.sep, rel
    return None


def units_in(root: str) -> list[Unit]:
    """Every unit with at least one file under ``root`` (a snapshot's list), and every unit
    without params (which a snapshot always names, even when empty)."""
    out: dict[str, Unit] = {}
    for kind in UNITS:
        if not kind.params:
            out[kind.name] = Unit(kind)
            continue
        for member in kind.members:
            for rel in _expand(root, member.pattern):
                found = unit_of(rel)
                if found is not None:
                    out.setdefault(found[0].name, found[0])
    return list(out.values())


def state_files(root: str) -> list[str]:
    """Every state file under ``root`` (relative paths)."""
    return [rel for unit in units_in(root) for rel, _m in unit.member_files(root)]


def _expand(root: str, pattern: str) -> list[str]:
    """The existing regular files matching ``pattern`` (placeholders: any safe component)."""
    found = [""]
    for part in pattern.split("/"):
        regex = Member(part, DOCUMENT).regex
        nxt = []
        for prefix in found:
            if not _PLACEHOLDER.search(part):
                nxt.append(f"{prefix}/{part}" if prefix else part)
                continue
            for name in _listdir(os.path.join(root, prefix)):
                if regex.fullmatch(name) and name not in (".", ".."):
                    nxt.append(f"{prefix}/{name}" if prefix else name)
        found = nxt
    return sorted(rel for rel in found if os.path.isfile(os.path.join(root, rel))
                  and not os.path.islink(os.path.join(root, rel)))


def _listdir(directory: str) -> Iterator[str]:
    try:
        return iter(sorted(os.listdir(directory)))
    except (FileNotFoundError, NotADirectoryError):
        return iter(())

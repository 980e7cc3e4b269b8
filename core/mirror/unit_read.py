"""Reading one unit of state files under its owner's lock, and the operations that bring a
slave's copy from what was shipped of it to what it is now (NOTE [ State mirror ]).

Per file the shipper remembers what it shipped: ``(inode, size, mtime_ns)``. A journal on the
same inode that grew is shipped as a ``write`` of the bytes it grew by; a journal that shrank,
has another inode, or whose unit's document was replaced (the offsets journal is emptied in
place right after the document is rewritten), and every changed document, as a ``put`` of its
whole content; a file gone, as a ``delete``. A mark (an empty file) is a ``put`` when it
appears.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from dataclasses import dataclass
from typing import Iterator

from mqstore.format.state_record import DELETE, PUT, WRITE, StateOp
from mqstore.storage.durable_file import read_all
from mqstore.storage.state_files import DOCUMENT, JOURNAL, Unit

Ident = tuple[int, int, int]  # inode, size, mtime_ns


@dataclass
class Change:
    """One operation with the identity the file will have been shipped as once it is put."""

    op: StateOp
    ident: Ident | None  # None: the file is gone


@contextlib.contextmanager
def unit_locked(root: str, unit: Unit) -> Iterator[None]:
    """Hold the unit's lock as its owner's readers and writers take it (none for a unit of
    documents replaced by renames)."""
    lock = unit.lock_path()
    if lock is None:
        yield
        return
    path = os.path.join(root, lock)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX if unit.kind.exclusive else fcntl.LOCK_SH)
        yield
    finally:
        os.close(fd)  # lets go of the flock too


def changes(root: str, unit: Unit, shipped: dict[str, Ident], next_id) -> list[Change]:
    """What to ship of ``unit`` (``shipped``: this unit's files as last shipped; not changed
    here). Call under ``unit_locked``. ``next_id()`` gives a put's id."""
    out: list[Change] = []
    present: set[str] = set()
    files = unit.member_files(root)
    replaced_doc = False
    for rel, member in files:
        fd = _open(os.path.join(root, rel))
        if fd is None:
            continue
        try:
            st = os.fstat(fd)
            ident = (st.st_ino, st.st_size, st.st_mtime_ns)
            present.add(rel)
            before = shipped.get(rel)
            if before == ident:
                continue
            if member.kind == DOCUMENT:
                replaced_doc = True
            grown = (member.kind == JOURNAL and before is not None and not replaced_doc
                     and before[0] == ident[0] and ident[1] >= before[1])
            if grown:
                if ident[1] > before[1]:
                    data = os.pread(fd, ident[1] - before[1], before[1])
                    out.append(Change(StateOp(WRITE, rel, pos=before[1], body=data),
                                      (ident[0], before[1] + len(data), ident[2])))
                continue
            os.lseek(fd, 0, os.SEEK_SET)
            data = read_all(fd)
            out.append(Change(StateOp(PUT, rel, op_id=next_id(), total=len(data), body=data),
                              (ident[0], len(data), ident[2])))
        finally:
            os.close(fd)
    for rel in sorted(set(shipped) - present):
        out.append(Change(StateOp(DELETE, rel), None))
    return out


def _open(path: str) -> int | None:
    try:
        return os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except (FileNotFoundError, NotADirectoryError):
        return None

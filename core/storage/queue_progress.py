"""``mqstore.queued``: the commit-log record below which every derived file is on disk, so a
recovery after a crash walks and re-dispatches only what came later, not from a segment's start.

RocketMQ's checkpoint keeps only times (the last flushed message's, the last consume-queue
write's): after a crash it walks and re-dispatches whole commit-log segments from the newest one
older than both, up to 1 GiB. Once a second the dispatch side forces the consume queues (and
their ext files) and every dispatcher's ``persist``; then it records here, in a sealed JSON file
(``sealed_json``) in the store root, the last record that it had dispatched before forcing and
that the commit log had also flushed by then:

    +--------+--------------------------------------------------------------------------+
    | key    | value                                                                    |
    +--------+--------------------------------------------------------------------------+
    | format | 1                                                                        |
    | record | [phys_offset, size, store_timestamp] of that record: every record below  |
    |        | it has its units on disk, and its own bytes and those before it were     |
    |        | flushed                                                                  |
    +--------+--------------------------------------------------------------------------+

Recovery uses it only once the record is found where the file says, intact, with the same size
and store time (``recovery``); anything else (no file, a garbled one, a log rewritten since)
falls back to RocketMQ's rule. RocketMQ never reads this file.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from mqstore.storage.durable_file import sync_dir
from mqstore.storage.sealed_json import read_sealed, write_sealed

QUEUED_FILE = "mqstore.queued"
QUEUED_FORMAT = 1


class DispatchMark(NamedTuple):
    """A record the dispatch loop handed to every dispatcher: where it starts, its size and
    its store time (enough to recognise it again)."""

    phys_offset: int
    size: int
    store_timestamp: int

    @property
    def end(self) -> int:
        return self.phys_offset + self.size


def queued_path(root: str) -> str:
    return os.path.join(root, QUEUED_FILE)


def write_queued(root: str, mark: DispatchMark) -> None:
    write_sealed(queued_path(root), {"format": QUEUED_FORMAT, "record": list(mark)})


def read_queued(root: str) -> tuple[DispatchMark | None, str | None]:
    """The recorded mark, or None and why it cannot be used (None, None: no file)."""
    path = queued_path(root)
    body, problem = read_sealed(path)
    if body is None:
        return None, problem
    record = body.get("record")
    if (body.get("format") != QUEUED_FORMAT or not isinstance(record, list) or len(record) != 3
            or not all(type(v) is int for v in record)
            or record[0] < 0 or record[1] <= 0 or record[2] < 0):
        return None, f"{path} is malformed"
    return DispatchMark(*record), None


def remove_queued(root: str) -> None:
    """Forget the mark (durably): an open is about to rebuild derived files below it."""
    try:
        os.unlink(queued_path(root))
    except FileNotFoundError:
        return
    sync_dir(root)

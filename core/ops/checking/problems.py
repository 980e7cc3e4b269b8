"""What ``mqstore check`` reports: one problem per damaged place, with its file and offset."""

from __future__ import annotations

from dataclasses import asdict, dataclass

# Kinds, in the order a report lists them.
SEGMENT = "segment"  # a commit-log segment file missing, short or out of place
RECORD = "record"  # damaged commit-log bytes followed by intact records (bit rot)
TORN_TAIL = "torn-tail"  # damaged bytes at the end of the log, nothing intact after them
CONSUME_QUEUE = "consume-queue"  # units missing, or pointing at the wrong record
INDEX = "index"  # index files damaged, entries missing or pointing at the wrong record
ABORT = "abort"  # the abort marker of a writer that is gone: the last exit was not clean
KINDS = (SEGMENT, RECORD, TORN_TAIL, CONSUME_QUEUE, INDEX, ABORT)


@dataclass(frozen=True)
class Problem:
    kind: str
    file: str  # relative to the store root
    offset: int  # byte offset in ``file``
    detail: str
    position: int | None = None  # commit-log offset, or queue offset for a consume queue
    last: int | None = None  # with ``position``: the last commit-log offset of a run of records

    def to_dict(self) -> dict:
        return asdict(self)


def runs(values: list[int]) -> list[tuple[int, int]]:
    """Consecutive integers grouped as ``(first, last)`` (input ascending)."""
    out: list[tuple[int, int]] = []
    for v in values:
        if out and v == out[-1][1] + 1:
            out[-1] = (out[-1][0], v)
        else:
            out.append((v, v))
    return out

"""What the replication tests read of a store's commit log."""

from __future__ import annotations


def log_bytes(store, begin: int, end: int) -> bytes:
    """The commit log's bytes in ``[begin, end)``, across segment ends."""
    out = b""
    while begin < end:
        seg = store.internals.commit_log.segments.find(begin)
        stop = min(end, seg.end)
        out += bytes(seg.mm[begin - seg.start:stop - seg.start])
        begin = stop
    return out

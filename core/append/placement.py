"""Where a put's records land: the queues a batch names, its split into one block per
commit-log segment, each record's rank within its queue. Shared by the Appender's put kinds."""

from __future__ import annotations

import numpy as np


def queue_keys(topics: list[str], queue_ids: np.ndarray) -> tuple[list, np.ndarray]:
    """Distinct (topic, queue id) keys of a batch and each message's index into them."""
    if len(set(topics)) == 1:
        uniq, inverse = np.unique(queue_ids, return_inverse=True)
        topic = topics[0]
        return [(topic, int(q)) for q in uniq.tolist()], inverse.ravel()
    index: dict = {}
    inverse = np.fromiter((index.setdefault((t, q), len(index))
                           for t, q in zip(topics, queue_ids.tolist())),
                          dtype=np.int64, count=len(topics))
    return list(index), inverse


def blocks_of(ends: np.ndarray, limit: int) -> list[tuple[int, int]]:
    """Split a batch (record ends ``ends``) into runs of whole records of at most ``limit``
    bytes each: one run per commit-log segment it will occupy."""
    blocks = []
    start, n = 0, len(ends)
    while start < n:
        base = int(ends[start - 1]) if start else 0
        stop = int(np.searchsorted(ends, base + limit, side="right"))
        blocks.append((start, stop))
        start = stop
    return blocks


def rank_within_group(inverse: np.ndarray, groups: int) -> np.ndarray:
    """For each message, how many earlier messages of the batch share its queue."""
    order = np.argsort(inverse, kind="stable")
    counts = np.bincount(inverse, minlength=groups)
    starts = np.cumsum(counts) - counts
    rank = np.empty(len(inverse), dtype=np.int64)
    rank[order] = np.arange(len(inverse)) - np.repeat(starts, counts)
    return rank


class Refused(Exception):
    """A segment could not be reserved: the put answers CREATE_MAPPED_FILE_FAILED."""

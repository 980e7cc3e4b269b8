"""Planning a read: which (store, topic, queue) offset ranges it covers, cut into partitions.

Every offset is fixed here, when Spark plans the DataFrame: the end of a queue is its max
offset at that moment, so every action on the DataFrame reads the same rows, and a store being
written meanwhile is read up to a prefix it had already published (a read-only store only ever
sees whole records). Long ranges are split so each core gets work: a range's share of
``min_partitions`` by its length (Spark's Kafka source does the same), and no piece longer than
``max_messages_per_partition``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyspark.sql.datasource import InputPartition

from mqstore.spark.options import EARLIEST, LATEST, OffsetSpec, OptionError, ReadOptions
from mqstore.spark.pushdown import Pushed
from mqstore.spark.stores import open_read_only, queue_end
from mqstore.read.time_search import LOWER


@dataclass(frozen=True)
class QueueRange(InputPartition):
    """One Spark task: the messages of one queue of one store at offsets ``[start, end)``."""

    store: str
    topic: str
    queue_id: int
    start: int
    end: int


def store_queues(store, opts: ReadOptions, pushed: Pushed) -> list[tuple[str, int]]:
    """The (topic, queue id) pairs of ``store`` the options and pushed filters select."""
    topics = opts.topics if opts.topics is not None else store.topics()
    return [(t, q) for t in topics if pushed.allows_topic(t)
            for q in store.queue_ids(t)
            if (opts.queue_ids is None or q in opts.queue_ids) and pushed.allows_queue(q)]


def spec_offset(store, topic: str, queue_id: int, spec: OffsetSpec) -> int:
    """Where ``spec`` puts this queue, inside its current ``[min, max]``."""
    lo, hi = store.min_offset(topic, queue_id), queue_end(store, topic, queue_id)
    wanted = spec.per_queue.get(topic, {}).get(queue_id, spec.default)
    if wanted == EARLIEST:
        return lo
    if wanted == LATEST:
        return hi
    return min(max(wanted, lo), hi)


def queue_range(store, topic: str, queue_id: int, opts: ReadOptions,
                pushed: Pushed) -> tuple[int, int]:
    """[start, end) of one queue for a batch read; empty when start >= end."""
    queue_end(store, topic, queue_id)  # the time search below sees this process's view
    if opts.starting_timestamp is not None:
        start = store.offset_by_time(topic, queue_id, opts.starting_timestamp, LOWER)
    else:
        start = spec_offset(store, topic, queue_id, opts.starting)
    if opts.ending_timestamp is not None:
        end = store.offset_by_time(topic, queue_id, opts.ending_timestamp, LOWER)
    else:
        end = spec_offset(store, topic, queue_id, opts.ending)
    off_lo, off_hi = pushed.offset_range
    t_lo, t_hi = pushed.time_range
    if off_lo is not None:
        start = max(start, off_lo)
    if off_hi is not None:
        end = min(end, off_hi)
    if t_lo is not None:
        start = max(start, store.offset_by_time(topic, queue_id, t_lo, LOWER))
    if t_hi is not None:
        end = min(end, store.offset_by_time(topic, queue_id, t_hi, LOWER))
    return start, end


def plan_batch(roots: list[str], opts: ReadOptions, pushed: Pushed) -> list[QueueRange]:
    ranges = []
    seen_topics: set[str] = set()
    for root in roots:
        store = open_read_only(root, opts.config)
        seen_topics.update(store.topics())  # the options are checked against every store
        if not pushed.allows_store(root):
            continue
        for topic, q in store_queues(store, opts, pushed):
            start, end = queue_range(store, topic, q, opts, pushed)
            if start < end:
                ranges.append(QueueRange(root, topic, q, start, end))
    for name, spec in (("startingOffsets", opts.starting), ("endingOffsets", opts.ending)):
        for topic in spec.per_queue:
            if topic not in seen_topics or (opts.topics is not None and topic not in opts.topics):
                raise OptionError(f"option {name} names topic {topic!r}, which the read does "
                                  f"not cover (its stores hold {sorted(seen_topics)})")
    for topic in opts.topics or ():
        if topic not in seen_topics:
            raise OptionError(f"option topics names {topic!r}, which none of the stores "
                              f"{roots} holds (they hold {sorted(seen_topics)})")
    return split(ranges, opts.min_partitions, opts.max_messages_per_partition)


def split(ranges: list[QueueRange], min_partitions: int | None,
          max_per_partition: int) -> list[QueueRange]:
    """Cut long ranges: each gets its share of ``min_partitions`` (default: this machine's
    cores) by length, and no piece exceeds ``max_per_partition``; pieces differ by at most
    one message and cover each range exactly."""
    cores = min_partitions if min_partitions is not None else (os.cpu_count() or 1)
    total = sum(r.end - r.start for r in ranges)
    out = []
    for r in ranges:
        size = r.end - r.start
        parts = max(1, -(-size // max_per_partition), round(size * cores / total))
        for k in range(parts):
            lo, hi = r.start + size * k // parts, r.start + size * (k + 1) // parts
            if hi > lo:
                out.append(QueueRange(r.store, r.topic, r.queue_id, lo, hi))
    return out


__all__ = ["QueueRange", "plan_batch", "queue_range", "spec_offset", "split", "store_queues"]

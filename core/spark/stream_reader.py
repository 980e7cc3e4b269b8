"""``spark.readStream.format("mqstore")``: micro-batches of offset ranges per store, topic, queue.

An offset is JSON with string keys only (Spark stores offsets as JSON, and an int key would
come back as a string): ``{store root: {topic: {"queue id": next offset}}}``. Spark keeps
each batch's (start, end) in its checkpoint; a restart resumes from it and a replayed batch
plans the same ranges, so it reads the same rows. Queues and stores (a glob path) that appear
while the query runs join at offset 0, their earliest.

Runs in Spark's driver-side worker for the query (offsets, partitions) and in executor
workers (``read``); ``commit`` has nothing to release: the store keeps messages until its own
cleanup removes them.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceStreamReader
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable, ReadMaxRows, SupportsTriggerAvailableNow,
)

from mqstore.spark.arrow_rows import ReadSettings, read_range
from mqstore.spark.options import ReadOptions
from mqstore.spark.planning import QueueRange, spec_offset, split, store_queues
from mqstore.spark.pushdown import Pushed
from mqstore.spark.stores import open_read_only, queue_end, resolve_paths, resolve_quietly
from mqstore.read.time_search import LOWER


def _get(offsets: dict, root: str, topic: str, queue_id: int) -> int | None:
    return offsets.get(root, {}).get(topic, {}).get(str(queue_id))


def _flat(offsets: dict) -> dict[tuple[str, str, int], int]:
    return {(root, topic, int(q)): off for root, topics in offsets.items()
            for topic, queues in topics.items() for q, off in queues.items()}


def _nest(flat: dict[tuple[str, str, int], int]) -> dict:
    out: dict = {}
    for (root, topic, q), off in sorted(flat.items()):
        out.setdefault(root, {}).setdefault(topic, {})[str(q)] = int(off)
    return out


def admit(start: dict, latest: dict, max_rows: int | None) -> dict:
    """The end offsets of the next batch: every queue up to ``latest``, or, with a row limit,
    each queue's share of ``max_rows`` by its backlog (largest remainders first, ties by key),
    so the batch holds exactly ``min(max_rows, backlog)`` messages."""
    begin = _flat(start)
    backlog = {k: hi - begin.get(k, 0) for k, hi in _flat(latest).items()
               if hi > begin.get(k, 0)}
    end = dict(begin)
    total = sum(backlog.values())
    if max_rows is None or total <= max_rows:
        for k, n in backlog.items():
            end[k] = begin.get(k, 0) + n
        return _nest(end)
    shares = {k: n * max_rows // total for k, n in backlog.items()}
    left = max_rows - sum(shares.values())
    by_remainder = sorted(backlog, key=lambda k: (-(backlog[k] * max_rows % total), k))
    for k in by_remainder[:left]:
        shares[k] += 1
    for k, n in shares.items():
        if n:
            end[k] = begin.get(k, 0) + n
    return _nest(end)


class StreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    def __init__(self, opts: ReadOptions) -> None:
        resolve_paths(opts.paths)  # a bad path fails the query when it starts
        self.opts = opts
        self._target: dict | None = None

    def _latest(self) -> dict:
        flat = {}
        for root in resolve_quietly(self.opts.paths):
            store = open_read_only(root, self.opts.config)
            for topic, q in store_queues(store, self.opts, Pushed()):
                flat[(root, topic, q)] = queue_end(store, topic, q)
        return _nest(flat)

    def initialOffset(self) -> dict:
        opts = self.opts
        flat = {}
        for root in resolve_quietly(opts.paths):
            store = open_read_only(root, opts.config)
            for topic, q in store_queues(store, opts, Pushed()):
                queue_end(store, topic, q)
                if opts.starting_timestamp is not None:
                    off = store.offset_by_time(topic, q, opts.starting_timestamp, LOWER)
                else:
                    off = spec_offset(store, topic, q, opts.starting)
                flat[(root, topic, q)] = off
        return _nest(flat)

    def getDefaultReadLimit(self):
        n = self.opts.max_messages_per_trigger
        return ReadAllAvailable() if n is None else ReadMaxRows(n)

    def prepareForTriggerAvailableNow(self) -> None:
        # Trigger.AvailableNow reads what is there now and stops; later messages wait.
        self._target = self._latest()

    def latestOffset(self, start: dict, limit) -> dict:
        latest = self._target if self._target is not None else self._latest()
        return admit(start, latest, limit.max_rows if isinstance(limit, ReadMaxRows) else None)

    def reportLatestOffset(self) -> dict:
        return self._latest()

    def partitions(self, start: dict, end: dict) -> list:
        ranges = []
        for (root, topic, q), hi in sorted(_flat(end).items()):
            lo = _get(start, root, topic, q) or 0
            if hi > lo:
                ranges.append(QueueRange(root, topic, q, lo, hi))
        return split(ranges, self.opts.min_partitions, self.opts.max_messages_per_partition)

    def read(self, partition):
        opts = self.opts
        return read_range(partition, ReadSettings(
            config=opts.config, expression=opts.expression,
            expression_type=opts.expression_type, verify_checksums=opts.verify_checksums))

    def commit(self, end: dict) -> None:
        """Nothing to acknowledge: reads never consume; the store's cleanup decides."""


__all__ = ["StreamReader", "admit"]

"""The consume-queue builder: the core's dispatcher, always first, never disabled or replaced
(RocketMQ's CommitLogDispatcherBuildConsumeQueue). It appends one 20-byte unit per dispatched
record; recovery, flushing, cleanup and queue-offset assignment all read what it wrote.

Prepared and rolled-back transaction records get no unit. Units of one queue that arrive in
one batch are written with one copy per run of consecutive queue offsets. For topics with
registered subscriptions whose filter type precomputes (``contracts.PRECOMPUTES``, SQL92's)
each new unit points into the queue's extension, where the subscriptions' bloom bitmap is kept
(spec section 4). Built only where consume queues are written (the ``writer`` role). It records how far the units reach in
``last_store_timestamp``; ``Dispatchers`` hands that to the checkpoint.
"""

from __future__ import annotations

import logging

import numpy as np

from mqstore.format.cq_ext import BLOOM_BYTES, encode_unit, set_bits
from mqstore.format.cq_unit import CQ_DTYPE
from mqstore.format.properties import decode_properties
from mqstore.format.record import SYSFLAG_TX_MASK, TX_COMMIT, TX_NOT
from mqstore.errors import PluginError
from mqstore.plugin_api.contracts import PRECOMPUTES, capabilities_of

log = logging.getLogger(__name__)
# Batches this small are built record by record (``_dispatch_few``): the array path's fixed
# costs (some twenty numpy calls) outweigh its per-record savings below about this many.
FEW_RECORDS = 128


class ConsumeQueueBuilder:
    """Built by ``Dispatchers`` in the process that writes the consume queues."""

    NAME = "consume_queue"  # reserved: no plugin may register a dispatcher under it

    def __init__(self, view) -> None:
        self.store = view
        self.last_store_timestamp = 0  # store time of the last record given a unit

    def dispatch(self, batch) -> None:
        if len(batch) <= FEW_RECORDS:
            self._dispatch_few(batch)
            return
        tx = batch.sysflags & SYSFLAG_TX_MASK
        queued = np.flatnonzero((tx == TX_NOT) | (tx == TX_COMMIT))
        if not len(queued):
            return
        floors = self.store.topics.dispatch_floors()
        if floors:
            queued = _without_deleted(batch, queued, floors)
            if not len(queued):
                return
        subs = self.store.subscriptions
        subs.reload()
        topics = batch.topics
        rows, bounds = _queue_groups(topics, batch.queue_ids, queued)
        # Every unit of the batch in one array, grouped by queue (array passes for all
        # queues at once); each queue then takes its slice.
        units = np.empty(len(rows), dtype=CQ_DTYPE)
        units["phys_offset"] = batch.phys_offsets[rows]
        units["size"] = batch.sizes[rows]
        units["tags_code"] = batch.tags_codes[rows]
        qoffs = batch.queue_offsets[rows]
        cuts = np.flatnonzero(np.diff(qoffs) != 1) + 1  # runs of consecutive queue offsets
        subs_by_topic: dict = {}
        for lo, hi in bounds:
            first = int(rows[lo])
            topic, queue_id = topics[first], int(batch.queue_ids[first])
            compiled = subs_by_topic.get(topic)
            if compiled is None:
                compiled = subs_by_topic[topic] = _compiled(self.store, subs, topic)
            cq = self.store.consume_queue(topic, queue_id, create=True)
            group = units[lo:hi]
            if compiled:
                self._attach_bitmaps(batch, rows[lo:hi].tolist(), group, cq, topic, queue_id,
                                     compiled)
            starts = [lo, *cuts[(cuts > lo) & (cuts < hi)].tolist()]
            for a, b in zip(starts, starts[1:] + [hi]):
                cq.put_units(int(qoffs[a]), units[a:b])
        self.last_store_timestamp = int(batch.store_timestamps[queued[-1]])

    def _dispatch_few(self, batch) -> None:
        """``dispatch`` record by record, for the few records a pass under a trickle of puts
        holds: the same units, queues, order and runs, with lists and struct instead of array
        passes (each costs microseconds whatever its length). A topic with bitmaps to attach
        takes the array path for its queues."""
        sysflags = batch.sysflags.tolist()
        queued = [i for i, flags in enumerate(sysflags)
                  if (flags & SYSFLAG_TX_MASK) in (TX_NOT, TX_COMMIT)]
        if not queued:
            return
        floors = self.store.topics.dispatch_floors()
        if floors:
            queued = _without_deleted(batch, np.array(queued, dtype=np.int64), floors).tolist()
            if not queued:
                return
        subs = self.store.subscriptions
        subs.reload()
        topics, queue_ids = batch.topics, batch.queue_ids.tolist()
        groups: dict[tuple[str, int], list[int]] = {}  # in the order of their first record
        for i in queued:
            groups.setdefault((topics[i], queue_ids[i]), []).append(i)
        phys, sizes = batch.phys_offsets.tolist(), batch.sizes.tolist()
        codes, qoffs = batch.tags_codes.tolist(), batch.queue_offsets.tolist()
        subs_by_topic: dict = {}
        for (topic, queue_id), rows in groups.items():
            compiled = subs_by_topic.get(topic)
            if compiled is None:
                compiled = subs_by_topic[topic] = _compiled(self.store, subs, topic)
            cq = self.store.consume_queue(topic, queue_id, create=True)
            if compiled:
                self._put_with_bitmaps(batch, rows, cq, topic, queue_id, compiled)
                continue
            first = 0
            for j in range(1, len(rows) + 1):  # runs of consecutive queue offsets
                if j == len(rows) or qoffs[rows[j]] != qoffs[rows[j - 1]] + 1:
                    cq.put_few(qoffs[rows[first]], [(phys[i], sizes[i], codes[i])
                                                     for i in rows[first:j]])
                    first = j
        self.last_store_timestamp = int(batch.store_timestamps[queued[-1]])

    def _put_with_bitmaps(self, batch, rows: list[int], cq, topic, queue_id, compiled) -> None:
        """One queue's records of ``_dispatch_few`` as ``dispatch`` writes them when its topic
        has subscriptions to precompute."""
        picked = np.array(rows, dtype=np.int64)
        units = np.empty(len(rows), dtype=CQ_DTYPE)
        units["phys_offset"] = batch.phys_offsets[picked]
        units["size"] = batch.sizes[picked]
        units["tags_code"] = batch.tags_codes[picked]
        self._attach_bitmaps(batch, rows, units, cq, topic, queue_id, compiled)
        qoffs = batch.queue_offsets[picked]
        starts = [0, *(np.flatnonzero(np.diff(qoffs) != 1) + 1).tolist()]
        for a, b in zip(starts, starts[1:] + [len(rows)]):
            cq.put_units(int(qoffs[a]), units[a:b])

    def _attach_bitmaps(self, batch, rows, units, cq, topic, queue_id, compiled) -> None:
        """Evaluate the topic's SQL92 subscriptions once per new message and point its unit
        at an extension unit holding the real tag code, store time and bloom bitmap."""
        ext = self.store.consume_queue_ext(topic, queue_id, create=True)
        fresh = units["phys_offset"].astype(np.int64) + units["size"] > cq.max_phys
        for j in np.flatnonzero(fresh).tolist():
            i = rows[j]
            props = decode_properties(batch.properties[i].decode("utf-8", errors="replace"))
            bitmap = bytearray(BLOOM_BYTES)
            for expression, positions in compiled:
                if expression.matches_properties(props):
                    set_bits(bitmap, positions)
            units["tags_code"][j] = ext.append(encode_unit(
                int(batch.tags_codes[i]), int(batch.store_timestamps[i]), bytes(bitmap)))

    def close(self) -> None:
        pass


def _without_deleted(batch, rows: np.ndarray, floors: dict[str, int]) -> np.ndarray:
    """``rows`` less the records of deleted topics stored before they were deleted
    (``storage.deleted_topics``): dispatched again, they must not bring the topic back."""
    if int(batch.phys_offsets[rows[0]]) >= max(floors.values()):
        return rows  # records in log order, all stored after every deletion: the usual case
    topics = batch.topics
    if not any(t in floors for t in dict.fromkeys(topics[i] for i in rows.tolist())):
        return rows
    floor = np.fromiter((floors.get(topics[i], -1) for i in rows.tolist()), dtype=np.int64,
                        count=len(rows))
    return rows[batch.phys_offsets[rows] >= floor]


def _queue_groups(topics, queue_ids: np.ndarray, rows: np.ndarray
                  ) -> tuple[np.ndarray, list[tuple[int, int]]]:
    """``rows`` ordered by (topic, queue id), each group's rows ascending, and each group's
    ``[lo, hi)`` in that order, groups in the order of their first row. Array passes, with one
    C-level map for batches of many topics."""
    names = dict.fromkeys(topics)
    key = queue_ids[rows].astype(np.int64) & 0xFFFFFFFF
    if len(names) > 1:
        ids = {t: i for i, t in enumerate(names)}
        topic_ids = np.fromiter(map(ids.__getitem__, topics), dtype=np.int64, count=len(topics))
        key |= topic_ids[rows] << 32
    order = np.argsort(key, kind="stable")
    ordered = key[order]
    cuts = (np.flatnonzero(ordered[1:] != ordered[:-1]) + 1).tolist()
    bounds = list(zip([0, *cuts], [*cuts, len(order)]))
    rows = rows[order]
    bounds.sort(key=lambda b: int(rows[b[0]]))
    return rows, bounds


def _compiled(store, subs, topic: str) -> list:
    """The topic's registered subscriptions, compiled; one that no longer compiles (stored
    before a limit existed, or edited by hand) gets no bitmap: pulls check it exactly."""
    out = []
    for entry in subs.for_topic(topic):
        try:
            flt = store.compile_filter(entry["expression"], entry["type"])
            if PRECOMPUTES in capabilities_of(flt):
                out.append((flt, subs.positions(entry)))
        except (ValueError, PluginError) as exc:
            log.warning("subscription %s of %s gets no filter bitmap: %s",
                        entry.get("group"), topic, exc)
    return out

"""Consume-queue builder: the dispatcher that appends 20-byte units for each dispatched record.

Prepared and rolled-back transaction records get no unit. Units of one queue that arrive in
one batch are written with one copy per run of consecutive queue offsets. For topics with
registered subscriptions whose filter type precomputes (``contracts.PRECOMPUTES``, SQL92's)
each new unit points into the queue's extension, where the subscriptions' bloom bitmap is kept
(spec section 4). Built only where consume queues are written (the ``writer`` role).
"""

from __future__ import annotations

import logging

import numpy as np

from mqstore.format.cq_ext import BLOOM_BYTES, encode_unit, set_bits
from mqstore.format.cq_unit import CQ_DTYPE
from mqstore.format.properties import decode_properties
from mqstore.format.record import SYSFLAG_TX_MASK, TX_COMMIT, TX_NOT
from mqstore.contracts import PRECOMPUTES, WRITER, capabilities_of
from mqstore.errors import PluginError
from mqstore.hookspecs import hookimpl

log = logging.getLogger("mqstore.dispatch")


class ConsumeQueueBuilder:
    def __init__(self, store) -> None:
        self.store = store

    @classmethod
    def build(cls, view, role):
        return cls(view) if role == WRITER else None

    def dispatch(self, batch) -> None:
        tx = batch.sysflags & SYSFLAG_TX_MASK
        queued = np.flatnonzero((tx == TX_NOT) | (tx == TX_COMMIT))
        if not len(queued):
            return
        groups: dict[tuple[str, int], list[int]] = {}
        topics = batch.topics
        qids = batch.queue_ids.tolist()
        for i in queued.tolist():
            key = (topics[i], qids[i])
            group = groups.get(key)
            if group is None:
                groups[key] = [i]
            else:
                group.append(i)
        subs = self.store.subscriptions
        subs.reload()
        subs_by_topic = {t: _compiled(self.store, subs, t) for t in {k[0] for k in groups}}
        for (topic, queue_id), rows in groups.items():
            idx = np.asarray(rows)
            qoffs = batch.queue_offsets[idx]
            units = np.empty(len(idx), dtype=CQ_DTYPE)
            units["phys_offset"] = batch.phys_offsets[idx]
            units["size"] = batch.sizes[idx]
            units["tags_code"] = batch.tags_codes[idx]
            cq = self.store.consume_queue(topic, queue_id, create=True)
            if subs_by_topic.get(topic):
                self._attach_bitmaps(batch, rows, units, cq, topic, queue_id, subs_by_topic[topic])
            breaks = np.flatnonzero(np.diff(qoffs) != 1) + 1
            for run in np.split(np.arange(len(idx)), breaks):
                cq.put_units(int(qoffs[run[0]]), units[run])
        self.store.checkpoint.logics_msg_timestamp = int(batch.store_timestamps[queued[-1]])

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


@hookimpl(trylast=True)
def register_dispatchers(registry):
    registry.add("consume_queue", ConsumeQueueBuilder.build)

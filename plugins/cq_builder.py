"""Consume-queue builder: the dispatcher that appends 20-byte units for each dispatched record.

Prepared and rolled-back transaction records get no unit. Units of one queue that arrive in
one batch are written with one copy per run of consecutive queue offsets.
"""

from __future__ import annotations

import numpy as np

from mqstore.format.cq_unit import CQ_DTYPE
from mqstore.format.record import SYSFLAG_TX_MASK, TX_COMMIT, TX_NOT
from mqstore.hookspecs import hookimpl


class ConsumeQueueBuilder:
    def __init__(self, store) -> None:
        self.store = store

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
        for (topic, queue_id), rows in groups.items():
            idx = np.asarray(rows)
            qoffs = batch.queue_offsets[idx]
            units = np.empty(len(idx), dtype=CQ_DTYPE)
            units["phys_offset"] = batch.phys_offsets[idx]
            units["size"] = batch.sizes[idx]
            units["tags_code"] = batch.tags_codes[idx]
            cq = self.store.consume_queue(topic, queue_id, create=True)
            breaks = np.flatnonzero(np.diff(qoffs) != 1) + 1
            for run in np.split(np.arange(len(idx)), breaks):
                cq.put_units(int(qoffs[run[0]]), units[run])
        self.store.checkpoint.logics_msg_timestamp = int(batch.store_timestamps[queued[-1]])

    def close(self) -> None:
        pass


@hookimpl(trylast=True)
def register_dispatchers(registry):
    registry.add("consume_queue", ConsumeQueueBuilder)

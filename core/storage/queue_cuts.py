"""Cutting a consume queue back to what the commit log holds: after recovery cut the log or
a dispatch worker restarted behind it (``truncate_to_phys``), and before a rejoining
master's recovery (``cut_stored``). A mixin of ``storage.consume_queue.ConsumeQueue``, whose unit
arrays and segments it works on."""

from __future__ import annotations

import numpy as np

from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.storage.mapped_budget import maps


class QueueCuts:
    @maps
    def truncate_to_phys(self, phys: int) -> int:
        """Drop every unit whose record does not end at or below ``phys`` (one that straddles
        it names a record the log no longer holds whole); returns how many were dropped."""
        dropped = 0
        for seg in reversed(self.segments.segments):
            n = seg.wrote // CQ_UNIT_SIZE
            units = self.units_of(seg)[:n]
            ends = units["phys_offset"].astype(np.int64) + units["size"].astype(np.int64)
            bad = np.flatnonzero((ends > phys) & (units["size"] != FILLER_SIZE))
            if not len(bad):
                break
            cut = int(bad[0])
            dropped += n - cut
            if cut == 0 and seg is not self.segments.segments[0]:
                self._arrays.pop(seg.start, None)
                self.segments.drop_last()
                continue
            self._zero_tail(seg, cut * CQ_UNIT_SIZE)
            seg.wrote = seg.flushed = cut * CQ_UNIT_SIZE
            break
        self._prune_arrays()
        if dropped:
            self._refresh_max_phys()
        return dropped

    @maps
    def cut_stored(self, phys: int) -> None:
        """Before recovery (loaded files count as written whole): zero and drop the first unit
        naming a record not ending by ``phys`` and every unit after it (``lifecycle.rejoin``)."""
        for seg in self.segments.segments:
            units = self.stored_units(seg)
            ends = units["phys_offset"].astype(np.int64) + units["size"].astype(np.int64)
            bad = np.flatnonzero((units["size"] != 0) & (units["size"] != FILLER_SIZE)
                                 & (ends > phys))
            if len(bad):
                self._zero_tail(seg, int(bad[0]) * CQ_UNIT_SIZE)
                self.segments.truncate_to(seg.start + int(bad[0]) * CQ_UNIT_SIZE)
                self._prune_arrays()
                self._refresh_max_phys()
                return


__all__ = ["QueueCuts"]

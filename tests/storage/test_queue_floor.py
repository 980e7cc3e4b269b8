"""A consume queue read for the offset floors (``storage.queue_floor``): where it ended with only
the records below a commit-log offset, and which of its offsets lead to no message. Real queue
files, units written as dispatch writes them (fillers for offsets whose records are gone)."""

from __future__ import annotations

import numpy as np

from mqstore.format.cq_unit import CQ_DTYPE, CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.storage.queue_floor import end_below_phys, offsets_without_message

FILE_UNITS = 4  # small files: the units cross file boundaries


def _units(phys: list[int], size: int = 100) -> np.ndarray:
    units = np.zeros(len(phys), dtype=CQ_DTYPE)
    units["phys_offset"], units["size"] = phys, size
    return units


def _queue(tmp_path) -> ConsumeQueue:
    cq = ConsumeQueue(str(tmp_path), "T", 0, FILE_UNITS * CQ_UNIT_SIZE)
    cq.load()
    return cq


def test_offsets_whose_records_are_gone_are_fillers_and_are_reported(tmp_path):
    cq = _queue(tmp_path)
    assert cq.put_units(0, _units([0, 100, 200])) == 3
    assert cq.put_units(6, _units([600, 700])) == 2  # offsets 3..5: records gone
    assert cq.max_offset == 8 and len(cq.segments.segments) == 2
    units = np.concatenate([cq.units_of(s)[:s.wrote // CQ_UNIT_SIZE] for s in cq.segments.segments])
    assert (units["size"] == FILLER_SIZE).tolist() == [False] * 3 + [True] * 3 + [False] * 2
    assert offsets_without_message(cq, 0) == [(3, 5)]
    assert offsets_without_message(cq, 5) == [(5, 5)]
    assert offsets_without_message(cq, 6) == []
    cq.close()


def test_a_queue_that_starts_past_offset_zero(tmp_path):
    cq = _queue(tmp_path)
    cq.put_units(5, _units([500, 600]))  # a new queue whose first offsets went with cleanup
    assert (cq.min_offset, cq.max_offset) == (5, 7)
    assert offsets_without_message(cq, 0) == [(0, 4)]  # before its first file, and fillers
    assert offsets_without_message(cq, 0, after_first=True) == []  # from its first message on
    cq.close()


def test_the_end_a_queue_had_with_only_the_records_below_an_offset(tmp_path):
    cq = _queue(tmp_path)
    cq.put_units(0, _units([0, 100, 200]))
    cq.put_units(6, _units([600, 700]))
    assert end_below_phys(cq, 10_000) == cq.max_offset == 8  # everything lies below
    assert end_below_phys(cq, 700) == 7  # the record at 600 ends at 700; 700's does not
    assert end_below_phys(cq, 650) == 6  # fillers count as below: their records are gone
    assert end_below_phys(cq, 50) == 6  # ... wherever the limit lies
    cq.close()


def test_the_end_below_an_offset_in_a_queue_without_fillers(tmp_path):
    cq = _queue(tmp_path)
    cq.put_units(0, _units([0, 100, 200, 300, 400]))
    assert end_below_phys(cq, 250) == 2  # the record at 200 ends at 300
    assert end_below_phys(cq, 400) == 4  # in the first file, the second holding none below
    assert end_below_phys(cq, 50) == 0
    cq.close()

"""``mqstore check``'s parts (``ops.checking``), on real store files: the log walk's columns and
damage, the consume queues' and the index's expectations against what is on disk, and the
report a check of a closed store gives."""

from __future__ import annotations

import shutil
import struct

import pytest

from mqstore import Message
from mqstore.errors import StoreLockedError
from mqstore.ops.checking.checker import check_store
from mqstore.ops.checking.index import expected_entries
from mqstore.ops.checking.log_walk import scan_log
from mqstore.ops.checking.problems import (
    CONSUME_QUEUE, INDEX, KINDS, RECORD, TORN_TAIL, runs,
)
from mqstore.ops.checking.queues import check_queues, expected_units
from mqstore.ops.store_files import open_files

pytestmark = pytest.mark.loops("thread")
FIRST = f"{0:020d}"


@pytest.fixture
def closed(make_store, tmp_path):
    """A closed copy of a store: 8 keyed messages over T/0 and T/1; the put results and the
    store's config."""
    store = make_store()
    results = [store.put(Message("T", b"m%d" % i, queue_id=i % 2, keys=[f"k{i}"]))
               for i in range(8)]
    store.wait_dispatched()
    config = store.config
    store.close()
    root = tmp_path / "copy"
    shutil.copytree(store.root, root)
    return root, results, config


def test_runs_groups_consecutive_values():
    assert runs([]) == []
    assert runs([3, 4, 5, 9, 11, 12]) == [(3, 5), (9, 9), (11, 12)]
    assert KINDS.index(RECORD) < KINDS.index(CONSUME_QUEUE) < KINDS.index(INDEX)


def test_the_walk_gives_every_records_columns(closed):
    root, results, config = closed
    with open_files(str(root), config) as files:
        scan = scan_log(files.commit_log, str(root))
    assert scan.records == 8 and scan.problems == [] and scan.crc_bad == 0
    assert scan.phys.tolist() == [r.phys_offset for r in results]
    assert scan.queue_ids.tolist() == [i % 2 for i in range(8)]
    assert scan.queue_offsets.tolist() == [i // 2 for i in range(8)]
    assert scan.end == results[-1].phys_offset + results[-1].size
    offsets, phys, sizes = expected_units(scan)[("T", 1)]
    assert (offsets.tolist(), phys.tolist(), sizes.tolist()) == (
        [0, 1, 2, 3], [r.phys_offset for r in results[1::2]], [r.size for r in results[1::2]])
    # a deleted topic's records stored before the deletion have no unit
    assert expected_units(scan, {"T": results[4].phys_offset})[("T", 0)][0].tolist() == [2, 3]


def test_bit_rot_is_a_record_problem_and_a_torn_end_a_torn_tail(closed):
    root, results, config = closed
    segment = root / "commitlog" / FIRST
    with open(segment, "r+b") as f:
        f.seek(results[2].phys_offset + 4)
        f.write(b"\0\0\0\0")  # record 2's magic: intact records follow
        f.seek(results[7].phys_offset + 4)
        f.write(b"\0\0\0\0")  # the last record's: nothing intact after it
    with open_files(str(root), config) as files:
        scan = scan_log(files.commit_log, str(root))
    kinds = [(p.kind, p.offset) for p in scan.problems]
    assert kinds == [(RECORD, results[2].phys_offset), (TORN_TAIL, results[7].phys_offset)]
    assert scan.records == 6 and scan.in_damage(results[2].phys_offset)
    assert not scan.in_damage(results[3].phys_offset)


def test_a_unit_naming_another_record_is_a_consume_queue_problem(closed):
    root, results, config = closed
    unit_file = root / "consumequeue" / "T" / "0" / FIRST
    with open(unit_file, "r+b") as f:
        f.seek(1 * 20)  # T/0 offset 1 is record 2
        f.write(struct.pack(">q", results[4].phys_offset))
    with open_files(str(root), config) as files:
        scan = scan_log(files.commit_log, str(root))
        problems = check_queues(scan, files.queues, str(root), files.cq_file_bytes, {})
    assert [(p.kind, p.file, p.offset, p.position) for p in problems] == [
        (CONSUME_QUEUE, f"consumequeue/T/0/{FIRST}", 20, 1)]


def test_the_index_must_hold_each_records_keys(closed):
    root, results, config = closed
    with open_files(str(root), config) as files:
        scan = scan_log(files.commit_log, str(root))
        kind = files.hash_kind
    entries = expected_entries(scan, kind)
    # one KEYS token per record (these puts set no UNIQ_KEY)
    assert {phys for _h, phys in entries} == {r.phys_offset for r in results}
    report = check_store(str(root), config)
    assert report.clean and report.index_checked and report.records == 8


def test_a_check_refuses_a_store_a_live_writer_holds(make_store):
    store = make_store()
    with pytest.raises(StoreLockedError, match="check it once that writer has closed it"):
        check_store(store.root, store.config)

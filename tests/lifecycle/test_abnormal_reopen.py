"""An abnormal reopen walks and re-dispatches only what ``mqstore.queued`` does not cover.

The dispatch side records, once a second after forcing the consume queues and every
dispatcher's files, the last record below which all of them are on disk
(``storage.queue_progress``); the writer runs its loops on the test's ``ManualScheduler``, so
the test says when that happens. After a crash, recovery starts at that record instead of at a
commit-log segment's start, once it finds the record where the file says. A real writer process
is killed (SIGKILL to its group) in the default configuration (worker processes); power loss is
played by zeroing what was never forced. Whatever is wrong with the file, the segment rule
stands and nothing acknowledged is lost.
"""

from __future__ import annotations

import shutil
import signal
import struct
from pathlib import Path

import numpy as np
import pytest

from mqstore import MessageStore, load_config
from mqstore.format.cq_unit import CQ_UNIT_SIZE
from mqstore.format.record import BLANK_MAGIC
from mqstore.storage.queue_manifest import read_manifest
from mqstore.storage.queue_progress import (
    QUEUED_FILE, DispatchMark, read_queued, write_queued,
)
from mqstore.testing import ManualScheduler
from mqstore.testing.faults import TOPIC, FaultWriter, audit, small_store_overrides

OVERRIDES = small_store_overrides()
SEG = OVERRIDES["commit_log"]["segment_bytes"]
CQ_FILE_BYTES = OVERRIDES["consume_queue"]["file_units"] * CQ_UNIT_SIZE


def _record_mark(root: Path, scheduler: ManualScheduler) -> DispatchMark:
    """Have the writer's loops record a mark now: a pass over the derived files takes the last
    record dispatched, a flush pass makes it durable in the commit log, and the next pass over
    the derived files writes it down. Returns the mark written."""
    scheduler.run("derived_flush")
    scheduler.run("flush")
    scheduler.run("derived_flush")
    mark, problem = read_queued(str(root))
    assert problem is None and mark is not None, problem
    return mark


def _killed_mid_stream(root: Path, overrides: dict, seed: int) -> tuple[FaultWriter, DispatchMark]:
    """A writer putting one message every millisecond, killed well after a mark was written,
    so records lie past the mark as well as before it."""
    scheduler = ManualScheduler()
    writer = FaultWriter(str(root), overrides, seed=seed, count=1 << 20, pace_ms=1,
                         then="wait", scheduler=scheduler).start()
    try:
        assert writer.read_until(acks=400)
        first = _record_mark(root, scheduler)
        assert writer.read_until(acks=len(writer.acks) + 300)
        assert _record_mark(root, scheduler).phys_offset > first.phys_offset
        assert writer.read_until(acks=len(writer.acks) + 200)
    finally:
        writer.kill(signal.SIGKILL)
    assert (root / "abort").exists()
    mark, _problem = read_queued(str(root))  # the last one written before the kill
    return writer, mark


def _walked(writer: FaultWriter, report) -> list:
    return [a for a in writer.acks if a.phys_offset >= report.scan_from]


def _records_between(root: Path, begin: int, end: int) -> int:
    """Records in ``[begin, end)`` of the commit log, walked by their size fields (blank
    records that close a segment are not records)."""
    count, pos = 0, begin
    while pos < end:
        with open(root / "commitlog" / f"{pos - pos % SEG:020d}", "rb") as f:
            f.seek(pos % SEG)
            size, magic = struct.unpack(">ii", f.read(8))
        if magic == BLANK_MAGIC:
            pos += SEG - pos % SEG
            continue
        assert size > 0, f"no record at commit-log offset {pos}"
        count += 1
        pos += size
    return count


def _assert_nothing_lost(store, seed: int, writer: FaultWriter) -> None:
    store.wait_dispatched(30)
    result = audit(store, seed, writer.acks)
    assert (result.lost, result.wrong) == ([], []), str(result)
    for q in range(4):
        acked = [a.queue_offset for a in writer.acks if a.queue_id == q]
        assert store.max_offset(TOPIC, q) >= (max(acked) + 1 if acked else 0)


@pytest.mark.parametrize("loops", ["process", "thread"])
def test_idle_store_killed_walks_one_record(tmp_path, watchdog, loops):
    """Killed with everything flushed and dispatched: the walk checks the last record only."""
    root = tmp_path / "store"
    overrides = small_store_overrides(dispatch={"worker": loops})
    scheduler = ManualScheduler()
    writer = FaultWriter(str(root), overrides, seed=5, count=2500, then="wait",
                         scheduler=scheduler).start()
    try:
        assert writer.read_until()
        last = max(writer.acks, key=lambda a: a.phys_offset)
        mark = _record_mark(root, scheduler)
        assert mark.phys_offset == last.phys_offset
    finally:
        writer.kill(signal.SIGKILL)
    assert mark.end > 8 * SEG  # many segments: the segment rule would walk one at least

    with MessageStore.open(root, load_config(overrides=overrides)) as store:
        report = store.recovery_report
        assert report.abnormal and report.trusted_end == -1
        assert report.scan_from == report.redispatch_from == last.phys_offset
        assert report.records_checked == 1
        assert report.commit_log_end == mark.end
        assert report.redispatch_bytes == mark.size
        assert report.clean, report
        assert any(n.startswith(f"{QUEUED_FILE}:") for n in report.notes), report.notes
        _assert_nothing_lost(store, 5, writer)


def test_writer_killed_mid_stream_walks_from_the_mark(tmp_path, watchdog):
    root = tmp_path / "store"
    writer, mark = _killed_mid_stream(root, OVERRIDES, seed=6)
    with MessageStore.open(root, load_config(overrides=OVERRIDES)) as store:
        report = store.recovery_report
        assert report.abnormal
        assert report.scan_from == report.redispatch_from == mark.phys_offset
        # Exactly the records from the mark to the end, counted from the files themselves:
        # what the writer managed to report before the kill does not enter the count (puts
        # refused with a flush timeout under load store their records too, and the kill may
        # cut a put short between its bytes and its answer).
        assert report.records_checked == _records_between(root, mark.phys_offset,
                                                          report.commit_log_end)
        assert report.records_checked < _records_between(root, 0, report.commit_log_end) // 2
        assert len(_walked(writer, report)) <= report.records_checked
        assert report.redispatch_bytes == report.commit_log_end - mark.phys_offset
        _assert_nothing_lost(store, 6, writer)


def _zero_queue_units_from(root: Path, phys: int) -> int:
    """Power loss of the consume queues' tails: every unit naming a record at or past ``phys``
    reads as zeros again, and files holding nothing else lose their names. Returns the units
    zeroed."""
    zeroed = 0
    for qdir in sorted((root / "consumequeue" / TOPIC).iterdir()):
        for path in sorted(qdir.iterdir()):
            data = bytearray(path.read_bytes())
            units = np.frombuffer(bytes(data), dtype=">i8,>i4,>i8")
            real = np.flatnonzero(units["f1"] > 0)
            late = real[units["f0"][real] >= phys]
            if not len(late):
                continue
            if late[0] == 0:
                path.unlink()
                zeroed += len(late)
                continue
            data[int(late[0]) * CQ_UNIT_SIZE:] = bytes(len(data) - int(late[0]) * CQ_UNIT_SIZE)
            path.write_bytes(bytes(data))
            zeroed += len(late)
    return zeroed


def test_power_loss_of_the_unforced_queue_tails_loses_nothing(tmp_path, watchdog):
    """Sync flush: every acknowledged record is on disk, the queue units only up to the mark.
    Everything else the kill left in the page cache is taken away."""
    root = tmp_path / "store"
    overrides = small_store_overrides(flush={"policy": "sync"})
    writer, mark = _killed_mid_stream(root, overrides, seed=7)
    assert _zero_queue_units_from(root, mark.end) > 0
    last = max(writer.acks, key=lambda a: a.phys_offset)
    # Unacknowledged bytes past the mark (the put the kill interrupted; puts answered with a
    # flush timeout under load) may not have reached the disk; the mark's record did.
    end = max(last.phys_offset + _record_size(root, last.phys_offset), mark.end)
    _zero_commit_log_from(root, end)

    with MessageStore.open(root, load_config(overrides=overrides)) as store:
        report = store.recovery_report
        assert report.scan_from == mark.phys_offset
        assert report.commit_log_end == end
        _assert_nothing_lost(store, 7, writer)


def _record_size(root: Path, phys: int) -> int:
    with open(root / "commitlog" / f"{phys - phys % SEG:020d}", "rb") as f:
        f.seek(phys % SEG)
        return int.from_bytes(f.read(4), "big")


def _zero_commit_log_from(root: Path, end: int) -> None:
    for path in sorted((root / "commitlog").iterdir()):
        start = int(path.name)
        if start >= end:
            path.write_bytes(bytes(path.stat().st_size))
        elif start + SEG > end:
            data = bytearray(path.read_bytes())
            data[end - start:] = bytes(len(data) - (end - start))
            path.write_bytes(bytes(data))


def _garble(root: Path) -> None:
    data = bytearray((root / QUEUED_FILE).read_bytes())
    data[len(data) // 2] ^= 0x01
    (root / QUEUED_FILE).write_bytes(bytes(data))


def _other_time(root: Path) -> None:
    mark, _ = read_queued(str(root))
    write_queued(str(root), mark._replace(store_timestamp=mark.store_timestamp + 1))


def _other_size(root: Path) -> None:
    mark, _ = read_queued(str(root))
    write_queued(str(root), mark._replace(size=mark.size + 4))


def _inside_a_record(root: Path) -> None:
    mark, _ = read_queued(str(root))
    write_queued(str(root), mark._replace(phys_offset=mark.phys_offset + 8))


def _past_the_end(root: Path) -> None:
    mark, _ = read_queued(str(root))
    write_queued(str(root), mark._replace(phys_offset=mark.phys_offset + 100 * SEG))


FALLBACKS = {
    "no file": (lambda root: (root / QUEUED_FILE).unlink(), None),
    "garbled": (_garble, "garbled"),
    "another store time": (_other_time, "does not hold there"),
    "another size": (_other_size, "does not hold there"),
    "inside a record": (_inside_a_record, "does not hold there"),
    "past the end": (_past_the_end, "does not hold there"),
}


@pytest.mark.slow
def test_a_mark_that_does_not_match_the_log_falls_back_to_the_segment_rule(tmp_path, watchdog):
    root = tmp_path / "store"
    writer, mark = _killed_mid_stream(root, OVERRIDES, seed=8)
    copies = {}
    for case in FALLBACKS:
        copies[case] = tmp_path / case.replace(" ", "_")
        shutil.copytree(root, copies[case])
    config = load_config(overrides=OVERRIDES)
    for case, (spoil, why) in FALLBACKS.items():
        spoil(copies[case])
        with MessageStore.open(copies[case], config) as store:
            report = store.recovery_report
            assert report.abnormal, case
            assert report.scan_from % SEG == 0 and report.scan_from <= mark.phys_offset, case
            assert report.records_checked >= len(_walked(writer, report)), case
            if why is not None:
                assert any(why in n for n in report.notes), (case, report.notes)
            _assert_nothing_lost(store, 8, writer)


def test_a_deleted_queue_is_rebuilt_from_its_first_record_below_the_mark(tmp_path, watchdog):
    root = tmp_path / "store"
    writer, mark = _killed_mid_stream(root, OVERRIDES, seed=9)
    known, problem = read_manifest(str(root))
    assert problem is None
    first_phys, _end = known[(TOPIC, 2)]
    assert first_phys < mark.phys_offset
    shutil.rmtree(root / "consumequeue" / TOPIC / "2")

    with MessageStore.open(root, load_config(overrides=OVERRIDES)) as store:
        report = store.recovery_report
        assert f"{TOPIC}/2" in report.queues_rebuilt
        assert report.scan_from == report.redispatch_from == first_phys
        _assert_nothing_lost(store, 9, writer)

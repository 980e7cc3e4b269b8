"""A small record whose sysflag host bits were flipped: its header no longer fits the layout.

The IPv6 born and store host bits (0x10, 0x20) each widen a record's header by 12 bytes. Flip
one in a record shorter than the wider header (a 97-byte record; an IPv6 host needs at least
103, both 115) and the bytes no longer hold the header the sysflag promises. Every reader
passes over that record and reports it, as for any other damage: ``get`` (its plain paths and
the general walk), ``read`` (walked and column-wise), a group consumer's poll, pop,
``message_at``, ``mqstore inspect`` and ``mqstore check``; recovery quarantines it when it
walks it (a clean open walks no record).
"""

from __future__ import annotations

import json
import mmap
import os
import shutil
import struct
from pathlib import Path

import pytest

from cli_support import mqstore, mqstore_json
from mqstore import GetStatus, Message
from mqstore.errors import CorruptRecordError

POS_SYSFLAG_LOW_BYTE = 36 + 3  # the big-endian sysflag's low byte holds both host bits
BODY = b"small"  # a 97-byte record: 91 + 5 bytes of body + a 1-byte topic
RECORD_BYTES = 97
HOST_BITS = pytest.mark.parametrize("bit, header_needs", [(0x10, 103), (0x20, 103),
                                                          (0x30, 115)])


def segment_of(store_dir) -> Path:
    return Path(store_dir) / "commitlog" / f"{0:020d}"


def flip(store_dir, phys: int, bit: int) -> None:
    with open(segment_of(store_dir), "r+b") as f, mmap.mmap(f.fileno(), 0) as mm:
        mm[phys + POS_SYSFLAG_LOW_BYTE] ^= bit


def damaged_store(make_store, store_dir, bit: int, count: int = 3, damaged: int = 1):
    """``count`` small messages on T/0, closed cleanly, the sysflag of message ``damaged``
    flipped, reopened (a clean open: no record is walked). Returns (store, put results)."""
    store = make_store()
    results = [store.put(Message("T", BODY, queue_id=0)) for _ in range(count)]
    assert {r.phys_offset for r in results} == {RECORD_BYTES * i for i in range(count)}
    store.wait_dispatched()
    store.close()
    flip(store_dir, results[damaged].phys_offset, bit)
    return make_store(), results


def reason(phys: int, bit: int, header_needs: int) -> str:
    return (f"record at commit-log offset {phys}: only {RECORD_BYTES} bytes readable, the "
            f"header alone needs {header_needs} (sysflag {bit:#x})")


@HOST_BITS
def test_get_passes_over_the_damaged_record(make_store, store_dir, bit, header_needs):
    store, rs = damaged_store(make_store, store_dir, bit)
    why = reason(rs[1].phys_offset, bit, header_needs)
    assert store.recovery_report.clean  # nothing an open reads was hit
    plain = store.get("g", "T", 0, 0, 32)
    general = store.get("g", "T", 0, 0, 32, max_total_bytes=1 << 20)
    for res in (plain, general):
        assert (res.status, res.next_begin_offset) == (GetStatus.FOUND, 3)
        assert [(m.queue_offset, m.phys_offset, m.body) for m in res.messages] == [
            (0, rs[0].phys_offset, BODY), (2, rs[2].phys_offset, BODY)]
        assert res.corrupt == [(1, rs[1].phys_offset, why)]
    # A one-message pull from the damaged record passes over it to the next one.
    one = store.get("g", "T", 0, 1, 1)
    assert (one.status, [m.queue_offset for m in one.messages], one.next_begin_offset,
            one.corrupt) == (GetStatus.FOUND, [2], 3, [(1, rs[1].phys_offset, why)])
    last = store.get("g", "T", 0, 2, 1)
    assert (last.status, [m.body for m in last.messages], last.corrupt) == (
        GetStatus.FOUND, [BODY], [])
    with pytest.raises(CorruptRecordError) as err:
        store.message_at(rs[1].phys_offset)
    assert str(err.value) == why
    assert store.message_at(rs[2].phys_offset).body == BODY


@HOST_BITS
def test_read_passes_over_the_damaged_record(make_store, store_dir, bit, header_needs):
    store, rs = damaged_store(make_store, store_dir, bit)
    batch = store.read("T", 0, 0)
    assert (batch.status, batch.next_begin_offset) == (GetStatus.FOUND, 3)
    assert batch.queue_offsets.tolist() == [0, 2]
    assert batch.phys_offsets.tolist() == [rs[0].phys_offset, rs[2].phys_offset]
    assert batch.corrupt == [(1, rs[1].phys_offset, reason(rs[1].phys_offset, bit,
                                                           header_needs))]


def test_a_long_read_passes_over_it_column_wise(make_store, store_dir):
    # 200 records: the pull checks runs of them column-wise and walks only the damaged one.
    store, rs = damaged_store(make_store, store_dir, 0x10, count=200, damaged=150)
    batch = store.read("T", 0, 0)
    assert (batch.status, batch.next_begin_offset) == (GetStatus.FOUND, 200)
    assert batch.queue_offsets.tolist() == [o for o in range(200) if o != 150]
    assert bytes(batch.bodies) == BODY * 199
    assert batch.corrupt == [(150, rs[150].phys_offset, reason(rs[150].phys_offset, 0x10, 103))]


def test_a_consumer_polls_past_it_and_commits_past_it(make_store, store_dir):
    store, rs = damaged_store(make_store, store_dir, 0x10)
    with store.consumer("g", "T", consume_from="first", auto_commit=False) as consumer:
        polled = consumer.poll(32)
        assert [(m.queue_offset, m.body) for m in polled] == [(0, BODY), (2, BODY)]
        assert [c for _q, batch in polled.batches for c in batch.corrupt] == [
            (1, rs[1].phys_offset, reason(rs[1].phys_offset, 0x10, 103))]
        assert consumer.positions() == {0: 3}
        assert len(consumer.poll(32)) == 0
        assert consumer.commit() == {0: 3}


def test_pop_passes_over_it(make_store, store_dir):
    store, _rs = damaged_store(make_store, store_dir, 0x20)
    popped = store.pop("g", "T", 32, 60_000, consume_from="first")
    assert [(m.queue_offset, m.body) for m in popped] == [(0, BODY), (2, BODY)]
    assert store.pop("g", "T", 32, 60_000) == []


@pytest.mark.slow
def test_inspect_and_check_report_it(make_store, store_dir):
    store, rs = damaged_store(make_store, store_dir, 0x10)
    store.close()
    why = reason(rs[1].phys_offset, 0x10, 103)
    cq_file = Path(store_dir) / "consumequeue" / "T" / "0" / f"{0:020d}"
    rows = mqstore_json("inspect", cq_file)["rows"]
    assert [(r["queue_offset"], r["phys_offset"], r["type"], r["record"]) for r in rows] == [
        (0, rs[0].phys_offset, "unit", "ok"), (1, rs[1].phys_offset, "unit", f"bad: {why}"),
        (2, rs[2].phys_offset, "unit", "ok")]
    table = mqstore("inspect", cq_file)
    assert "Traceback" not in table.stderr and "bad: record at commit-log offset 97" in " ".join(
        table.stdout.split())
    segment = mqstore_json("inspect", segment_of(store_dir))["rows"]
    assert [(r["offset"], r["type"]) for r in segment] == [
        (0, "record"), (97, "damaged"), (194, "record")]
    report = json.loads(mqstore("check", store_dir, "--json", check=1).stdout)
    assert [(p["kind"], p["offset"]) for p in report["problems"]] == [
        ("record", rs[1].phys_offset), ("consume-queue", 20)]


def test_recovery_quarantines_it_when_it_walks_it(make_store, store_dir, tmp_path):
    store = make_store()
    rs = [store.put(Message("T", BODY, queue_id=0)) for _ in range(3)]
    store.wait_dispatched()
    store.flush_commit_log(0)
    crashed = tmp_path / "crashed"
    shutil.copytree(store.root, crashed)  # what a killed writer leaves: ``abort`` stays
    assert (crashed / "abort").exists()
    end = rs[2].phys_offset + RECORD_BYTES
    with open(crashed / "checkpoint", "r+b") as f:
        # confirmPhyOffset and the end of the last complete append: every record is durable,
        # so damage among them is rot, not a torn write (which recovery would cut).
        f.seek(32)
        f.write(struct.pack(">qq", end, end))
    flip(crashed, rs[1].phys_offset, 0x10)
    reopened = make_store(root=crashed)
    report = reopened.recovery_report
    assert report.abnormal and not report.clean
    assert [(q.offset, q.length, q.reason) for q in report.quarantined] == [
        (rs[1].phys_offset, RECORD_BYTES, "record at 97: only 97 bytes readable, the header "
                                          "alone needs 103 (sysflag 0x10)")]
    res = reopened.get("g", "T", 0, 0, 32)
    assert [m.queue_offset for m in res.messages] == [0, 2]
    assert [c[:2] for c in res.corrupt] == [(1, rs[1].phys_offset)]
    assert os.path.exists(crashed / "quarantine" / f"{rs[1].phys_offset:020d}")

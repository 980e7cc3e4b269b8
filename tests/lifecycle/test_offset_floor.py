"""Queue offsets go on after the highest one ever given out (issue 24, point 1).

A writer process puts 600 messages over four queues with 16 KiB segments and either closes or
is killed (SIGKILL of its process group); a consumer group reads everything and commits. Then
the newest commit-log bytes are lost: the newest segment deleted, cut to half its data, or its
last 4 KiB zeroed. The store is reopened in the default configuration (worker processes) and
60 more messages are put. No new message may take an acknowledged offset: the group must
receive every one of them, a ``get`` at an acknowledged offset must never serve another
message, and the recovery report must name the offsets that lost their messages.
"""

from __future__ import annotations

import os
import shutil
import signal
import struct
from pathlib import Path

import pytest

from mqstore import Message, MessageStore, PutStatus, load_config
from mqstore.format.record_columns import MIN_RECORD_BYTES
from mqstore.testing.faults import (
    QUEUES, TOPIC, FaultWriter, body_for, small_store_overrides,
)

SEG = 16 * 1024
COUNT = 600
SEED = 24
GROUP = "readers"
OVERRIDES = small_store_overrides(commit_log={"segment_bytes": SEG})


def _config():
    return load_config(overrides=OVERRIDES)


def _consume_everything(root: Path) -> None:
    """The group reads every message and commits (a reader beside the writer, or after it)."""
    with MessageStore.open(root, config=_config(), read_only=True) as store:
        with store.consumer(GROUP, TOPIC, consume_from="first", auto_commit=False) as group:
            got = 0
            while got < COUNT:
                polled = group.poll(256, 2000)
                assert len(polled), f"the group stopped after {got} of {COUNT} messages"
                got += len(polled)
            assert got == COUNT
            group.commit()


@pytest.fixture(scope="module", params=["clean", "killed"])
def pristine(request, tmp_path_factory):
    """(directory, acks, {phys: record size}) of a store whose group consumed everything."""
    root = tmp_path_factory.mktemp(f"floor-{request.param}") / "store"
    clean = request.param == "clean"
    writer = FaultWriter(str(root), OVERRIDES, seed=SEED, count=COUNT,
                         then="close" if clean else "wait").start()
    try:
        assert writer.read_until()
        if clean:
            assert writer.finish() == 0
        _consume_everything(root)
    finally:
        if not clean:
            writer.kill(signal.SIGKILL)
    assert (root / "abort").exists() is not clean
    assert len(writer.acks) == COUNT
    sizes = {}
    for ack in writer.acks:
        with open(_segment(root, ack.phys_offset), "rb") as f:
            f.seek(ack.phys_offset % SEG)
            sizes[ack.phys_offset] = struct.unpack(">i", f.read(4))[0]
    return root, writer.acks, sizes


def _segment(root: Path, phys: int) -> Path:
    return root / "commitlog" / f"{phys - phys % SEG:020d}"


def _end(acks, sizes) -> int:
    last = max(acks, key=lambda a: a.phys_offset)
    return last.phys_offset + sizes[last.phys_offset]


def _delete_newest(root, end):
    _segment(root, end - 1).unlink()
    return end - (end - 1) % SEG - 1


def _truncate_newest(root, end):
    start = end - 1 - (end - 1) % SEG
    os.truncate(_segment(root, start), (end - start) // 2)
    return start + (end - start) // 2


def _zero_newest_4k(root, end):
    begin = max(end - 4096, end - 1 - (end - 1) % SEG)
    with open(_segment(root, begin), "r+b") as f:
        f.seek(begin % SEG)
        f.write(bytes(end - begin))
    return begin


FAULTS = {"delete": _delete_newest, "truncate": _truncate_newest, "zero": _zero_newest_4k}


def _copy(pristine, tmp_path) -> Path:
    dest = tmp_path / "store"
    shutil.copytree(pristine[0], dest)
    return dest


def _runs(offsets) -> list[tuple[int, int]]:
    runs: list[tuple[int, int]] = []
    for offset in sorted(offsets):
        if runs and runs[-1][1] == offset - 1:
            runs[-1] = (runs[-1][0], offset)
        else:
            runs.append((offset, offset))
    return runs


def _highest(acks) -> dict[int, int]:
    out: dict[int, int] = {}
    for ack in acks:
        out[ack.queue_id] = max(out.get(ack.queue_id, -1), ack.queue_offset)
    return out


def _put_more_and_read_them(store, highest: dict[int, int]) -> None:
    """60 new messages: each takes the next offset above the highest acknowledged one, the
    group, which committed everything, receives all of them, and the key index finds each
    (the new messages take commit-log offsets the index had given to lost ones)."""
    expected = {q: highest[q] + 1 for q in range(QUEUES)}
    for i in range(60):
        q = i % QUEUES
        result = store.put(Message(TOPIC, b"new-%02d" % i, queue_id=q, keys=[f"new-{i}"]))
        assert (result.status, result.queue_offset) == (PutStatus.PUT_OK, expected[q]), i
        expected[q] += 1
    store.wait_dispatched(timeout=30)
    assert [[m.body for m in store.query_by_key(TOPIC, f"new-{i}")] for i in range(60)] == [
        [b"new-%02d" % i] for i in range(60)]
    with store.consumer(GROUP, TOPIC, auto_commit=False) as group:
        got = []
        while len(got) < 60:
            polled = group.poll(64, 2000)
            assert len(polled), f"the group received {len(got)} of the 60 new messages"
            got += [m.body for m in polled]
    assert sorted(got) == [b"new-%02d" % i for i in range(60)]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_lost_newest_bytes_never_give_an_offset_out_twice(pristine, tmp_path, watchdog, fault):
    root = _copy(pristine, tmp_path)
    acks, sizes = pristine[1], pristine[2]
    cut = FAULTS[fault](root, _end(acks, sizes))
    lost = [a for a in acks if a.phys_offset + sizes[a.phys_offset] > cut]
    assert lost
    highest = _highest(acks)

    with MessageStore.open(root, config=_config()) as store:
        for q in range(QUEUES):
            assert store.max_offset(TOPIC, q) == highest[q] + 1
        _put_more_and_read_them(store, highest)
        for ack in acks:  # its own message, or none: never another one
            got = store.get("audit", TOPIC, ack.queue_id, ack.queue_offset, 1).messages
            if ack in lost:
                assert [m.queue_offset for m in got if m.queue_offset == ack.queue_offset] == []
            else:
                assert [(m.queue_offset, m.body) for m in got][:1] == [
                    (ack.queue_offset, body_for(SEED, ack.index))]
        report = store.recovery_report
        assert not report.clean
        assert report.queue_offsets_lost == {
            f"{TOPIC}/{q}": _runs(a.queue_offset for a in lost if a.queue_id == q)
            for q in sorted({a.queue_id for a in lost})}, report

    with MessageStore.open(root, config=_config()) as again:  # the fillers are on disk
        assert again.recovery_report.clean, again.recovery_report
        for q in range(QUEUES):
            assert again.max_offset(TOPIC, q) == highest[q] + 16


@pytest.mark.parametrize("pristine", ["killed"], indirect=True)
def test_committed_offsets_are_a_floor_when_the_queues_are_gone_too(pristine, tmp_path,
                                                                     watchdog):
    """Killed, then the newest segment and every consume queue lost: the queue manifest is
    as old as the queues' creation, so only the group's commits know how far they went."""
    root = _copy(pristine, tmp_path)
    acks, sizes = pristine[1], pristine[2]
    cut = _delete_newest(root, _end(acks, sizes))
    lost = [a for a in acks if a.phys_offset >= cut]
    shutil.rmtree(root / "consumequeue")
    highest = _highest(acks)

    with MessageStore.open(root, config=_config()) as store:
        for q in range(QUEUES):
            assert store.max_offset(TOPIC, q) == highest[q] + 1
        _put_more_and_read_them(store, highest)
        assert store.recovery_report.queue_offsets_lost == {
            f"{TOPIC}/{q}": _runs(a.queue_offset for a in lost if a.queue_id == q)
            for q in sorted({a.queue_id for a in lost})}


@pytest.mark.parametrize("pristine", ["clean"], indirect=True)
def test_a_commit_past_the_end_counts_only_as_far_as_the_lost_bytes_reach(pristine, tmp_path,
                                                                          watchdog):
    """A group may commit any offset (a seek past the end): it raises a queue's floor by at
    most one message per MIN_RECORD_BYTES the log lost, and the report says so."""
    root = _copy(pristine, tmp_path)
    acks, sizes = pristine[1], pristine[2]
    with MessageStore.open(root, config=_config(), read_only=True) as reader:
        with reader.consumer("far", TOPIC, auto_commit=False) as group:
            group.seek(0, 10 ** 9)
            group.commit()
    end = _end(acks, sizes)
    _delete_newest(root, end)
    highest = _highest(acks)

    with MessageStore.open(root, config=_config()) as store:
        report = store.recovery_report
        reach = (end - report.commit_log_end) // MIN_RECORD_BYTES
        assert store.max_offset(TOPIC, 0) == highest[0] + 1 + reach
        assert any(f"committed offset {10 ** 9}" in note for note in report.notes), report.notes
        for q in range(1, QUEUES):
            assert store.max_offset(TOPIC, q) == highest[q] + 1


def test_an_open_that_fails_after_mending_says_what_it_mended(tmp_path, watchdog):
    """Issue 24, point 2: an open recovers and reports, or refuses with its reason; when the
    refusal comes after recovery quarantined damaged records (here a dispatcher that cannot
    work), the error says what was quarantined, since the next open finds it mended."""
    root = tmp_path / "store"
    with MessageStore.open(root, config=_config()) as store:
        puts = [store.put(Message(TOPIC, b"m-%03d" % i, queue_id=i % QUEUES, keys=[f"k{i}"]))
                for i in range(50)]
    for put in puts[-3:]:  # a body bit of each of the three newest records
        with open(_segment(root, put.phys_offset), "r+b") as f:
            f.seek(put.phys_offset % SEG + 91)
            byte = f.read(1)[0]
            f.seek(put.phys_offset % SEG + 91)
            f.write(bytes([byte ^ 0x10]))
    failing = load_config(overrides={**OVERRIDES, "plugins": {
        "modules": ["failing_dispatcher_plugin"], "load_entry_points": False}})
    first, end = puts[-3].phys_offset, puts[-1].phys_offset + puts[-1].size
    with pytest.raises(Exception, match="index backend unreachable") as refused:
        MessageStore.open(root, config=failing)
    assert any(note.startswith("the open had recovered the store before it failed: "
                               f"quarantined [{first}, {end}) (body CRC mismatch)")
               for note in getattr(refused.value, "__notes__", [])), refused.value

    with MessageStore.open(root, config=_config()) as store:  # mended: nothing left to say
        assert store.recovery_report.quarantined == []
        for q in range(QUEUES):
            assert store.max_offset(TOPIC, q) == sum(1 for i in range(50) if i % QUEUES == q)

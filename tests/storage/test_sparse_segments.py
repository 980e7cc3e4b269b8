"""Commit-log segments are sparse: blocks are reserved ahead of the writes in growing steps,
never the whole segment up front, and never after a byte was written over them.

A full file system must stay a status, not SIGBUS (``tests/test_disk_full.py`` holds that
line on a tmpfs filled to the last byte); these tests hold the other one: what a store costs
on disk is what it holds, plus a step.
"""

from __future__ import annotations

import os

import pytest

from mqstore import GetStatus, Message, MessageStore, PutStatus, load_config
from mqstore.storage import mapped_file
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.mapped_file import PAGE

MiB = 1 << 20
SEGMENT = "0" * 20


def allocated(path) -> int:
    """Bytes of disk ``path`` takes (its blocks), whatever its length."""
    return os.stat(path).st_blocks * 512


def store_allocated(root) -> dict[str, int]:
    """Blocks of every file under ``root``, by top-level entry."""
    out: dict[str, int] = {}
    for dirpath, _dirs, files in os.walk(root):
        top = os.path.relpath(dirpath, root).split(os.sep)[0]
        top = "." if top == "." else top
        for name in files:
            key = name if top == "." else top
            out[key] = out.get(key, 0) + allocated(os.path.join(dirpath, name))
    return out


def test_a_default_store_of_one_message_costs_megabytes(tmp_path):
    """Default configuration (1 GiB segments, 6 MB consume-queue files, 420 MB index files,
    worker processes): the first message used to take the whole 1 GiB segment on disk."""
    root = tmp_path / "store"
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    assert config.commit_log.segment_bytes == 1 << 30
    store = MessageStore.open(root, config)
    try:
        r = store.put(Message("orders", b"one message", keys=["order-1"], tags="new"))
        assert r.status is PutStatus.PUT_OK
        store.wait_dispatched(timeout=30)
    finally:
        store.close()
    segment = root / "commitlog" / SEGMENT
    assert os.path.getsize(segment) == 1 << 30  # full length, as RocketMQ's files: sparse
    usage = store_allocated(root)
    assert usage["commitlog"] <= 2 * MiB, usage
    assert usage["consumequeue"] <= 64 * 1024, usage
    assert usage["index"] <= 64 * 1024, usage
    assert sum(usage.values()) <= 3 * MiB, usage
    store = MessageStore.open(root, config, read_only=True)
    try:
        got = store.get("g", "orders", r.queue_id, 0, 1)
        assert got.status is GetStatus.FOUND
        assert [(m.body, m.keys, m.tags) for m in got.messages] == \
            [(b"one message", ["order-1"], "new")]
    finally:
        store.close()


def test_reservations_step_ahead_of_every_block(tmp_path, monkeypatch):
    """Every block the put path places has its blocks (and the blank that may follow it)
    reserved before it is written; steps double from the first one, so filling a 64 MiB
    segment takes a handful of fallocate calls, and what is reserved is at most about twice
    what is written."""
    calls: list[tuple[int, int]] = []
    real = mapped_file.reserve_file

    def counting(fd, size, path, begin=0):
        calls.append((begin, size))
        real(fd, size, path, begin)

    monkeypatch.setattr(mapped_file, "reserve_file", counting)
    size, block = 64 * MiB, 300_000
    log = CommitLog(str(tmp_path / "commitlog"), size)
    try:
        while True:
            seg = log.reserve_locked(block)
            if seg.start:  # rolled into the second segment
                break
            end = seg.wrote + block + 8
            assert end <= seg.reserved_to <= min(size, 2 * end + MiB + PAGE)
            # Real blocks, not a promise (the file system may count a few of its own too).
            assert seg.reserved_to <= allocated(seg.path) <= seg.reserved_to + MiB
            seg.write(b"\x01" * block)
        first = log.segments.segments[0]
        assert first.wrote == size  # closed by its blank
        assert calls[0] == (0, -(-(block + 8 + MiB) // PAGE) * PAGE)  # the first step
        assert len(calls) <= 10, calls  # not one per block (223 of them)
        steps = [stop - begin for begin, stop in calls[:6]]  # then the segment's end caps one
        assert steps == sorted(steps) and steps[-1] >= 16 * MiB, calls
    finally:
        log.close()


@pytest.mark.parametrize("kind", ["mmap", "transient_pool"])
def test_a_closed_segment_keeps_its_tail_a_hole_with_either_writer(make_store, kind):
    """The blank that closes a segment covers its tail; neither the map nor the transient
    pool's commit (in the flush worker) writes zeros there, so the tail costs no blocks and
    needed no reservation."""
    seg_bytes = 16 * MiB
    store = make_store({"commit_log": {"segment_bytes": seg_bytes, "max_message_bytes": 15 * MiB},
                        "writer": {"kind": kind, "transient_pool_buffers": 2}})
    small, big = b"\x02" * MiB, b"\x03" * (15 * MiB)
    results = [store.put(Message("T", small, queue_id=0)), store.put(Message("T", big, queue_id=0))]
    assert [r.status for r in results] == [PutStatus.PUT_OK] * 2
    assert results[1].phys_offset == seg_bytes  # it rolled: the first segment is closed
    store.flush_commit_log()
    store.wait_dispatched(timeout=30)
    first = os.path.join(store.root, "commitlog", SEGMENT)
    written = results[0].size
    assert written + 8 <= allocated(first) <= written + 8 + 2 * MiB
    assert [store.message_at(r.phys_offset).body for r in results] == [small, big]

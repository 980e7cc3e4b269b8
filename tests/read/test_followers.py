"""Read-only followers of a store another process writes (issue "Nothing lost, nothing wrong",
item 6): a follower polling every queue from offset 0 sees each acknowledged message once, in
queue-offset order, byte-identical, across commit-log segment and consume-queue file rolls;
it sees units dispatched while the writer is idle; it learns the writer's segment size from
the files; it copes with cleanup deleting files under it.

MQSTORE_FOLLOWER_MESSAGES sets how many messages the writer processes put (default 4,000);
run with -s to see the figures of each run.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

from mqstore import Message, MessageStore, load_config
from mqstore.format.cq_unit import CQ_DTYPE, FILLER_SIZE
from mqstore.storage import consume_queue as consume_queue_module
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR, ConsumeQueue
from mqstore.storage.mapped_file import segment_name
from mqstore.storage.segment_queue import SegmentQueue
from mqstore.testing.faults import (
    QUEUES, TOPIC, FaultWriter, body_for, message_for, small_store_overrides,
)

MESSAGES = int(os.environ.get("MQSTORE_FOLLOWER_MESSAGES", "4000"))
SEED = 6
GROUP = "follower"
STALL_S = 20.0  # no progress for this long while messages are missing: the follower is stuck


class Follower:
    """Polls every queue of TOPIC with ``get``, from offset 0, following next_begin_offset.

    ``seen[q]`` holds (queue offset, commit-log offset, body) of what it was given; ``passed``
    every answer that moved the offset past one it was not given a message for."""

    def __init__(self, store: MessageStore) -> None:
        self.store = store
        self.next = {q: 0 for q in range(QUEUES)}
        self.seen: dict[int, list[tuple[int, int, bytes]]] = {q: [] for q in range(QUEUES)}
        self.passed: list[tuple] = []
        self.polls = 0

    @property
    def total(self) -> int:
        return sum(len(v) for v in self.seen.values())

    def poll(self) -> int:
        got = 0
        for q, offset in self.next.items():
            res = self.store.get(GROUP, TOPIC, q, offset, 32)
            self.polls += 1
            if res is None:
                continue
            offsets = [m.queue_offset for m in res.messages]
            if (offsets != list(range(offset, offset + len(offsets)))
                    or res.next_begin_offset != offset + len(offsets)
                    or getattr(res, "corrupt", None)):
                self.passed.append((q, offset, res.next_begin_offset, res.status.name, offsets))
            self.seen[q].extend((m.queue_offset, m.phys_offset, m.body) for m in res.messages)
            self.next[q] = res.next_begin_offset
            got += len(offsets)
        return got

    def drain(self) -> None:
        """Poll until a pass over every queue brings nothing and moves no offset."""
        while True:
            before = dict(self.next)
            if not self.poll() and self.next == before:
                return


def _by_queue(acks) -> dict[int, list]:
    queues = defaultdict(list)
    for ack in acks:
        queues[ack.queue_id].append(ack)
    for lst in queues.values():
        lst.sort(key=lambda a: a.queue_offset)
    return queues


def assert_saw_exactly(follower: Follower, acks) -> None:
    """Every acknowledged message once, in queue-offset order, byte-identical; nothing else."""
    assert follower.passed == []
    queues = _by_queue(acks)
    for q in range(QUEUES):
        expected = [(a.queue_offset, a.phys_offset, body_for(SEED, a.index)) for a in queues[q]]
        got = follower.seen[q]
        assert [s[0] for s in got] == [e[0] for e in expected], f"queue {q}: offsets differ"
        wrong = [e[0] for e, s in zip(expected, got) if e != s]
        assert not wrong, f"queue {q}: offsets {wrong[:10]} differ from what was acknowledged"


def _at_end(follower: Follower, acks) -> bool:
    ends = {q: len(lst) for q, lst in _by_queue(acks).items()}
    return all(follower.next[q] >= ends.get(q, 0) for q in range(QUEUES))


def _follow_writer(follower_box: list, writer: FaultWriter, open_follower, open_after: int):
    """Poll while the writer runs and until every acknowledged message is seen; returns the
    follower. Fails when it stops making progress while messages are missing."""
    follower = None
    last_progress = time.monotonic()
    while True:
        if follower is None and len(writer.acks) >= open_after:
            follower = Follower(open_follower())
            follower_box.append(follower)
        got = follower.poll() if follower is not None else 0
        now = time.monotonic()
        if got:
            last_progress = now
            continue
        if writer.done and follower is not None and _at_end(follower, writer.acks):
            return follower
        assert now - last_progress < STALL_S, (
            f"follower stuck at {follower and follower.next} with {follower and follower.total} "
            f"of {len(writer.acks)} acknowledged messages; "
            f"passed over {follower and follower.passed[:5]}")
        time.sleep(0.001)


@pytest.mark.parametrize("kind,batch,open_when", [
    ("mmap", 0, "before"),
    ("mmap", 16, "during"),
    ("transient_pool", 0, "during"),
    ("transient_pool", 16, "before"),
])
def test_a_follower_in_another_process_sees_every_message_once(tmp_path, kind, batch, open_when):
    root = tmp_path / "store"
    root.mkdir()
    overrides = small_store_overrides(writer={"kind": kind}, consume_queue={"file_units": 100})
    writer = FaultWriter(str(root), overrides, seed=SEED, count=MESSAGES, batch=batch,
                         then="close", wait_s=120.0)
    reader_box: list = []
    # "before": opened on the empty directory, so the configured 1 GiB segments are all it
    # knows until the writer's 64 KiB files appear.
    early = MessageStore.open(root, read_only=True) if open_when == "before" else None
    began = time.monotonic()
    writer.start(timeout_s=120.0 + MESSAGES / 200)
    acks = threading.Thread(target=writer.read_until, daemon=True)
    acks.start()
    try:
        follower = _follow_writer(
            reader_box, writer,
            (lambda: early) if early else (lambda: MessageStore.open(root, read_only=True)),
            0 if early else MESSAGES // 4)
        elapsed = time.monotonic() - began
        acks.join(timeout=60)
        assert writer.finish() == 0, writer.stderr.decode()[-2000:]
        assert writer.refusals == [] and len(writer.acks) == MESSAGES
        assert "wait_dispatched" not in (writer.status or {}), writer.status
        segments = len(os.listdir(root / "commitlog"))
        print(f"\n{kind} batch={batch} opened {open_when}: followed {follower.total}, "
              f"skipped {len(follower.passed)}, {segments} segments, {follower.polls} pulls, "
              f"{elapsed:.1f} s")
        assert segments > 5
        assert_saw_exactly(follower, writer.acks)
    finally:
        if writer.proc.poll() is None:
            writer.kill()
        for follower in reader_box:
            follower.store.close()


def _pull_all(store, queue_id: int) -> list[bytes]:
    res = store.get(GROUP, TOPIC, queue_id, 0, 32)
    return [m.body for m in res.messages] if res is not None else []


@pytest.mark.parametrize("kind", ["mmap", "transient_pool"])
def test_a_follower_of_an_idle_writer_sees_units_dispatched_after_its_last_look(tmp_path, kind):
    root = tmp_path / "store"
    cfg = load_config(overrides=small_store_overrides(writer={"kind": kind}))
    with MessageStore.open(root, config=cfg) as writer, \
            MessageStore.open(root, read_only=True) as reader:
        writer.put(Message(TOPIC, b"first", queue_id=0))
        writer.wait_dispatched()
        assert _pull_all(reader, 0) == [b"first"]
        worker = writer.worker_status()["pid"]
        os.kill(worker, signal.SIGSTOP)  # dispatch holds still: the record lands, its unit not
        try:
            put = writer.put(Message(TOPIC, b"second", queue_id=0))
            deadline = time.monotonic() + 10
            while reader.message_at(put.phys_offset) is None:  # the follower checked it
                assert time.monotonic() < deadline
                _pull_all(reader, 0)
                time.sleep(0.01)
            assert _pull_all(reader, 0) == [b"first"]
        finally:
            os.kill(worker, signal.SIGCONT)
        writer.wait_dispatched()
        # The log has not moved since the follower's last look; the new unit is seen anyway.
        assert _pull_all(reader, 0) == [b"first", b"second"]
        assert reader.max_offset(TOPIC, 0) == 2


def test_a_follower_opened_before_the_first_put_learns_the_segment_size(tmp_path):
    root = tmp_path / "store"
    root.mkdir()
    cfg = load_config(overrides=small_store_overrides(consume_queue={"file_units": 100}))
    # Opened on an empty directory: no file, no recorded size, only its own configuration
    # (1 GiB segments) to go by.
    with MessageStore.open(root, read_only=True) as reader, \
            MessageStore.open(root, config=cfg) as writer:
        follower = Follower(reader)
        follower.drain()
        assert follower.total == 0
        acks = []
        for index in range(1200):  # about 5 segments; the follower looks between bursts
            r = writer.put(message_for(SEED, index))
            acks.append(_Ack(index, r.queue_id, r.queue_offset, r.phys_offset))
            if index % 150 == 149:
                writer.wait_dispatched()
                follower.drain()
        writer.wait_dispatched()
        follower.drain()
        assert reader.internals.commit_log.segment_bytes == 64 * 1024
        assert len(reader.internals.commit_log.segments.segments) > 3
        assert_saw_exactly(follower, acks)


class _Ack:
    def __init__(self, index, queue_id, queue_offset, phys_offset) -> None:
        self.index, self.queue_id = index, queue_id
        self.queue_offset, self.phys_offset = queue_offset, phys_offset


def test_followers_keep_up_while_cleanup_deletes_old_files(tmp_path):
    root = tmp_path / "store"
    cfg = load_config(overrides=small_store_overrides(consume_queue={"file_units": 50}))
    with MessageStore.open(root, config=cfg) as writer, \
            MessageStore.open(root, read_only=True) as keeping_up, \
            MessageStore.open(root, read_only=True) as lagging:
        follower = Follower(keeping_up)
        acks, removed = [], 0
        for index in range(2700):
            r = writer.put(message_for(SEED, index))
            acks.append(_Ack(index, r.queue_id, r.queue_offset, r.phys_offset))
            if index % 300 == 299:
                writer.wait_dispatched()
                follower.drain()
                if index < 2400:  # the last 300 roll the log once more after the last deletion
                    removed += sum("commitlog" in path for path in
                                   writer.delete_expired_segments(force=True, max_segments=2))
        writer.wait_dispatched()
        follower.drain()
        assert removed >= 6 and writer.internals.commit_log.min_offset > 0
        assert_saw_exactly(follower, acks)
        # It forgot the deleted files: no more maps than the writer has files.
        assert keeping_up.internals.commit_log.min_offset == writer.internals.commit_log.min_offset
        assert (len(keeping_up.internals.commit_log.segments.segments)
                == len(writer.internals.commit_log.segments.segments))
        for q in range(QUEUES):
            cq = keeping_up.consume_queues[(TOPIC, q)]
            assert len(cq.segments.segments) <= len(os.listdir(cq.directory)) + 1

        # One that first looks now is told what is gone and given the rest.
        late = Follower(lagging)
        late.drain()
        min_phys = writer.internals.commit_log.min_offset
        kept = [a for a in acks if a.phys_offset >= min_phys]
        assert {(q, s[0]) for q in range(QUEUES) for s in late.seen[q]} == {
            (a.queue_id, a.queue_offset) for a in kept}
        for q, lst in _by_queue(kept).items():
            assert late.seen[q] == [(a.queue_offset, a.phys_offset, body_for(SEED, a.index))
                                    for a in lst]
        gone = {(a.queue_id, a.queue_offset) for a in acks if a.phys_offset < min_phys}
        for q, offset, nxt, status, _offsets in late.passed:
            assert status in ("OFFSET_TOO_SMALL", "MESSAGE_WAS_REMOVING", "FOUND"), status
            assert all((q, o) in gone for o in range(offset, nxt)
                       if o not in {s[0] for s in late.seen[q]})


# -- the parts, one at a time ------------------------------------------------------------------

def _segment_file(directory, start: int, size: int):
    path = directory / segment_name(start)
    with open(path, "wb") as f:
        f.truncate(size)
    return path


def test_segment_refresh_takes_files_as_they_come_and_forgets_deleted_ones(tmp_path, monkeypatch):
    d = tmp_path / "log"
    d.mkdir()
    follower = SegmentQueue(str(d), 1 << 30, read_only=True)  # the configured size, not theirs
    assert follower.refresh() == 0
    _segment_file(d, 0, 0)  # created, not yet given its size
    assert follower.refresh() == 0
    _segment_file(d, 0, 4096)
    assert follower.refresh() == 1 and follower.segment_bytes == 4096
    assert follower.segments[0].wrote == 0  # nothing in it trusted yet
    _segment_file(d, 4096, 0)
    assert follower.refresh() == 0
    _segment_file(d, 4096, 4096)
    real_getsize = os.path.getsize

    def vanishing(path):
        if path.endswith(segment_name(8192)):
            raise FileNotFoundError(path)
        return real_getsize(path)

    _segment_file(d, 8192, 4096)
    monkeypatch.setattr(os.path, "getsize", vanishing)
    assert follower.refresh() == 1  # the one that vanished is looked at again next time
    monkeypatch.undo()
    assert follower.refresh() == 1 and len(follower.segments) == 3
    os.unlink(d / segment_name(0))
    os.unlink(d / segment_name(4096))
    assert follower.refresh() == 0 and len(follower.segments) == 3  # only when asked
    assert follower.refresh(prune=True) == 0
    assert [s.start for s in follower.segments] == [8192]
    os.unlink(d / segment_name(8192))
    assert follower.refresh(prune=True) == 0 and len(follower.segments) == 1  # the newest stays
    os.rmdir(d)
    assert follower.refresh(prune=True) == 0
    follower.close()


def _units(*pairs) -> np.ndarray:
    units = np.zeros(len(pairs), dtype=CQ_DTYPE)
    for i, (phys, size) in enumerate(pairs):
        units[i]["phys_offset"], units[i]["size"] = phys, size
    return units


def _queue_file(root, units: np.ndarray, file_units: int, start_unit: int = 0):
    d = root / CONSUME_QUEUE_DIR / "T" / "0"
    d.mkdir(parents=True, exist_ok=True)
    path = d / segment_name(start_unit * 20)
    with open(path, "wb") as f:
        f.truncate(file_units * 20)
        f.write(units.tobytes())
    return path


def _follower_queue(root) -> ConsumeQueue:
    cq = ConsumeQueue(str(root), "T", 0, None, read_only=True)
    cq.follow()
    return cq


def test_queue_refresh_admits_fillers_anywhere_and_stops_at_an_insane_unit(tmp_path):
    f = FILLER_SIZE
    _queue_file(tmp_path, _units((0, f), (0, f), (0, 100), (0, f), (100, 50), (150, 50),
                                 (120, 10), (300, 10)), 64)
    cq = _follower_queue(tmp_path)
    cq.refresh(150)  # (150, 50) ends past the limit
    assert (cq.min_offset, cq.max_offset) == (2, 5)
    # (120, 10) goes back: either it or the unit before it is a stray (valid_prefix), and
    # neither is admitted.
    cq.refresh(10_000)
    assert (cq.min_offset, cq.max_offset, cq.max_phys) == (2, 5, 150)
    cq.close()


def test_queue_refresh_maps_the_next_file_and_costs_what_is_new(tmp_path, monkeypatch):
    # RocketMQ's default: 300,000 units a file. A look reads the new units, not the whole
    # rest of the file.
    examined = []
    real = consume_queue_module.valid_prefix
    monkeypatch.setattr(consume_queue_module, "valid_prefix",
                        lambda units, prev=-1: examined.append(len(units)) or real(units, prev))
    path = _queue_file(tmp_path, _units(*((i * 10, 10) for i in range(10))), 300_000)
    cq = _follower_queue(tmp_path)
    cq.refresh(1 << 40)
    assert cq.max_offset == 10 and max(examined) <= 1024
    examined.clear()
    for _ in range(100):  # idle looks
        cq.refresh(1 << 40)
    assert examined == []
    with open(path, "r+b") as f:  # 3,000 more: several windows in one look
        f.seek(10 * 20)
        f.write(_units(*((i * 10, 10) for i in range(10, 3010))).tobytes())
    cq.refresh(1 << 40)
    assert cq.max_offset == 3010 and max(examined) <= 1024 and sum(examined) < 3010 + 1024
    cq.close()

    small = tmp_path / "small"
    _queue_file(small, _units(*((i * 10, 10) for i in range(4))), 4)
    cq = _follower_queue(small)
    cq.refresh(1 << 40)
    assert cq.max_offset == 4
    # The queue rolls twice before the next look, the first new file not yet full: what the
    # follower offers ends where its checked units do.
    _queue_file(small, _units((40, 10), (50, 10)), 4, start_unit=4)
    _queue_file(small, _units(*((i * 10, 10) for i in range(8, 12))), 4, start_unit=8)
    cq.refresh(1 << 40)
    assert cq.max_offset == 6
    cq.close()


class _FakeLog:
    """Record heads at given offsets, as the commit log's ``read`` answers them."""

    def __init__(self, records: dict[int, tuple[int, int, int]]) -> None:
        self.records = records  # phys -> (size, queue_id, queue_offset)
        self.min_offset = 0

    def read(self, phys: int, size: int):
        if phys not in self.records:
            return None
        total, qid, qoff = self.records[phys]
        head = bytearray(size)
        head[0:4] = total.to_bytes(4, "big")
        head[12:16] = qid.to_bytes(4, "big")
        head[20:28] = qoff.to_bytes(8, "big")
        head[28:36] = phys.to_bytes(8, "big")
        return memoryview(bytes(head))


def test_queue_refresh_holds_back_a_unit_its_record_contradicts(tmp_path, monkeypatch):
    # A unit caught half-copied looks sane (a size whose low bytes are still zero) but does
    # not match its record: it waits for a later look. One that keeps disagreeing is damage,
    # admitted after a while so the pull can report it.
    monkeypatch.setattr(ConsumeQueue, "_DOUBT_S", 0.2)
    log = _FakeLog({0: (100, 0, 0), 100: (300, 0, 1), 400: (50, 0, 2)})
    path = _queue_file(tmp_path, _units((0, 100), (100, 256)), 64)  # 300 torn to 256
    cq = _follower_queue(tmp_path)
    cq.refresh(1000, log)
    assert cq.max_offset == 1
    with open(path, "r+b") as f:  # the copy completes
        f.seek(20)
        f.write(_units((100, 300), (400, 50)).tobytes())
    cq.refresh(1000, log)
    assert cq.max_offset == 3
    with open(path, "r+b") as f:  # a unit naming the wrong size for good
        f.seek(60)
        f.write(_units((450, 60)).tobytes())
    log.records[450] = (70, 0, 3)
    cq.refresh(1000, log)
    assert cq.max_offset == 3
    time.sleep(0.25)
    cq.refresh(1000, log)
    assert cq.max_offset == 4
    cq.close()


def test_queue_min_offset_follows_cleanup_without_hiding_stored_units(tmp_path):
    # A filler (a place kept for a message lost to damage) may be the last unit for a while.
    _queue_file(tmp_path, _units((0, 100), (100, 100), (200, 100), (0, FILLER_SIZE)), 64)
    cq = _follower_queue(tmp_path)
    cq.refresh(1000)
    cq.follow_min_offset(0)
    assert (cq.min_offset, cq.max_offset) == (0, 4)
    cq.follow_min_offset(150)  # cleanup deleted the log below 150
    assert cq.min_offset == 2
    cq.follow_min_offset(1000)
    assert cq.min_offset == 4
    cq.close()


def test_opening_a_follower_deletes_none_of_the_writers_files(tmp_path):
    root = tmp_path / "store"
    cfg = load_config(overrides=small_store_overrides(consume_queue={"file_units": 4}))
    with MessageStore.open(root, config=cfg) as writer:
        for i in range(10):
            writer.put(Message(TOPIC, b"m%d" % i, queue_id=0))
        writer.wait_dispatched()
        qdir = root / CONSUME_QUEUE_DIR / TOPIC / "0"
        before = sorted(os.listdir(qdir))
        # What recovery does to a follower's view when the writer is ahead of the log it saw.
        cq = ConsumeQueue(str(root), TOPIC, 0, None, read_only=True)
        cq.load()
        cq.truncate_to_phys(1)
        cq.close()
        assert sorted(os.listdir(qdir)) == before

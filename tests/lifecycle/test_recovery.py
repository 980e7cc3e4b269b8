"""Recovery at open (spec 1, 6, 10.11; acceptance behaviours 53-59 and 61).

A crash is simulated inside one process: write, wait for dispatch, flush the commit log, then
copy the directory while the store is still open. The copy has ``abort`` and no lock holder,
exactly what a killed process leaves behind; opening it is an abnormal recovery. Damage is
then done to the copy's files by hand (torn tails, flipped bytes, deleted files).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
from collections import defaultdict
from pathlib import Path

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.errors import CorruptRecordError, StoreLockedError
from mqstore.storage.queue_progress import read_queued, remove_queued

BORN = 1_700_000_000_000
CHECKPOINT_BYTES = 4096
CQ_UNIT = 20
BODY_AT = 88  # IPv4 born and store hosts: BODYLENGTH at 84, body bytes from 88
END_FILE_MIN_BLANK_BYTES = 8


WORKER_PROCESSES = {"dispatch": {"worker": "process"}, "flush": {"worker": "process"}}


@pytest.fixture
def make_store(request, make_store):
    """The shared factory; ``parametrize("make_store", ["thread", "process"], indirect=True)``
    runs a test with the dispatch and flush loops in worker processes as well."""
    if getattr(request, "param", "thread") == "thread":
        return make_store

    def with_workers(overrides=None, **kw):
        merged = {k: dict(v) for k, v in WORKER_PROCESSES.items()}
        for section, values in (overrides or {}).items():
            merged.setdefault(section, {}).update(values)
        return make_store(merged, **kw)

    return with_workers


BOTH_MODES = pytest.mark.parametrize("make_store", ["thread", "process"], indirect=True)


# -- helpers -----------------------------------------------------------------------------
def put(store, queue_id, body, *, topic="T", tags=None, sysflag=0):
    result = store.put(Message(topic, body, tags=tags, queue_id=queue_id, sysflag=sysflag,
                               born_timestamp=BORN))
    assert result.status is PutStatus.PUT_OK, result
    return result


def crash_copy(store, dest: Path) -> Path:
    """What a killed writer leaves: flushed data, ``abort`` present, no lock holder, and a
    checkpoint that recorded neither the flushed end nor a complete append (damage at the tail
    counts as torn; ``set_durable_end`` says otherwise)."""
    store.wait_dispatched()
    store.flush_commit_log(0)
    shutil.copytree(store.root, dest)
    assert (dest / "abort").exists()
    set_durable_end(dest, 0)
    return dest


def segment_path(root: Path, phys: int, segment_bytes: int) -> Path:
    return Path(root) / "commitlog" / f"{phys - phys % segment_bytes:020d}"


def read_at(root: Path, phys: int, size: int, segment_bytes: int) -> bytes:
    with open(segment_path(root, phys, segment_bytes), "rb") as f:
        f.seek(phys % segment_bytes)
        return f.read(size)


def write_at(root: Path, phys: int, data: bytes, segment_bytes: int) -> None:
    with open(segment_path(root, phys, segment_bytes), "r+b") as f:
        f.seek(phys % segment_bytes)
        f.write(data)


def garbage_over(orig: bytes, rng: random.Random) -> bytes:
    """Bytes that differ from ``orig`` at every position (so none of them is zero-preserving)."""
    return bytes(b ^ rng.randrange(1, 256) for b in orig)


def read_queue(store, queue_id, topic="T"):
    messages, offset = [], 0
    while offset < store.max_offset(topic, queue_id):
        got = store.get("g", topic, queue_id, offset, 32)
        assert got.status is GetStatus.FOUND, (topic, queue_id, offset, got.status)
        assert got.next_begin_offset > offset
        messages += got.messages
        offset = got.next_begin_offset
    return messages


def read_all(store, queue_id, topic="T"):
    """Every message a consumer gets from the queue, stepping over what cannot be served."""
    messages, offset = [], store.min_offset(topic, queue_id)
    while offset < store.max_offset(topic, queue_id):
        got = store.get("g", topic, queue_id, offset, 32)
        assert got.status in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE), got.status
        assert got.next_begin_offset > offset
        messages += got.messages
        offset = got.next_begin_offset
    return messages


def queue_snapshot(store, topic="T"):
    return {q: (store.min_offset(topic, q), store.max_offset(topic, q),
                [(m.queue_offset, m.phys_offset, m.body) for m in read_queue(store, q, topic)])
            for q in store.queue_ids(topic)}


def assert_holds_exactly(store, acked, count, *, topic="T"):
    """The store holds ``acked[:count]`` (PutResult, body) and none of the rest."""
    kept = acked[:count]
    per_queue = defaultdict(list)
    for result, body in kept:
        per_queue[result.queue_id].append((result.queue_offset, result.phys_offset, body))
    for result, body in kept:
        m = store.message_at(result.phys_offset)
        assert m is not None, result
        assert (m.body, m.queue_id, m.queue_offset) == (body, result.queue_id, result.queue_offset)
    for queue_id in {r.queue_id for r, _ in acked}:
        assert store.max_offset(topic, queue_id) == len(per_queue[queue_id])
        got = [(m.queue_offset, m.phys_offset, m.body) for m in read_queue(store, queue_id, topic)]
        assert got == per_queue[queue_id]
    if count < len(acked):
        assert store.message_at(acked[count][0].phys_offset) is None


def put_random(store, rng, count, *, queues=4, max_body=300):
    acked = []
    for i in range(count):
        body = bytes(rng.randrange(256) for _ in range(rng.randrange(max_body)))
        acked.append((put(store, rng.randrange(queues), body), body))
    return acked


# -- 53: clean shutdown ------------------------------------------------------------------
@BOTH_MODES
def test_clean_shutdown_removes_abort_and_restart_keeps_offsets(make_store, store_dir):
    store = make_store()
    assert (store_dir / "abort").exists()
    for i in range(12):
        put(store, i % 4, b"m%d" % i, tags="TagA")
    for i in range(3):
        last = put(store, 0, b"u%d" % i, topic="U")
    store.wait_dispatched()
    phys = (store.min_phys_offset, store.max_phys_offset)
    queues_t, queues_u = queue_snapshot(store), queue_snapshot(store, "U")
    assert (store_dir / "abort").exists()
    store.close()

    assert not (store_dir / "abort").exists()
    assert (store_dir / "checkpoint").stat().st_size == CHECKPOINT_BYTES
    again = make_store()
    assert again.recovery_report.abnormal is False
    assert again.recovery_report.clean
    assert (again.min_phys_offset, again.max_phys_offset) == phys == (0, last.phys_offset + last.size)
    assert again.topics() == ["T", "U"]
    assert queue_snapshot(again) == queues_t
    assert queue_snapshot(again, "U") == queues_u
    assert {q: v[:2] for q, v in queues_t.items()} == {q: (0, 3) for q in range(4)}


# -- 54: torn last record ------------------------------------------------------------------
@BOTH_MODES
@pytest.mark.parametrize("damage", ["garbage", "zeros"])
def test_torn_last_record_is_cut_and_writes_continue_there(make_store, store_dir, tmp_path,
                                                             damage):
    seg = 1 << 20
    store = make_store()
    acked = [(put(store, i % 3, b"body-%03d" % i, tags="TagA"), b"body-%03d" % i)
             for i in range(20)]
    root = crash_copy(store, tmp_path / "crashed")
    last = acked[-1][0]
    if damage == "garbage":
        span = (last.phys_offset + 20, last.phys_offset + last.size - 4)
        orig = read_at(root, span[0], span[1] - span[0], seg)
        write_at(root, span[0], garbage_over(orig, random.Random(54)), seg)
    else:
        cut = last.phys_offset + last.size // 2
        write_at(root, cut, bytes(seg - cut % seg), seg)
    # Non-zero bytes the recovery has to cut: from the record start to the last non-zero byte.
    expected_cut = len(read_at(root, last.phys_offset, seg - last.phys_offset, seg).rstrip(b"\0"))

    crashed = make_store(root=root)
    report = crashed.recovery_report
    assert report.abnormal is True
    assert report.commit_log_end == last.phys_offset
    assert report.truncated_bytes == expected_cut > 0
    if damage == "garbage":
        assert expected_cut == last.size
    assert report.stop_reason
    assert report.consume_queue_units_dropped == {f"T/{last.queue_id}": 1}
    assert crashed.max_phys_offset == last.phys_offset
    assert_holds_exactly(crashed, acked, 19)
    assert crashed.max_offset("T", last.queue_id) == last.queue_offset

    again = put(crashed, last.queue_id, b"replacement", tags="TagA")
    assert (again.phys_offset, again.queue_offset) == (last.phys_offset, last.queue_offset)
    crashed.wait_dispatched()
    got = crashed.get("g", "T", last.queue_id, last.queue_offset, 32)
    assert [m.body for m in got.messages] == [b"replacement"]


# -- 55: body CRC ----------------------------------------------------------------------------
def set_durable_end(root: Path, offset: int, appended: int | None = None) -> None:
    """Write the checkpoint's confirmPhyOffset (the flushed end) and its ``appended`` field
    (the end of the last complete append; by default the same): recovery trusts the later.
    Bytes past both belong to a put the crash interrupted."""
    with open(Path(root) / "checkpoint", "r+b") as f:
        f.seek(32)
        f.write(struct.pack(">qq", offset, offset if appended is None else appended))


@BOTH_MODES
@pytest.mark.parametrize("check_crc, durable", [(True, False), (True, True), (False, False)])
def test_flipped_body_byte_of_last_record(make_store, tmp_path, check_crc, durable):
    seg = 1 << 20
    store = make_store()
    acked = [(put(store, 0, b"payload-%02d" % i, tags="TagA"), b"payload-%02d" % i)
             for i in range(8)]
    root = crash_copy(store, tmp_path / "crashed")
    last, body = acked[-1]
    set_durable_end(root, last.phys_offset + last.size if durable else last.phys_offset)
    at = last.phys_offset + BODY_AT + 3
    assert read_at(root, last.phys_offset + BODY_AT, len(body), seg) == body
    flipped_byte = read_at(root, at, 1, seg)[0] ^ 0x01
    write_at(root, at, bytes([flipped_byte]), seg)

    overrides = None if check_crc else {"commit_log": {"check_crc_on_recover": False}}
    crashed = make_store(overrides, root=root)
    report = crashed.recovery_report
    assert report.abnormal is True
    end = last.phys_offset + last.size
    if check_crc and not durable:  # past the flushed end: a torn tail, cut
        assert report.commit_log_end == crashed.max_phys_offset == last.phys_offset
        assert "CRC" in report.stop_reason
        assert report.truncated_bytes == last.size
        assert_holds_exactly(crashed, acked, 7)
        return
    if check_crc:  # it was on disk: bit rot, quarantined; its queue offset stays taken
        assert [(q.offset, q.length) for q in report.quarantined] == [(last.phys_offset,
                                                                       last.size)]
        assert "CRC" in report.quarantined[0].reason
        assert crashed.message_at(last.phys_offset) is None
    else:  # not checked at open: still there, refused when served
        with pytest.raises(CorruptRecordError, match="body CRC mismatch"):
            crashed.message_at(last.phys_offset)
    assert report.commit_log_end == crashed.max_phys_offset == end
    assert report.truncated_bytes == 0
    crashed.wait_dispatched()
    assert crashed.max_offset("T", 0) == 8
    assert [m.body for m in read_all(crashed, 0)] == [b for _, b in acked[:7]]
    tail = crashed.get("g", "T", 0, 7, 32)
    assert [c[:2] for c in tail.corrupt] == [(7, last.phys_offset)]
    assert put(crashed, 0, b"next").queue_offset == 8


@BOTH_MODES
@pytest.mark.parametrize("completed", [False, True])
def test_a_batch_whose_first_bytes_never_landed(make_store, tmp_path, completed):
    """A crash inside a put's copy can leave its later records whole and its first bytes zero
    (a copy may store its first bytes last). If the writer never completed that put, its
    records are a torn tail, all of them cut, and their queue offsets are given out again; if
    it did (the checkpoint's ``appended`` covers it), the zeros are damage to acknowledged
    bytes: the first record is quarantined and the other three are kept."""
    seg = 1 << 20
    store = make_store()
    acked = [(put(store, i % 2, b"before-%02d" % i), b"before-%02d" % i) for i in range(6)]
    batch = store.put_batch([Message("T", b"batch-%d" % i, queue_id=1, born_timestamp=BORN)
                             for i in range(4)])
    assert batch.status is PutStatus.PUT_OK
    first_phys, first_size = int(batch.phys_offsets[0]), int(batch.sizes[0])
    first_offset = int(batch.queue_offsets[0])
    batch_end = int(batch.phys_offsets[-1] + batch.sizes[-1])
    root = crash_copy(store, tmp_path / "crashed")
    set_durable_end(root, acked[2][0].phys_offset,
                    appended=batch_end if completed else first_phys)
    write_at(root, first_phys, bytes(32), seg)

    crashed = make_store(root=root)
    report = crashed.recovery_report
    crashed.wait_dispatched()
    if not completed:
        assert report.quarantined == []
        assert report.commit_log_end == crashed.max_phys_offset == first_phys
        assert 0 < report.truncated_bytes <= batch_end - first_phys  # its non-zero bytes
        assert read_at(root, first_phys, batch_end - first_phys, seg) == bytes(
            batch_end - first_phys)
        assert_holds_exactly(crashed, acked, 6)
        assert put(crashed, 1, b"again").queue_offset == first_offset
        return
    assert [(q.offset, q.length) for q in report.quarantined] == [(first_phys,
                                                                   first_size)]
    assert report.truncated_bytes == 0
    assert crashed.max_phys_offset == batch_end
    assert crashed.message_at(first_phys) is None
    assert crashed.max_offset("T", 1) == first_offset + 4
    assert [m.body for m in read_all(crashed, 1)][-3:] == [b"batch-1", b"batch-2", b"batch-3"]
    assert put(crashed, 1, b"next").queue_offset == first_offset + 4


# -- 56: consume queues rebuilt --------------------------------------------------------------
@BOTH_MODES
@pytest.mark.parametrize("exit_kind", ["clean", "abnormal"])
def test_deleted_consume_queue_dir_is_rebuilt(make_store, store_dir, tmp_path, exit_kind):
    store = make_store()
    for i in range(25):
        put(store, i % 3, b"cq-%02d" % i, tags="TagA" if i % 2 else "TagB")
    put(store, 1, b"other", topic="U")
    store.wait_dispatched()
    before = {t: {q: [(m.queue_offset, m.phys_offset, m.body, m.tags)
                      for m in store.get("g", t, q, 0, 32).messages]
                  for q in store.queue_ids(t)} for t in ("T", "U")}
    assert [len(v) for v in before["T"].values()] == [9, 8, 8]
    if exit_kind == "clean":
        store.close()
        root = store_dir
    else:
        root = crash_copy(store, tmp_path / "crashed")
    shutil.rmtree(root / "consumequeue")

    reopened = make_store(root=root)
    assert reopened.recovery_report.abnormal is (exit_kind == "abnormal")
    after = {t: {q: [(m.queue_offset, m.phys_offset, m.body, m.tags)
                     for m in reopened.get("g", t, q, 0, 32).messages]
                 for q in reopened.queue_ids(t)} for t in ("T", "U")}
    assert after == before
    assert reopened.max_offset("T", 0) == 9
    assert put(reopened, 0, b"next").queue_offset == 9


# -- 57: commit log gone ----------------------------------------------------------------------
def test_deleting_every_commit_log_segment_destroys_the_queues(make_store, store_dir):
    store = make_store({"commit_log": {"segment_bytes": 1024}})
    for i in range(30):
        put(store, i % 2, b"x" * 40)
    store.close()
    segments = sorted((store_dir / "commitlog").iterdir())
    assert len(segments) > 1
    for path in segments:
        path.unlink()

    store = make_store({"commit_log": {"segment_bytes": 1024}})
    assert store.max_phys_offset == 0
    assert store.max_offset("T", 0) == 0 and store.max_offset("T", 1) == 0
    assert store.topics() == []
    assert store.recovery_report.consume_queue_units_dropped == {"T/0": 15, "T/1": 15}
    assert not any(p.is_file() for p in (store_dir / "consumequeue").rglob("*"))
    first = put(store, 0, b"fresh")
    assert (first.queue_offset, first.phys_offset) == (0, 0)
    store.wait_dispatched()
    got = store.get("g", "T", 0, 0, 32)
    assert [m.body for m in got.messages] == [b"fresh"]
    assert got.max_offset == 1


# -- 58: segment lengths ----------------------------------------------------------------------
def test_short_commit_log_file_is_extended_and_the_records_after_it_kept(make_store, store_dir):
    overrides = {"commit_log": {"segment_bytes": 1024}}
    store = make_store(overrides)
    results = [put(store, 0, b"y" * 60) for _ in range(20)]
    store.close()
    first = store_dir / "commitlog" / f"{0:020d}"
    os.truncate(first, 500)

    store = make_store(overrides)
    report = store.recovery_report
    assert any(first.name in note and "extended with zeros" in note for note in report.notes)
    assert os.path.getsize(first) == 1024
    lost = [r for r in results if r.phys_offset + r.size > 500 and r.phys_offset < 1024]
    kept = [r for r in results if r not in lost]
    assert len(lost) == 3 and len(kept) == 17
    assert [(q.offset, q.length) for q in report.quarantined] == [(lost[0].phys_offset,
                                                                   1024 - lost[0].phys_offset)]
    assert not report.clean
    for r in kept:
        assert store.message_at(r.phys_offset).body == b"y" * 60
    store.wait_dispatched()
    pulled = [m.queue_offset for m in read_all(store, 0)]
    assert pulled == [r.queue_offset for r in kept]
    assert store.max_offset("T", 0) == 20
    assert put(store, 0, b"after").queue_offset == 20


def test_zero_length_last_commit_log_file_is_deleted(make_store, store_dir):
    overrides = {"commit_log": {"segment_bytes": 1024}}
    store = make_store(overrides)
    acked = [(put(store, 0, b"z" * 60), b"z" * 60) for _ in range(5)]
    end = store.max_phys_offset
    store.close()
    empty = store_dir / "commitlog" / f"{1024:020d}"
    empty.touch()

    store = make_store(overrides)
    assert not empty.exists()
    assert any(empty.name in note for note in store.recovery_report.notes)
    assert store.max_phys_offset == end
    assert_holds_exactly(store, acked, 5)
    assert put(store, 0, b"z" * 60).phys_offset == end


# -- 59: pre-allocated zero segment ----------------------------------------------------------
@pytest.mark.parametrize("exit_kind", ["clean", "abnormal"])
def test_preallocated_zero_segment_is_removed(make_store, store_dir, tmp_path, exit_kind):
    seg = 4096
    overrides = {"commit_log": {"segment_bytes": seg}}
    store = make_store(overrides)
    acked = [(put(store, i % 2, b"w" * 100), b"w" * 100) for i in range(35)]
    end = store.max_phys_offset
    assert seg < end < 2 * seg  # the real last segment is the second one
    if exit_kind == "clean":
        store.close()
        root = store_dir
    else:
        root = crash_copy(store, tmp_path / "crashed")
    spare = root / "commitlog" / f"{2 * seg:020d}"
    spare.write_bytes(bytes(seg))

    reopened = make_store(overrides, root=root)
    report = reopened.recovery_report
    assert not spare.exists()
    assert str(spare) in report.deleted_files
    assert report.truncated_bytes == 0
    assert sorted(p.name for p in (root / "commitlog").iterdir()) == [f"{0:020d}", f"{seg:020d}"]
    assert reopened.max_phys_offset == end
    assert_holds_exactly(reopened, acked, 35)
    nxt = put(reopened, 0, b"w" * 100)
    assert (nxt.phys_offset, nxt.queue_offset) == (end, 18)
    assert not spare.exists()


# -- 61: checkpoint layout --------------------------------------------------------------------
def test_checkpoint_layout_after_clean_close(make_store, store_dir, manual_clock):
    store = make_store()
    put(store, 0, b"a", tags="TagA")
    manual_clock.advance(1000)
    logics = manual_clock.now
    put(store, 1, b"b", tags="TagA")
    manual_clock.advance(2345)
    physic = manual_clock.now
    # A prepared transaction message is flushed like any other but gets no consume-queue unit.
    prepared = put(store, 2, b"c", sysflag=0x4)
    assert prepared.store_timestamp == physic
    store.wait_dispatched()
    store.close()

    raw = (store_dir / "checkpoint").read_bytes()
    assert len(raw) == CHECKPOINT_BYTES
    assert raw[0:8] == physic.to_bytes(8, "big")
    assert raw[8:16] == logics.to_bytes(8, "big")
    fields = struct.unpack(">5q", raw[:40])
    assert fields[:3] == (physic, logics, 0)
    assert raw[40:] == bytes(CHECKPOINT_BYTES - 40)

    reopened = make_store()
    assert reopened.checkpoint.physic_msg_timestamp == physic
    assert reopened.checkpoint.logics_msg_timestamp == logics


# -- torn tails at random bytes ---------------------------------------------------------------
@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("damage", ["garbage", "zeros"])
def test_tail_torn_at_a_random_byte_keeps_an_exact_prefix(make_store, tmp_path, seed, damage):
    seg = 1 << 20
    rng = random.Random(seed)
    store = make_store()
    acked = put_random(store, rng, 40)
    end = store.max_phys_offset
    root = crash_copy(store, tmp_path / "crashed")
    original = read_at(root, 0, seg, seg)

    tear = rng.randrange(1, end)
    if damage == "garbage":
        stop = min(seg, end + rng.randrange(1, 500))
        write_at(root, tear, garbage_over(original[tear:stop], rng), seg)
    else:
        write_at(root, tear, bytes(end - tear), seg)
    # A record survives when it ends before the tear, or when the tear left its bytes as they were.
    damaged = read_at(root, 0, seg, seg)
    kept = 0
    for result, _ in acked:
        stop_at = result.phys_offset + result.size
        if damaged[result.phys_offset:stop_at] != original[result.phys_offset:stop_at]:
            break
        kept += 1
    assert kept < len(acked)
    kept_end = acked[kept - 1][0].phys_offset + acked[kept - 1][0].size if kept else 0

    crashed = make_store(root=root)
    report = crashed.recovery_report
    assert report.commit_log_end == crashed.max_phys_offset == kept_end
    assert report.truncated_bytes == len(damaged[kept_end:].rstrip(b"\0"))
    assert (report.stop_reason is not None) is (report.truncated_bytes > 0)
    assert report.records_checked == kept
    assert_holds_exactly(crashed, acked, kept)
    first_lost, body = acked[kept]
    again = put(crashed, first_lost.queue_id, body)
    assert (again.phys_offset, again.queue_offset) == (first_lost.phys_offset,
                                                        first_lost.queue_offset)


# -- several segments, tear in the last ------------------------------------------------------
@pytest.mark.parametrize("mark", ["kept", "removed"])
def test_tear_in_last_of_several_segments(make_store, store_dir, tmp_path, manual_clock, mark):
    seg = 4096
    overrides = {"commit_log": {"segment_bytes": seg}}
    rng = random.Random(7)
    acked = []
    store = make_store(overrides)
    for _ in range(60):
        manual_clock.advance(100)
        acked += put_random(store, rng, 1, max_body=120)
    session_one_last = manual_clock.now
    store.close()

    store = make_store(overrides)
    manual_clock.advance(10_000)
    for _ in range(60):
        manual_clock.advance(100)
        acked += put_random(store, rng, 1, max_body=120)
    end = store.max_phys_offset
    last_start = end - end % seg
    assert last_start >= 3 * seg
    root = crash_copy(store, tmp_path / "crashed")

    tear = rng.randrange(last_start + 1, end)
    write_at(root, tear, garbage_over(read_at(root, tear, end - tear, seg), rng), seg)
    kept = sum(1 for r, _ in acked if r.phys_offset + r.size <= tear)
    kept_end = max(last_start, acked[kept - 1][0].phys_offset + acked[kept - 1][0].size)

    # Abnormal recovery starts at the record mqstore.queued names (session one's close left
    # one; session two may have written a later one), unless the tear took it. Without it,
    # at the newest segment whose first record is older than the checkpoint's minimum time
    # (the checkpoint on disk is session one's).
    queued, _problem = read_queued(str(root))
    assert queued is not None
    if mark == "removed":
        remove_queued(str(root))
    min_time = session_one_last - 3000
    firsts = {}
    for result, _ in acked:
        firsts.setdefault(result.phys_offset - result.phys_offset % seg, result)
    scan_from = max((start for start, r in firsts.items()
                     if start > 0 and r.store_timestamp <= min_time), default=0)
    assert scan_from > 0
    if mark == "kept" and queued.end <= tear:
        scan_from = queued.phys_offset

    crashed = make_store(overrides, root=root)
    report = crashed.recovery_report
    assert report.abnormal is True
    assert report.scan_from == scan_from
    assert report.records_checked == sum(1 for r, _ in acked[:kept] if r.phys_offset >= scan_from)
    assert report.commit_log_end == crashed.max_phys_offset == kept_end
    assert report.truncated_bytes == end - tear
    assert crashed.min_phys_offset == 0
    assert_holds_exactly(crashed, acked, kept)
    first_lost, body = acked[kept]
    again = put(crashed, first_lost.queue_id, body)
    assert (again.phys_offset, again.queue_offset) == (first_lost.phys_offset,
                                                        first_lost.queue_offset)


# -- consume-queue damage --------------------------------------------------------------------
def test_deleted_middle_consume_queue_file(make_store, store_dir):
    overrides = {"consume_queue": {"file_units": 10}}
    store = make_store(overrides)
    acked = [(put(store, 0, b"q-%02d" % i), b"q-%02d" % i) for i in range(35)]
    store.close()
    cq_dir = store_dir / "consumequeue" / "T" / "0"
    assert sorted(p.name for p in cq_dir.iterdir()) == [f"{i * 200:020d}" for i in range(4)]
    (cq_dir / f"{200:020d}").unlink()

    store = make_store(overrides)
    assert (store.min_offset("T", 0), store.max_offset("T", 0)) == (0, 35)
    bodies = [b for _, b in acked]
    got = store.get("g", "T", 0, 0, 32)
    assert (got.status, got.next_begin_offset) == (GetStatus.FOUND, 10)
    assert [m.body for m in got.messages] == bodies[:10]
    # The missing file's offsets answer OFFSET_FOUND_NULL and point at the next file (spec 10.6).
    got = store.get("g", "T", 0, 13, 32)
    assert (got.status, got.next_begin_offset, got.messages) == (GetStatus.OFFSET_FOUND_NULL, 20, [])
    for start in (20, 30):
        got = store.get("g", "T", 0, start, 32)
        assert [(m.queue_offset, m.body) for m in got.messages] == [
            (i, bodies[i]) for i in range(start, min(start + 10, 35))]
    nxt = put(store, 0, b"q-35")
    assert nxt.queue_offset == 35
    store.wait_dispatched()
    assert [m.body for m in store.get("g", "T", 0, 35, 32).messages] == [b"q-35"]


@pytest.mark.parametrize("garbage", ["invalid_units", "units_past_the_log_end"])
def test_garbage_units_at_consume_queue_tail_are_cut(make_store, store_dir, tmp_path, garbage):
    overrides = {"consume_queue": {"file_units": 10}}
    store = make_store(overrides)
    acked = [(put(store, 0, b"g-%d" % i), b"g-%d" % i) for i in range(5)]
    end = store.max_phys_offset
    root = crash_copy(store, tmp_path / "crashed")
    rng = random.Random(len(garbage))
    units = bytearray(rng.randrange(256) for _ in range(3 * CQ_UNIT))
    if garbage == "invalid_units":
        units[8:12] = struct.pack(">i", -rng.randrange(1, 1 << 31))  # first unit: size <= 0
    else:
        for i in range(3):  # positive offsets and sizes, but past the end of the commit log
            struct.pack_into(">qi", units, i * CQ_UNIT, end + rng.randrange(1 << 40),
                             rng.randrange(1, 1 << 20))
    with open(root / "consumequeue" / "T" / "0" / f"{0:020d}", "r+b") as f:
        f.seek(5 * CQ_UNIT)
        f.write(units)

    crashed = make_store(overrides, root=root)
    assert crashed.max_offset("T", 0) == 5
    if garbage == "units_past_the_log_end":
        assert crashed.recovery_report.consume_queue_units_dropped == {"T/0": 3}
    assert_holds_exactly(crashed, acked, 5)
    assert crashed.get("g", "T", 0, 5, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
    nxt = put(crashed, 0, b"g-5")
    assert (nxt.queue_offset, nxt.phys_offset) == (5, end)
    crashed.wait_dispatched()
    got = crashed.get("g", "T", 0, 5, 32)
    assert (got.max_offset, [m.body for m in got.messages]) == (6, [b"g-5"])


def test_unit_cut_by_recovery_stays_cut_after_the_next_crash(make_store, tmp_path):
    store = make_store()
    acked = [(put(store, i % 2, b"one-%d" % i), b"one-%d" % i) for i in range(6)]
    root = crash_copy(store, tmp_path / "crashed")
    torn = acked[-1][0]
    assert torn.queue_id == 1
    write_at(root, torn.phys_offset + 4, b"\xee" * 8, 1 << 20)

    first = make_store(root=root)
    assert first.recovery_report.consume_queue_units_dropped == {"T/1": 1}
    assert first.max_offset("T", 1) == torn.queue_offset
    # New records of queue 0 now occupy the torn record's place in the commit log.
    later = [(put(first, 0, b"two-%d" % i), b"two-%d" % i) for i in range(3)]
    assert later[0][0].phys_offset == torn.phys_offset

    second = make_store(root=crash_copy(first, tmp_path / "crashed-again"))
    assert second.max_offset("T", 1) == torn.queue_offset
    assert second.get("g", "T", 1, torn.queue_offset, 32).status is GetStatus.OFFSET_OVERFLOW_ONE
    assert [m.queue_id for m in read_queue(second, 1)] == [1] * torn.queue_offset
    assert_holds_exactly(second, acked[:5] + later, 8)


# -- idempotence, locking --------------------------------------------------------------------
def test_second_recovery_is_clean(make_store, tmp_path):
    store = make_store()
    acked = put_random(store, random.Random(3), 15)
    root = crash_copy(store, tmp_path / "crashed")
    last = acked[-1][0]
    write_at(root, last.phys_offset + 10, b"\xff" * 30, 1 << 20)

    first = make_store(root=root)
    assert first.recovery_report.truncated_bytes > 0
    assert_holds_exactly(first, acked, 14)
    state = (first.max_phys_offset, queue_snapshot(first))

    # Crash again right away: nothing more to cut.
    second = make_store(root=crash_copy(first, tmp_path / "crashed-again"))
    report = second.recovery_report
    assert report.abnormal is True
    assert (report.truncated_bytes, report.stop_reason, report.consume_queue_units_dropped,
            report.deleted_files) == (0, None, {}, [])
    assert report.commit_log_end == last.phys_offset
    assert (second.max_phys_offset, queue_snapshot(second)) == state

    # Then a clean close and a normal open: still nothing to cut.
    first.close()
    third = make_store(root=root)
    report = third.recovery_report
    assert report.abnormal is False
    assert report.clean and report.stop_reason is None and report.deleted_files == []
    assert (third.max_phys_offset, queue_snapshot(third)) == state


def test_second_writable_open_is_refused_and_read_only_works(make_store, store_dir):
    store = make_store()
    acked = [(put(store, 1, b"held"), b"held")]
    store.wait_dispatched()
    with pytest.raises(StoreLockedError, match="already open for writing"):
        make_store()
    reader = make_store(read_only=True)
    assert reader.max_phys_offset == store.max_phys_offset
    assert_holds_exactly(reader, acked, 1)
    assert reader.put(Message("T", b"no", queue_id=1)).status is PutStatus.SERVICE_NOT_AVAILABLE
    # The refused open did not disturb the writer.
    assert put(store, 1, b"still writable").queue_offset == 1
    assert (store_dir / "abort").exists()

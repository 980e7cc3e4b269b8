"""The transient-pool writer and the flush loop (spec 10.2, 10.4; behaviour 69)."""

from __future__ import annotations

import os
import signal
from collections import namedtuple
from pathlib import Path

import pytest

from mqstore import GetStatus, Message, MessageStore, PutStatus, load_config
from mqstore.storage import shared_segment, transient_pool
from mqstore.storage.transient_pool import TransientPool
from mqstore.testing import wait_for

SEG = 64 * 1024
DiskUsage = namedtuple("DiskUsage", "total used free")
QUIET = {"commit_interval_ms": 60_000, "commit_thorough_interval_ms": 60_000,
         "commit_least_pages": 1_000}


def _pool(**writer):
    return {"writer": {"kind": "transient_pool", **writer},
            "commit_log": {"segment_bytes": SEG}}


def _batch(n, size=300, start=0):
    return [Message("T", b"%06d" % (start + i) + b"." * size, tags=f"t{i % 2}",
                    keys=[f"k{start + i}"], queue_id=i % 3) for i in range(n)]


def _shm_names() -> set[str]:
    return set(os.listdir("/dev/shm"))


def _made_segments(monkeypatch) -> list[str]:
    """The names of the shared-memory segments this process creates from now on (other
    processes on the machine make and drop their own meanwhile)."""
    made: list[str] = []
    real = shared_segment._shared_memory

    def recording(name, create, size, tracked):
        shm = real(name, create, size, tracked)
        if create:
            made.append(shm.name)
        return shm
    monkeypatch.setattr(shared_segment, "_shared_memory", recording)
    return made


@pytest.mark.parametrize("worker", ["thread", "process"])
def test_both_writers_write_byte_identical_files(tmp_path, make_store, worker):
    batches = [_batch(120, start=i * 120) for i in range(5)]
    singles = [Message("U", b"single %d" % i, keys=["s"], queue_id=0) for i in range(40)]
    for kind in ("mmap", "transient_pool"):
        store = make_store({"writer": {"kind": kind}, "commit_log": {"segment_bytes": SEG},
                            "flush": {"worker": worker}}, root=tmp_path / kind)
        for batch, single in zip(batches, [singles[:20], singles[20:], [], [], []]):
            assert store.put_batch(batch).status is PutStatus.PUT_OK
            for m in single:
                assert store.put(m).status is PutStatus.PUT_OK
        store.close()
    mm, tp = tmp_path / "mmap" / "commitlog", tmp_path / "transient_pool" / "commitlog"
    names = sorted(os.listdir(mm))
    assert len(names) >= 3  # the load rolled segments, blank records included
    assert sorted(os.listdir(tp)) == names
    for name in names:
        assert (tp / name).read_bytes() == (mm / name).read_bytes(), name
    for rel in ("consumequeue/T/0/00000000000000000000", "consumequeue/U/0/00000000000000000000"):
        assert (tmp_path / "transient_pool" / rel).read_bytes() == (tmp_path / "mmap" / rel).read_bytes()


def test_a_put_is_invisible_until_committed(make_store):
    store = make_store(_pool(**QUIET))
    r = store.put(Message("T", b"hello", queue_id=0))
    assert r.status is PutStatus.PUT_OK and r.phys_offset == 0
    # Behaviour 69: the readable end does not move before the commit.
    assert store.max_phys_offset == 0
    assert store.message_at(0) is None
    assert store.get("g", "T", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    with open(os.path.join(store.root, "commitlog", "0" * 20), "rb") as f:
        assert f.read(r.size) == bytes(r.size)  # nothing in the file yet
    store.flush_commit_log()
    assert store.max_phys_offset == r.size
    assert store.message_at(0).body == b"hello"
    store.wait_dispatched()
    assert [m.body for m in store.get("g", "T", 0, 0).messages] == [b"hello"]


def _commit_pass(scheduler, seconds: float = 86_400.0) -> None:
    """A commit pass of the flush loop ``seconds`` on, then a tick of the store's listener,
    which has learnt by then what the pass committed. First a pass at the current time: the
    flush loop is running, its intervals counted from now (a loop that starts after the move,
    on a loaded machine, would count them from there and find nothing due)."""
    scheduler.run("commit", seconds=0.0)
    scheduler.run("commit", seconds=seconds)
    scheduler.run("metadata", seconds=1.0)


def test_the_commit_interval_commits_without_being_asked(make_store, manual_scheduler):
    store = make_store(_pool(commit_interval_ms=20, commit_thorough_interval_ms=20),
                       scheduler=manual_scheduler)
    r = store.put(Message("T", b"soon", queue_id=0))
    _commit_pass(manual_scheduler)
    assert store.max_phys_offset == r.size
    assert store.message_at(0).body == b"soon"


def test_least_pages_hold_a_commit_back_until_enough_is_pending(make_store, manual_scheduler):
    store = make_store(_pool(commit_interval_ms=20, commit_thorough_interval_ms=60_000,
                             commit_least_pages=2), scheduler=manual_scheduler)
    small = store.put(Message("T", b"x" * 100, queue_id=0))
    _commit_pass(manual_scheduler, seconds=0.05)  # past the interval, not the thorough one
    assert store.max_phys_offset == 0  # 1 page pending, 2 needed
    rs = store.put_batch([Message("T", b"y" * 3000, queue_id=0) for _ in range(3)])
    end = int(rs.phys_offsets[-1] + rs.sizes[-1])
    _commit_pass(manual_scheduler, seconds=0.05)
    assert store.max_phys_offset == end
    assert store.message_at(small.phys_offset).body == b"x" * 100


def test_sync_flush_with_the_pool_acknowledges_only_flushed_bytes(make_store):
    store = make_store({**_pool(**QUIET), "flush": {"policy": "sync", "worker": "process"}})
    r = store.put(Message("T", b"durable", queue_id=0))
    assert r.status is PutStatus.PUT_OK
    assert store.flushed_offset >= r.phys_offset + r.size
    assert store.message_at(r.phys_offset).body == b"durable"
    store.wait_dispatched()
    assert [m.body for m in store.get("g", "T", 0, 0).messages] == [b"durable"]


def test_segments_roll_through_the_pool_and_buffers_come_back(make_store):
    store = make_store(_pool(transient_pool_buffers=2))
    for i in range(8):  # about 10 segments through 2 buffers
        assert store.put_batch(_batch(200, start=i * 200)).status is PutStatus.PUT_OK
    store.wait_dispatched()
    assert len(store.internals.commit_log.segments.segments) >= 8
    got = store.get("g", "T", 1, 0, 32)
    assert [m.body[:6] for m in got.messages[:2]] == [b"000001", b"000004"]
    assert store.internals.writer.pool.free_count() >= 1


def test_with_fast_fail_a_dry_pool_refuses_the_put_with_a_clear_status(make_store):
    store = make_store({**_pool(transient_pool_buffers=2, commit_interval_ms=50,
                                fast_fail_no_buffer=True),
                        "flush": {"worker": "process"}})
    pid = store.internals.flush_client.supervisor.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        results = []
        for i in range(40):  # two segments' worth fill both buffers; the third cannot open
            results.append(store.put_batch(_batch(20, size=1000, start=i * 20)))
            if results[-1].status is not PutStatus.PUT_OK:
                break
        refused = results[-1]
        assert refused.status is PutStatus.CREATE_MAPPED_FILE_FAILED
        assert "transient pool exhausted" in refused.error
        assert "transient_pool_buffers" in refused.error
        ok = len(results) - 1
        ends = store.internals.commit_log.segments.write_end
    finally:
        os.kill(pid, signal.SIGCONT)
    # The refused batch wrote nothing and took no queue offsets.
    after = store.put_batch(_batch(3, start=9_000))
    assert after.status is PutStatus.PUT_OK
    assert after.phys_offsets[0] >= ends
    assert int(after.queue_offsets[0]) == 7 * ok  # each batch of 20 gave queue 0 seven
    store.wait_dispatched()
    assert store.max_offset("T", 0) == int(after.queue_offsets[0]) + 1


def test_a_dry_pool_writes_the_next_segment_through_its_map(tmp_path, make_store, caplog):
    """RocketMQ's default (no fast fail): producers that outrun the commits are not refused;
    the segment that finds no buffer is written like the mmap writer's, readable only once
    everything before it is committed, and the files equal an mmap store's."""
    batches = [_batch(20, size=1000, start=i * 20) for i in range(12)]  # about 4 segments
    mm = make_store({"commit_log": {"segment_bytes": SEG}}, root=tmp_path / "mmap")
    for b in batches:
        assert mm.put_batch(b).status is PutStatus.PUT_OK
    mm.close()
    store = make_store({**_pool(transient_pool_buffers=2, commit_interval_ms=50),
                        "flush": {"worker": "process"}}, root=tmp_path / "pool")
    pid = store.internals.flush_client.supervisor.process.pid
    os.kill(pid, signal.SIGSTOP)
    try:
        with caplog.at_level("WARNING", logger="mqstore.append.pool_writer"):
            results = [store.put_batch(b) for b in batches]
        assert [r.status for r in results] == [PutStatus.PUT_OK] * len(batches)
        assert store.internals.writer.direct_segments >= 1
        assert "transient pool dry" in caplog.text
        assert store.max_phys_offset == 0  # nothing committed yet, the direct segment included
    finally:
        os.kill(pid, signal.SIGCONT)
    store.flush_commit_log()
    assert store.max_phys_offset == store.internals.commit_log.segments.write_end
    store.wait_dispatched()
    want = [b"%06d" % (b * 20 + i) for b in range(12) for i in range(0, 20, 3)]
    assert store.max_offset("T", 0) == len(want)
    got = [m.body[:6] for off in range(0, len(want), 16)
           for m in store.get("g", "T", 0, off, 16).messages]
    assert got == want
    store.close()
    names = sorted(os.listdir(tmp_path / "mmap" / "commitlog"))
    assert len(names) >= 4
    assert sorted(os.listdir(tmp_path / "pool" / "commitlog")) == names
    for name in names:
        assert ((tmp_path / "pool" / "commitlog" / name).read_bytes()
                == (tmp_path / "mmap" / "commitlog" / name).read_bytes()), name


def test_pool_buffers_are_mapped_when_the_pool_opens():
    pool = TransientPool(2, 1 << 20)
    other = TransientPool(2, 1 << 20, name=pool.name)
    try:
        for p in (pool, other):
            rss_before = _rss_kib()
            p.warm()
            assert _rss_kib() - rss_before >= 2 * 1024 - 64  # both buffers now in the process
    finally:
        other.close()
        pool.close()


def _rss_kib() -> int:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssShmem:"))


def test_explicit_flush_honours_least_pages(make_store):
    store = make_store({"flush": {"policy": "async", "interval_ms": 60_000,
                                  "thorough_interval_ms": 60_000}})
    store.put(Message("T", b"x" * 100, queue_id=0))
    assert store.flush_commit_log(4) == 0
    assert store.internals.flush_client.status()["fsyncs"] == 0
    assert store.flush_commit_log(0) > 0
    assert store.internals.flush_client.status()["fsyncs"] == 1


def test_flush_worker_is_a_separate_process_and_leaves_nothing(tmp_path):
    cfg = load_config(overrides={**_pool(), "plugins": {"load_entry_points": False},
                                 "flush": {"policy": "sync"}})
    store = MessageStore.open(tmp_path / "s", config=cfg)
    status = store.internals.flush_client.status()
    assert status["mode"] == "process" and status["alive"] and status["pid"] != os.getpid()
    proc = store.internals.flush_client.supervisor.process
    mine = {store.internals.writer.pool.name.lstrip("/"), store.internals.channels.name.lstrip("/")}
    assert mine <= _shm_names()
    assert store.put(Message("T", b"a", queue_id=0)).status is PutStatus.PUT_OK
    store.close()
    assert not proc.is_alive()
    assert not mine & _shm_names()


def test_a_killed_flush_worker_is_restarted_and_sync_puts_continue(tmp_path):
    cfg = load_config(overrides={"plugins": {"load_entry_points": False},
                                 "flush": {"policy": "sync"}, "commit_log": {"segment_bytes": SEG}})
    store = MessageStore.open(tmp_path / "s", config=cfg)
    mine = {store.internals.channels.name.lstrip("/")}
    try:
        first = store.put(Message("T", b"before", queue_id=0))
        victim = store.internals.flush_client.supervisor.process.pid
        os.kill(victim, signal.SIGKILL)
        wait_for(lambda: store.internals.flush_client.status()["restarts"]
                 and store.internals.flush_client.status()["alive"], what="the flush worker's restart")
        status = store.internals.flush_client.status()
        assert status["restarts"] == 1 and status["alive"] and status["pid"] != victim
        assert "flush worker" in status["failures"][0] and "restarting" in status["failures"][0]
        second = store.put(Message("T", b"after", queue_id=0))
        assert second.status is PutStatus.PUT_OK
        assert store.flushed_offset >= second.phys_offset + second.size
        with pytest.raises(Exception, match="flush worker"):
            store.flush_commit_log()
        store.wait_dispatched()
        assert [m.body for m in store.get("g", "T", 0, 0).messages] == [b"before", b"after"]
        assert first.queue_offset == 0
    finally:
        store.close()
    assert not (Path(tmp_path) / "s" / "abort").exists()
    assert not mine & _shm_names()


def test_pool_is_attached_by_name_and_freed_by_its_owner():
    pool = TransientPool(2, 8192)
    other = TransientPool(2, 8192, name=pool.name)
    try:
        buf = pool.lend(0)
        buf[:5] = b"hello"
        assert bytes(other.buffer_of(0)[:5]) == b"hello"
        pool.lend(8192)
        with pytest.raises(Exception, match="no free buffer"):
            pool.lend(16384)
        assert pool.take_back(8192) == 1 and pool.free_count() == 1
    finally:
        other.close()
        pool.close()
    assert pool.name.lstrip("/") not in _shm_names()
    with pytest.raises(ValueError, match="1 to 512 buffers"):
        TransientPool(0, 8192)


def test_a_pool_the_shared_memory_cannot_hold_is_refused_with_its_sizes(monkeypatch):
    monkeypatch.setattr(transient_pool.shutil, "disk_usage",
                        lambda path: DiskUsage(total=1 << 30, used=(1 << 30) - (1 << 20),
                                               free=1 << 20))
    made = _made_segments(monkeypatch)
    with pytest.raises(transient_pool.PoolTooLargeError) as err:
        TransientPool(2, 1 << 20)  # refused before any shared memory is made
    assert "2 x 1048576 bytes = 2097152 bytes" in str(err.value)
    assert "1048576 bytes free in /dev/shm" in str(err.value)
    assert "writer.transient_pool_buffers" in str(err.value)
    assert made == []


def test_a_store_whose_pool_does_not_fit_fails_to_open_and_leaves_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(transient_pool.shutil, "disk_usage",
                        lambda path: DiskUsage(total=1 << 30, used=1 << 30, free=0))
    made = _made_segments(monkeypatch)
    cfg = load_config(overrides={**_pool(), "plugins": {"load_entry_points": False}})
    with pytest.raises(transient_pool.PoolTooLargeError, match="transient_pool_buffers"):
        MessageStore.open(tmp_path / "s", config=cfg)
    assert not set(made) & _shm_names()
    cfg = load_config(overrides={"commit_log": {"segment_bytes": SEG},
                                 "plugins": {"load_entry_points": False}})
    with MessageStore.open(tmp_path / "s", config=cfg) as store:  # not locked, not damaged
        assert store.put(Message("T", b"after", queue_id=0)).status is PutStatus.PUT_OK


# -- the pool of a killed store is found by the store's id, wherever the directory went -------
@pytest.mark.parametrize("read_only_first", [False, True])
def test_a_killed_stores_pool_is_written_back_after_the_directory_is_renamed(tmp_path,
                                                                               read_only_first):
    """The whole process group killed while the pool holds uncommitted records, the directory
    renamed, then reopened under its new name (after a read-only open there, too): every
    acknowledged message is back."""
    from mqstore.testing.faults import FaultWriter, audit, small_store_overrides

    overrides = small_store_overrides(writer={"kind": "transient_pool", **QUIET},
                                      flush={"policy": "async"})
    first, moved = tmp_path / "first", tmp_path / "moved"
    writer = FaultWriter(str(first), overrides, seed=7, count=1 << 30).start()
    assert writer.read_until(400)
    assert writer.kill(signal.SIGKILL) == -signal.SIGKILL
    os.rename(first, moved)
    if read_only_first:
        with MessageStore.open(moved, read_only=True):
            pass
    store = MessageStore.open(moved, config=load_config(overrides=overrides))
    try:
        assert store.recovery_report.abnormal
        assert any("transient pool held" in note for note in store.recovery_report.notes)
        result = audit(store, 7, writer.acks)
        assert len(writer.acks) >= 400
        assert (result.lost, result.wrong) == ([], []), result
    finally:
        store.close()


def test_a_copy_of_a_store_never_takes_the_originals_shared_memory(tmp_path):
    """A copy carries the original's id: opened while the original's writer runs, it takes an
    id of its own and leaves the original's pool alone, which the original's next open still
    writes back after a kill."""
    import shutil

    from mqstore.storage.shared_segment import store_segment_name
    from mqstore.storage.store_id import recorded_id
    from mqstore.lifecycle.store_meta import load_meta
    from mqstore.testing.faults import FaultWriter, audit, small_store_overrides

    overrides = small_store_overrides(writer={"kind": "transient_pool", **QUIET},
                                      flush={"policy": "async"})
    original, copy = tmp_path / "original", tmp_path / "copy"
    writer = FaultWriter(str(original), overrides, seed=5, count=1 << 30).start()
    try:
        assert writer.read_until(300)
        original_id = recorded_id(load_meta(str(original))[0])
        pool = store_segment_name(original_id, "pool")
        shutil.copytree(original, copy, ignore=shutil.ignore_patterns("lock"))
        with MessageStore.open(copy, config=load_config(overrides=overrides)) as store:
            assert any(f"is a copy of the store at {original}" in note
                       for note in store.recovery_report.notes)
            assert store.put(Message("T", b"copy", queue_id=0)).status is PutStatus.PUT_OK
        copy_id = recorded_id(load_meta(str(copy))[0])
        assert copy_id not in (None, original_id)
        assert pool in _shm_names()
    finally:
        writer.kill(signal.SIGKILL)
    with MessageStore.open(original, config=load_config(overrides=overrides)) as store:
        assert any("transient pool held" in note for note in store.recovery_report.notes)
        result = audit(store, 5, writer.acks)
        assert (result.lost, result.wrong) == ([], []), result
    assert pool not in _shm_names()

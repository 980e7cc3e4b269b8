"""What the once-a-second flush of derived files promises in ``mqstore.queued``, and that the
names of files it forces outlive a power loss (``derived_flush``, ``SegmentQueue.flush``, the
flush loop)."""

from __future__ import annotations

import os

import pytest

from mqstore import Message, MessageStore, PutStatus, load_config
from mqstore.dispatch.derived_flush import DerivedFlush
from mqstore.storage import queue_progress, segment_queue
from mqstore.storage.queue_progress import DispatchMark, read_queued
from mqstore.runtime.workers import flush_worker


class _Files:
    """The view, dispatchers and manifest of a ``DerivedFlush``, logging what is forced."""

    def __init__(self, log: list) -> None:
        self.log = log
        self.consume_queues: dict = {}
        self.on_force = None

    def flush_queues(self) -> None:
        self.log.append("queues")
        if self.on_force is not None:
            self.on_force()

    def persist(self) -> None:
        self.log.append("persist")

    def update(self, queues) -> None:
        self.log.append("manifest")


def _flush(tmp_path, marks: list, flushed: list) -> tuple[DerivedFlush, _Files]:
    files = _Files([])
    return DerivedFlush(str(tmp_path), files, files, files, lambda: marks[0],
                        lambda: flushed[0]), files


def _written(tmp_path) -> DispatchMark | None:
    mark, problem = read_queued(str(tmp_path))
    assert problem is None
    return mark


def test_the_mark_is_taken_before_the_files_are_forced(tmp_path):
    """Records dispatched while the queues are being forced may have missed the force."""
    a, b = DispatchMark(0, 100, 1), DispatchMark(100, 100, 2)
    marks, flushed = [a], [1 << 40]
    flush, files = _flush(tmp_path, marks, flushed)
    files.on_force = lambda: marks.__setitem__(0, b)  # dispatch moves on meanwhile
    flush()
    assert files.log == ["queues", "persist", "manifest"]
    assert _written(tmp_path) == a
    flush()
    assert _written(tmp_path) == b


def test_a_mark_waits_for_the_commit_log_to_flush_its_record(tmp_path):
    """Async flush: dispatch runs ahead of the flushed end; a mark is written only once its
    record's bytes are flushed too, the newest such one."""
    marks, flushed = [DispatchMark(0, 100, 1)], [50]
    flush, _files = _flush(tmp_path, marks, flushed)
    flush()
    assert _written(tmp_path) is None
    marks[0] = DispatchMark(100, 100, 2)
    flushed[0] = 150
    flush()
    assert _written(tmp_path) == DispatchMark(0, 100, 1)
    marks[0] = DispatchMark(200, 100, 3)
    flush()
    flushed[0] = 300
    marks[0] = DispatchMark(300, 100, 4)
    flush()
    assert _written(tmp_path) == DispatchMark(200, 100, 3)


def test_no_mark_before_anything_was_dispatched(tmp_path):
    flush, files = _flush(tmp_path, [None], [1 << 40])
    flush()
    assert files.log == ["queues", "persist", "manifest"]
    assert not os.path.exists(queue_progress.queued_path(str(tmp_path)))


def test_a_mark_that_cannot_be_written_is_tried_again(tmp_path, monkeypatch):
    a = DispatchMark(0, 100, 1)
    flush, _files = _flush(tmp_path, [a], [1 << 40])
    real = queue_progress.write_queued

    def full(root, mark):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr("mqstore.dispatch.derived_flush.write_queued", full)
    flush()
    assert _written(tmp_path) is None
    monkeypatch.setattr("mqstore.dispatch.derived_flush.write_queued", real)
    flush()
    assert _written(tmp_path) == a


def test_a_forced_file_s_name_is_forced_too(tmp_path, monkeypatch):
    """A consume-queue file created in a new queue directory: the flush that forces its bytes
    forces the entries of the file and of every directory created for it."""
    synced = []
    monkeypatch.setattr(segment_queue, "sync_dir", synced.append)
    root = tmp_path / "cq"
    root.mkdir()
    queue = segment_queue.SegmentQueue(str(root / "T" / "0"), 4096)
    seg = queue.create_next()
    seg.write(b"x" * 20)
    queue.flush()
    assert sorted(synced) == sorted([str(root), str(root / "T"), str(root / "T" / "0")])
    synced.clear()
    seg.write(b"y" * 20)
    queue.flush()
    assert synced == []
    queue.close()


def test_the_flush_loop_forces_a_new_segment_s_name(tmp_path, monkeypatch):
    """A sync-flush put into a new commit-log segment is acknowledged after the directory
    entry of that segment is forced as well as its bytes (the flush loop on a thread of this
    process, where the spy is)."""
    synced = []
    real = flush_worker.sync_dir
    monkeypatch.setattr(flush_worker, "sync_dir", lambda d: (synced.append(d), real(d)))
    overrides = {"flush": {"policy": "sync", "worker": "thread"},
                 "commit_log": {"segment_bytes": 4096}, "plugins": {"load_entry_points": False}}
    directory = str(tmp_path / "s" / "commitlog")
    with MessageStore.open(tmp_path / "s", load_config(overrides=overrides)) as store:
        for i in range(40):  # about 10 segments
            assert store.put(Message("T", b"%03d" % i + bytes(300))).status is PutStatus.PUT_OK
            assert synced.count(directory) == len(os.listdir(directory)), i


@pytest.mark.parametrize("loops", ["process", "thread"])
def test_a_clean_close_leaves_the_last_record_as_the_mark(tmp_path, loops):
    """Closed at once after the puts, before any periodic flush: the close records it."""
    overrides = {"dispatch": {"worker": loops}, "flush": {"worker": loops},
                 "plugins": {"load_entry_points": False}}
    with MessageStore.open(tmp_path / "s", load_config(overrides=overrides)) as store:
        results = [store.put(Message("T", b"m%d" % i)) for i in range(10)]
        last = store.message_at(results[-1].phys_offset)
    assert _written(tmp_path / "s") == DispatchMark(last.phys_offset, last.size,
                                                    last.store_timestamp)

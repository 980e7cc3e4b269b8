"""Flush policies as seen by a producer, and the put lock's busy rule (spec 10.1, 10.4)."""

from __future__ import annotations

import threading
import time

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.runtime.workers import flush_worker


def _msg(**kw):
    return Message(topic="T", body=b"x" * 100, queue_id=0, **kw)


def test_sync_put_returns_after_its_bytes_are_flushed(make_store):
    store = make_store({"flush": {"policy": "sync"}})
    r = store.put(_msg())
    assert r.status is PutStatus.PUT_OK
    assert store.flushed_offset >= r.phys_offset + r.size
    rs = store.put_batch([_msg(), _msg()])
    assert rs.status is PutStatus.PUT_OK
    assert store.flushed_offset >= int(rs.phys_offsets[-1] + rs.sizes[-1])


def test_sync_wait_false_returns_before_the_flush(make_store, monkeypatch):
    store = make_store({"flush": {"policy": "sync", "interval_ms": 60_000}})
    r = store.put(_msg(properties={"WAIT": "false"}))
    assert r.status is PutStatus.PUT_OK
    assert store.flushed_offset < r.phys_offset + r.size
    # Consumers only see flushed data under sync flush (behaviour 38).
    assert store.get("g", "T", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE
    store.flush_commit_log(0)
    store.wait_dispatched()
    assert [m.queue_offset for m in store.get("g", "T", 0, 0).messages] == [0]


@pytest.mark.loops("thread")
def test_sync_flush_timeout_keeps_the_message(make_store, monkeypatch):
    store = make_store({"flush": {"policy": "sync", "sync_timeout_ms": 50, "interval_ms": 60_000}})
    real_force = flush_worker.force

    def slow_force(fd):
        time.sleep(0.2)
        real_force(fd)

    monkeypatch.setattr(flush_worker, "force", slow_force)  # the loop runs on a thread here
    r = store.put(_msg())
    assert r.status is PutStatus.FLUSH_DISK_TIMEOUT
    assert r.status.stored
    monkeypatch.setattr(flush_worker, "force", real_force)
    store.flush_commit_log(0)
    store.wait_dispatched()
    got = store.get("g", "T", 0, 0).messages
    assert [(m.phys_offset, m.body) for m in got] == [(r.phys_offset, b"x" * 100)]


def test_async_flush_waits_for_least_pages(make_store):
    store = make_store({"flush": {"policy": "async", "interval_ms": 60_000}})
    r = store.put(_msg())
    assert store.flushed_offset == 0
    assert store.flush_commit_log(4) == 0  # one 100-byte record dirties no 4 whole pages
    big = store.put_batch([Message(topic="T", body=b"y" * 4000, queue_id=0) for _ in range(5)])
    end = int(big.phys_offsets[-1] + big.sizes[-1])
    assert store.flush_commit_log(4) == end
    assert r.phys_offset + r.size <= end


def test_async_consumers_see_unflushed_data(make_store):
    store = make_store({"flush": {"policy": "async", "interval_ms": 60_000}})
    store.put(_msg())
    store.wait_dispatched()
    assert store.flushed_offset == 0
    assert store.get("g", "T", 0, 0).status is GetStatus.FOUND


def test_checkpoint_records_the_last_flushed_store_time(make_store, manual_clock):
    store = make_store({"flush": {"policy": "sync"}})
    manual_clock.now = 1_700_000_000_555
    store.put(_msg())
    assert store.checkpoint.physic_msg_timestamp == 1_700_000_000_555


def test_put_lock_held_too_long_answers_os_page_cache_busy(make_store, manual_clock, monkeypatch):
    store = make_store()
    entered, release = threading.Event(), threading.Event()
    real_write = store.internals.writer.write

    def stuck_write(segment, data):
        entered.set()
        release.wait(10)
        return real_write(segment, data)

    monkeypatch.setattr(store.internals.writer, "write", stuck_write)
    worker = threading.Thread(target=store.put, args=(_msg(),))
    worker.start()
    assert entered.wait(5)
    assert store.lock_held_ms() == 0
    manual_clock.advance(1001)
    assert store.lock_held_ms() == 1001
    busy = store.put(_msg())
    assert busy.status is PutStatus.OS_PAGE_CACHE_BUSY
    assert "1001 ms" in busy.error
    release.set()
    worker.join(5)
    monkeypatch.setattr(store.internals.writer, "write", real_write)
    assert store.lock_held_ms() == 0
    assert store.put(_msg()).queue_offset == 1  # the busy put wrote nothing


def test_second_writer_in_the_same_process_is_refused(make_store, store_dir):
    from mqstore.errors import StoreLockedError
    make_store()
    with pytest.raises(StoreLockedError, match="already open for writing"):
        make_store()
    reader = make_store(read_only=True)
    assert reader.read_only

"""``MessageStore.put_counts``: messages appended, their bytes, and puts refused with a status,
per store and exact whatever thread puts (RocketMQ's StoreStatsService totals)."""

from __future__ import annotations

import threading

import pytest

from mqstore import Message, MessageBatch, PutCounts, PutStatus
from mqstore.errors import StoreClosedError
from mqstore.running_flags import DISK_FULL

THREADS, PUTS = 4, 150


def test_every_kind_of_answer_is_counted(make_store, tmp_path):
    store = make_store()
    assert store.put_counts() == PutCounts(0, 0, 0)
    batch = store.put_batch(MessageBatch(topic="t", bodies=[b"x"] * 5, queue_ids=0))
    single = store.put(Message("t", b"y", queue_id=1))
    assert store.put_counts() == PutCounts(6, batch.wrote_bytes + single.size, 0)
    assert store.put(Message("t", None, queue_id=0)).status is PutStatus.MESSAGE_ILLEGAL
    assert store.put_batch([Message("t", b"a"), Message("t", None)]).status \
        is PutStatus.MESSAGE_ILLEGAL
    with pytest.raises(ValueError):
        store.put(Message("bad topic!", b"z"))  # raised, not answered: not a refusal
    store.running_flags |= DISK_FULL
    assert store.put(Message("t", b"z")).status is PutStatus.SERVICE_NOT_AVAILABLE
    store.running_flags &= ~DISK_FULL
    assert store.put_counts() == PutCounts(6, batch.wrote_bytes + single.size, 3)
    other = make_store(root=tmp_path / "other")  # another store in this process: its own
    other.put(Message("t", b"w", queue_id=0))
    assert other.put_counts().messages == 1 and store.put_counts().messages == 6


def test_puts_from_many_threads_are_all_counted(make_store):
    store = make_store()
    sizes = []

    def producer(i: int) -> None:
        for j in range(PUTS):
            r = store.put(Message("t", b"%d-%d" % (i, j)))
            sizes.append(r.size)
    threads = [threading.Thread(target=producer, args=(i,)) for i in range(THREADS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert store.put_counts() == PutCounts(THREADS * PUTS, sum(sizes), 0)


def test_a_read_only_store_counts_its_refusals_and_a_closed_one_raises(make_store, tmp_path):
    writer = make_store()
    writer.put(Message("t", b"x", queue_id=0))
    writer.close()
    reader = make_store(read_only=True)
    assert reader.put(Message("t", b"y")).status is PutStatus.SERVICE_NOT_AVAILABLE
    assert reader.put_counts() == PutCounts(0, 0, 1)
    reader.close()
    with pytest.raises(StoreClosedError):
        reader.put_counts()

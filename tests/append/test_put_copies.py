"""``Appender.put_copies`` with one record takes a path of its own (no columns): it writes and
answers exactly what the batch path writes and answers for the same record."""

from __future__ import annotations

from mqstore import Message, PutStatus
from mqstore.append import encoding

SEG0 = "00000000000000000000"


def _copy(store, body: bytes, queue_id: int):
    return encoding.prepare(Message(topic="T", body=body, queue_id=queue_id,
                                    properties={"KEYS": "k1"}), store._appender.put_ctx)


def _segment(store) -> bytes:
    with open(f"{store.root}/commitlog/{SEG0}", "rb") as f:
        return f.read()


def test_one_copy_is_written_and_answered_as_in_a_batch(make_store, tmp_path):
    alone = make_store(root=str(tmp_path / "alone"))
    batched = make_store(root=str(tmp_path / "batched"))
    for store in (alone, batched):  # queue 2 has an offset already, the copy takes the next
        assert store.put(Message(topic="T", body=b"before", queue_id=2)).status is PutStatus.PUT_OK
    one = alone._appender.put_copies([_copy(alone, b"copy", 2)])
    two = batched._appender.put_copies([_copy(batched, b"copy", 2), _copy(batched, b"next", 2)])
    assert one.status is two.status is PutStatus.PUT_OK
    for name in ("queue_ids", "queue_offsets", "phys_offsets", "sizes"):
        got, want = getattr(one, name), getattr(two, name)[:1]
        assert got.dtype == want.dtype and got.tolist() == want.tolist(), name
    assert one.queue_offsets.tolist() == [1] and one.queue_ids.tolist() == [2]
    assert one.store_timestamp == two.store_timestamp
    end = int(one.phys_offsets[0] + one.sizes[0])
    assert _segment(alone)[:end] == _segment(batched)[:end]
    # the queue's next offset moved past the copy
    after = alone.put(Message(topic="T", body=b"after", queue_id=2))
    assert (after.queue_offset, after.phys_offset) == (2, end)
    alone.wait_dispatched()
    assert [m.body for m in alone.get("g", "T", 2, 0, 32).messages] == [
        b"before", b"copy", b"after"]


def test_one_copy_too_big_for_a_segment_is_refused_with_nothing_written(make_store):
    store = make_store()
    big = _copy(store, b"x" * (1 << 20), 0)  # the suite's segments are 1 MiB
    result = store._appender.put_copies([big])
    assert result.status is PutStatus.CREATE_MAPPED_FILE_FAILED
    assert f"a record of {big.size} bytes does not fit" in result.error
    assert store.max_offset("T", 0) == 0 and store.put_counts().messages == 0

"""One message by its commit-log offset, checked (``view.checked_read``): the message that starts
there, nothing where none starts, and an error naming the offset where the record is damaged,
never wrong bytes."""

from __future__ import annotations

import pytest

from mqstore import Message
from mqstore.errors import CorruptRecordError
from mqstore.view.checked_read import read_message

pytestmark = pytest.mark.loops("thread")


@pytest.fixture
def stored(make_store):
    store = make_store()
    results = [store.put(Message("T", b"body-%d" % i, queue_id=0, keys=[f"k{i}"]))
               for i in range(3)]
    store.wait_dispatched()
    return store, [r.phys_offset for r in results], [r.size for r in results]


def _segment(store):
    return store.internals.commit_log.segments.segments[0]


def test_the_message_at_its_offset_with_its_body_and_keys(stored):
    store, offsets, _sizes = stored
    for i, phys in enumerate(offsets):
        msg = read_message(store.internals.commit_log, phys)
        assert (msg.phys_offset, msg.body, msg.keys) == (phys, b"body-%d" % i, [f"k{i}"])


def test_no_message_where_no_record_starts(stored):
    store, offsets, sizes = stored
    log = store.internals.commit_log
    assert read_message(log, offsets[1] + 4) is None  # inside a record
    assert read_message(log, offsets[2] + sizes[2]) is None  # the end of the log
    assert read_message(log, 1 << 40) is None  # past every segment


def test_a_damaged_body_raises_naming_the_offset_and_the_other_records_read(stored):
    store, offsets, sizes = stored
    seg = _segment(store)
    end = offsets[1] + sizes[1]
    body_at = bytes(seg.mm[offsets[1]:end]).index(b"body-1") + offsets[1]
    seg.mm[body_at] ^= 0xFF
    with pytest.raises(CorruptRecordError, match=rf"\b{offsets[1]}\b"):
        read_message(store.internals.commit_log, offsets[1])
    assert read_message(store.internals.commit_log, offsets[2]).body == b"body-2"


def test_a_size_past_the_readable_end_is_an_error_not_a_short_message(stored):
    store, offsets, sizes = stored
    seg = _segment(store)
    seg.mm[offsets[2]:offsets[2] + 4] = (sizes[2] + 4096).to_bytes(4, "big")
    with pytest.raises(CorruptRecordError,
                       match=rf"record at commit-log offset {offsets[2]}: size {sizes[2] + 4096} "
                             rf"runs past the readable end"):
        read_message(store.internals.commit_log, offsets[2])

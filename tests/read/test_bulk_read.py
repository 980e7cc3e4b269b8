"""``MessageStore.read``: a queue's messages as columns, the same rows ``get`` serves.

Property tests over random stores (bodies of many sizes, tags, keys, IPv6 hosts, a topic long
enough for V2 records, several segments) compare ``read`` with ``get`` call by call (where
getMessage's transfer limits do not bind) and over whole queues, with and without filters;
the columns must equal the fields of the messages ``get`` builds. Damaged records are passed
over exactly as ``get`` passes them over; a read racing a writer and cleanup never returns
bytes that are torn, removed or not what was written.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import GetStatus, Message, PutStatus
from mqstore.testing import fill

TOPIC = "T"
LONG_TOPIC = "%RETRY%" + "L" * 200  # over 127 bytes: stored as V2 records
COLUMNS = {
    "queue_offsets": "queue_offset", "phys_offsets": "phys_offset", "sizes": "size",
    "store_timestamps": "store_timestamp", "born_timestamps": "born_timestamp",
    "flags": "flag", "sys_flags": "sysflag", "reconsume_times": "reconsume_times",
    "body_crcs": "body_crc",
}


def _fill(store, rng: random.Random, count: int, topic: str = TOPIC, queues: int = 3):
    def fields(i: int) -> dict:
        return {"flag": rng.randrange(3),
                "born_host": rng.choice([None, "10.0.0.1:9", "[::1]:80"]),
                "properties": rng.choice([None, {"a": str(i % 5)}])}
    fill(store, count, topic=topic, queues=queues, rng=rng, sizes=[0, 1, 17, 128, 700, 3000],
         tags=[None, "A", "B", "C"], keys=True, fields=fields)


def _same_rows(batch, messages) -> None:
    assert len(batch) == len(messages)
    for column, attr in COLUMNS.items():
        assert getattr(batch, column).tolist() == [getattr(m, attr) for m in messages], column
    assert [batch.body(i).tobytes() for i in range(len(batch))] == [m.body for m in messages]
    assert batch.body_offsets.dtype == np.int32 and batch.body_offsets[0] == 0
    assert int(batch.body_offsets[-1]) == len(batch.bodies)
    assert [batch.message(i).raw for i in range(len(batch))] == [bytes(m.raw) for m in messages]


def _same_answer(batch, got) -> None:
    assert (batch.status, batch.next_begin_offset, batch.min_offset, batch.max_offset) == (
        got.status, got.next_begin_offset, got.min_offset, got.max_offset)
    assert batch.filtered_count == got.filtered_count
    assert batch.corrupt == got.corrupt
    _same_rows(batch, got.messages)


@pytest.fixture(scope="module")
def random_store(tmp_path_factory):
    """A store in the default configuration (worker processes), filled once per module."""
    from mqstore import MessageStore, load_config

    root = tmp_path_factory.mktemp("bulk") / "store"
    cfg = load_config(overrides={"commit_log": {"segment_bytes": 256 << 10},
                                 "get": {"physical_memory_bytes": 24 << 30},
                                 "plugins": {"load_entry_points": False}})
    store = MessageStore.open(root, config=cfg)
    rng = random.Random(7)
    _fill(store, rng, 1500)
    _fill(store, rng, 60, topic=LONG_TOPIC, queues=1)
    yield store
    store.close()


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=st.integers(0, 3), offset=st.integers(-3, 600), max_msgs=st.integers(0, 32),
       expression=st.sampled_from([None, "A", "A || C", "*", "Z"]))
def test_read_answers_as_get_call_by_call(random_store, queue, offset, max_msgs, expression):
    batch = random_store.read(TOPIC, queue, offset, max_msgs, expression=expression)
    got = random_store.get("g", TOPIC, queue, offset, max_msgs, expression=expression)
    _same_answer(batch, got)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(queue=st.integers(0, 2), step=st.integers(1, 5000), verify=st.booleans(),
       expression=st.sampled_from([None, "B", "a = '3'"]))
def test_whole_queue_read_is_the_whole_queue_got(random_store, queue, step, verify,
                                                 expression):
    kind = "SQL92" if expression and "=" in expression else "TAG"
    read_rows, got_rows, offset = [], [], 0
    while True:
        batch = random_store.read(TOPIC, queue, offset, step, expression=expression,
                                  expression_type=kind, verify=verify)
        if batch.next_begin_offset == offset:
            break
        read_rows += [batch.message(i) for i in range(len(batch))]
        _same_rows(batch, read_rows[len(read_rows) - len(batch):])
        offset = batch.next_begin_offset
    offset = 0
    while True:
        got = random_store.get("g", TOPIC, queue, offset, 32, expression=expression,
                               expression_type=kind)
        if got.next_begin_offset == offset:
            break
        got_rows += got.messages
        offset = got.next_begin_offset
    assert [m.raw for m in read_rows] == [m.raw for m in got_rows]
    assert offset == random_store.max_offset(TOPIC, queue)


def test_v2_records_and_tag_codes(random_store):
    batch = random_store.read(LONG_TOPIC, 0, 0, 100)
    got = random_store.get("g", LONG_TOPIC, 0, 0, 32)
    assert len(batch) == 60 and got.messages
    _same_rows(batch.__class__(**{**batch.__dict__}), batch)  # the batch copies as a dataclass
    assert [batch.message(i).topic for i in range(len(batch))] == [LONG_TOPIC] * 60
    whole = random_store.read(TOPIC, 1, 0, 2000)
    cq = random_store.consume_queue(TOPIC, 1)  # the read above looked it up
    units = cq.units_of(cq.segments.segments[0])
    assert whole.tags_codes.tolist() == units["tags_code"][:len(whole)].tolist()


def test_limits_of_a_read_are_its_own(random_store):
    """getMessage stops at 32 messages from memory; a read serves what it is asked for, up
    to ``max_total_bytes``."""
    assert len(random_store.get("g", TOPIC, 0, 0, 400).messages) == 32
    batch = random_store.read(TOPIC, 0, 0, 400)
    assert len(batch) == 400 and batch.next_begin_offset == 400
    small = random_store.read(TOPIC, 0, 0, 400, max_total_bytes=10_000)
    assert 0 < len(small) < 400 and int(small.sizes.sum()) <= 10_000
    assert small.next_begin_offset == len(small)
    assert random_store.read(TOPIC, 0, 0, 0).next_begin_offset == 1  # the first always goes


def test_out_of_range_answers(random_store):
    end = random_store.max_offset(TOPIC, 0)
    for offset, status in [(end, GetStatus.OFFSET_OVERFLOW_ONE),
                           (end + 5, GetStatus.OFFSET_OVERFLOW_BADLY),
                           (-1, GetStatus.OFFSET_TOO_SMALL)]:
        batch = random_store.read(TOPIC, 0, offset, 10)
        assert (batch.status, len(batch)) == (status, 0)
    assert random_store.read("nope", 0, 0, 10).status is GetStatus.NO_MESSAGE_IN_QUEUE
    with pytest.raises(ValueError, match="max_msgs"):
        random_store.read(TOPIC, 0, 0, -1)


def test_damaged_record_is_passed_over_as_get_does(make_store):
    store = make_store()
    acked = [store.put(Message(TOPIC, b"body-%03d" % i, queue_id=0)) for i in range(200)]
    store.wait_dispatched()
    hit = acked[77]
    seg = store.internals.commit_log.segments.find(hit.phys_offset)
    at = hit.phys_offset - seg.start + 88 + 2  # a body byte (IPv4 hosts: the body at 88)
    seg.mm[at] ^= 0x10
    batch = store.read(TOPIC, 0, 0, 500)
    assert [c[:2] for c in batch.corrupt] == [(77, hit.phys_offset)]
    assert "CRC" in batch.corrupt[0][2]
    assert batch.queue_offsets.tolist() == [i for i in range(200) if i != 77]
    # Unchecked, the bytes are served as they lie; every other check stays.
    assert len(store.read(TOPIC, 0, 0, 500, verify=False)) == 200
    _same_answer(store.read(TOPIC, 0, 70, 20), store.get("g", TOPIC, 0, 70, 20))


def test_read_racing_writer_and_cleanup(make_store):
    """Reads from the first offset still stored while the writer appends and cleanup deletes
    old segments: every row is a whole record, at its queue offset, with its own body."""
    all_hours = ";".join(f"{h:02d}" for h in range(24))
    store = make_store({"commit_log": {"segment_bytes": 64 << 10},
                        "cleanup": {"interval_ms": 20, "delete_when": all_hours,
                                    "file_reserved_hours": 0}})
    stop = threading.Event()
    failures: list = []

    def writer():
        i = 0
        try:
            while not stop.is_set() and i < 400_000:
                r = store.put_batch([Message(TOPIC, b"%08d" % (i + k) * 8, queue_id=0)
                                     for k in range(50)])
                assert r.status is PutStatus.PUT_OK, r
                i += 50
        except Exception as exc:  # the test thread reports it
            failures.append(exc)

    t = threading.Thread(target=writer)
    t.start()
    errors, served, lows = [], 0, set()
    try:
        while served < 60_000 and t.is_alive():
            offset = store.min_offset(TOPIC, 0)
            lows.add(offset)
            batch = store.read(TOPIC, 0, offset, 500)
            for i in range(len(batch)):
                body = batch.body(i).tobytes()
                index = int(body[:8])
                if body != b"%08d" % index * 8 or index != batch.queue_offsets[i]:
                    errors.append((int(batch.queue_offsets[i]), body[:16]))
            served += len(batch)
    finally:
        stop.set()
        t.join()
    assert failures == [] and errors == []
    assert len(lows) > 1  # cleanup removed segments while the reads ran

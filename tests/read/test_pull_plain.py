"""A plain ``get`` (no filter, no byte cap) is answered from the units alone
(``pull_plain``); every answer must be the general pull's, call by call: status, next
offset, bounds, corrupt units, suggest_pulling_from_slave and the exact records, under
getMessage's count and byte limits in memory and on disk, across commit-log segment and
consume-queue file ends and around damaged units and records."""

from __future__ import annotations

import copy
import pickle
import random

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.read import plain_pull as pull_plain, reader as reading
from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.testing import fill

TOPIC = "P"
SEGMENT = 64 << 10
CQ_FILE_UNITS = 97  # about 750 units a queue: a get meets file ends
# Small transfer limits, so that byte and count limits both end batches; with 1 MiB of
# "physical memory" the older records count as on disk.
LIMITS = {"max_transfer_bytes_in_memory": 2500, "max_transfer_count_in_memory": 6,
          "max_transfer_bytes_on_disk": 1800, "max_transfer_count_on_disk": 3,
          "physical_memory_bytes": 1 << 20}


@pytest.fixture
def store(make_store):
    store = make_store({"commit_log": {"segment_bytes": SEGMENT}, "get": LIMITS,
                        "consume_queue": {"file_units": CQ_FILE_UNITS}})
    fill(store, 1500, topic=TOPIC, queues=2, rng=random.Random(3),
         sizes=[0, 40, 128, 128, 700, 1500], tags=[None, "A"], keys=True, batch=250)
    return store


def _answer(result) -> tuple:
    return (result.status, result.next_begin_offset, result.min_offset, result.max_offset,
            result.filtered_count, list(result.corrupt), result.suggest_pulling_from_slave,
            [(m.queue_offset, bytes(m.raw)) for m in result.messages])


def _rows(store, queue: int) -> list[tuple[int, int, int]]:
    """(queue offset, commit-log offset, body length) of every message of a queue."""
    rows, offset = [], 0
    while (batch := store.read(TOPIC, queue, offset, 10_000)) and len(batch):
        rows += [(int(batch.queue_offsets[i]), int(batch.phys_offsets[i]), len(batch.body(i)))
                 for i in range(len(batch))]
        offset = batch.next_begin_offset
    return rows


def _calls(store, rng: random.Random, k: int) -> list:
    ends = [store.max_offset(TOPIC, q) for q in range(2)]
    return [(q, rng.randrange(-2, ends[q] + 3), rng.choice([1, 1, 2, 3, 5, 6, 7, 32, 500]))
            for q in (rng.randrange(2) for _ in range(k))]


def _compare(store, monkeypatch, calls, topic: str = TOPIC) -> int:
    """Assert the plain path answers every call as the general pull does; how many it
    answered itself."""
    served = []
    plain = pull_plain.get_plain

    def counting(*args):
        got = plain(*args)
        served.append(got is not None)
        return got

    monkeypatch.setattr(reading, "get_plain", counting)
    fast = [_answer(store.get("g", topic, q, off, n)) for q, off, n in calls]
    monkeypatch.setattr(reading, "get_plain", lambda *args: None)
    assert [_answer(store.get("g", topic, q, off, n)) for q, off, n in calls] == fast
    return sum(served)


def test_plain_gets_are_the_general_pulls_answers(store, monkeypatch):
    assert len({phys // SEGMENT for _q, phys, _n in _rows(store, 0)}) > 5  # segment ends
    calls = _calls(store, random.Random(8), 600)
    calls += [(q, end + d, n) for q in range(2) for end in range(0, 800, CQ_FILE_UNITS)
              for d in (-2, -1, 0) for n in (1, 2, 32)]
    assert _compare(store, monkeypatch, calls) > 550
    answers = [_answer(store.get("g", TOPIC, q, off, n)) for q, off, n in calls]
    # Both kinds of limit ended batches, on disk and in memory.
    assert any(a[0] is GetStatus.FOUND and a[6] for a in answers)
    assert any(a[0] is GetStatus.FOUND and not a[6] for a in answers)
    assert {len(a[7]) for a in answers} >= {1, 2, 3, 6}
    # One-message gets (their own path) were served both ways, and next to file ends.
    ones = [(a, off) for a, (_q, off, n) in zip(answers, calls)
            if n == 1 and a[0] is GetStatus.FOUND]
    assert {a[6] for a, _off in ones} == {True, False}
    assert any((off + 1) % CQ_FILE_UNITS == 0 for _a, off in ones)


def _write_unit(store, queue: int, offset: int, at: int, data: bytes) -> None:
    """Overwrite bytes of a unit in its file (written by the dispatch worker, mapped
    read-only here)."""
    seg = store.consume_queue(TOPIC, queue).segments.find(offset * CQ_UNIT_SIZE)
    with open(seg.path, "r+b") as f:
        f.seek(offset * CQ_UNIT_SIZE - seg.start + at)
        f.write(data)


def test_damage_is_left_to_the_general_pull(store, monkeypatch):
    rows = _rows(store, 0)
    sized = [off for off, _phys, n in rows if n > 2]
    body_hit, head_hit, filler, bad_unit = (sized[k] for k in (10, 60, 120, 200))
    for off in (body_hit, head_hit):
        pos = rows[off][1]
        seg = store.internals.commit_log.segments.find(pos)
        # A body byte, then the queue-offset field (IPv4 hosts: the body at 88).
        seg.mm[pos - seg.start + (88 + 2 if off == body_hit else 20 + 7)] ^= 0x10
    _write_unit(store, 0, filler, 8, FILLER_SIZE.to_bytes(4, "big"))
    _write_unit(store, 0, bad_unit, 0, (1 << 40).to_bytes(8, "big"))  # past the log's end
    hits = (body_hit, head_hit, filler, bad_unit)
    calls = [(0, hit + d, n) for hit in hits for d in (-7, -2, -1, 0, 1)
             for n in (1, 2, 3, 6, 32)]
    calls += _calls(store, random.Random(9), 300)
    assert _compare(store, monkeypatch, calls) > 150
    answers = [_answer(store.get("g", TOPIC, 0, hit, 1)) for hit in hits]
    assert [a[5][0][0] if a[5] else None for a in answers] == [body_hit, head_hit, filler,
                                                                bad_unit]


def test_a_slave_that_keeps_offsets_still_moves_past_what_it_serves(make_store, store_dir):
    writer = make_store(root=store_dir)
    assert writer.put_batch([Message(TOPIC, b"m%d" % i, queue_id=0) for i in range(3)]
                            ).status is PutStatus.PUT_OK
    writer.wait_dispatched()
    writer.close()
    slave = make_store({"store": {"role": "slave"}, "get": {"offset_check_in_slave": False}},
                       root=store_dir)
    for n, expected in ((1, 1), (2, 2), (32, 3)):
        got = slave.get("g", TOPIC, 0, 0, n)
        assert (got.status, got.next_begin_offset) == (GetStatus.FOUND, expected)
        assert [m.body for m in got.messages] == [b"m%d" % i for i in range(expected)]


# -- shapes: records of a size met before, read with one struct (NOTE [ shapes ]) -------------

SHAPED = "S"
SHAPE_BODY = 100


def _shaped_store(make_store):
    """Queue 0 of SHAPED: records of one size in four makes (the usual split; a body one
    byte longer and a key one byte shorter; an IPv6 born host and a body 12 bytes shorter),
    and short records without properties, too short to hold a record CRC property."""
    store = make_store()
    msgs = []
    for i in range(180):
        kind = i % 6
        if kind < 3:
            body, keys, born = bytes([i % 251]) * SHAPE_BODY, [f"key-{i:04d}"], None
        elif kind == 3:
            body, keys, born = bytes([i % 251]) * (SHAPE_BODY + 1), [f"key-{i:03d}"], None
        elif kind == 4:
            body, keys, born = bytes([i % 251]) * (SHAPE_BODY - 12), [f"key-{i:04d}"], \
                "[::1]:4000"
        else:
            body, keys, born = b"s%d" % i, None, None
        msgs.append(Message(SHAPED, body, tags="TagA" if keys else None, keys=keys,
                            queue_id=0, born_host=born))
    assert store.put_batch(msgs).status is PutStatus.PUT_OK
    store.wait_dispatched()
    return store


def _fresh_shapes(monkeypatch) -> None:
    monkeypatch.setattr(pull_plain, "_shapes", {})
    monkeypatch.setattr(pull_plain, "_seen", set())


def _fields(m) -> tuple:
    return (m.size, m.magic, m.body_crc, m.queue_id, m.flag, m.queue_offset, m.phys_offset,
            m.sysflag, m.born_timestamp, m.store_timestamp, m.reconsume_times,
            m.prepared_tx_offset, m.body, m.topic, m.properties_text, m.born_host,
            m.store_host, m.msg_id, m.properties, m.tags, m.keys, m.uniq_key, m.raw)


def _shape_calls() -> list:
    return [(0, off, n) for off in range(0, 180, 7) for n in (2, 5, 32)]


def test_records_of_a_size_met_before_are_read_by_one_struct(make_store, monkeypatch):
    store = _shaped_store(make_store)
    _fresh_shapes(monkeypatch)
    first = store.get("g", SHAPED, 0, 0, 32)
    size = first.messages[0].size
    assert [m.size == size for m in first.messages[:6]] == [True] * 5 + [False]
    key = bytes([len(SHAPED)]) + SHAPED.encode()  # the V1 topic field
    # The first record of the size is remembered, the second gives it its struct; the other
    # makes of that size and the short records add none.
    assert list(pull_plain._shapes) == [key] and set(pull_plain._shapes[key]) == {size}
    unpack = pull_plain._shapes[key][size][0]
    read: list = []

    def counting(raw):
        read.append(len(raw))
        return unpack(raw)

    shape = pull_plain._shapes[key][size]
    pull_plain._shapes[key][size] = (counting, *shape[1:])
    served, offset = [], 0
    while (got := store.get("g", SHAPED, 0, offset, 32)).status is GetStatus.FOUND:
        served += got.messages
        offset = got.next_begin_offset
    # Every record of the size went through the struct, whatever its make.
    assert len(served) == 180 and set(read) == {size}
    assert len(read) == sum(1 for m in served if m.size == size)
    # Messages served by the plain get (header read when a field is asked for) carry every
    # field exactly as a message read and checked in full.
    for m in served:
        assert _fields(m) == _fields(store.message_at(m.phys_offset)), m.queue_offset
    calls = [(q, off, n) for q, off, n in _shape_calls() if off < 174]
    assert _compare(store, monkeypatch, calls, SHAPED) == len(calls)


def _flip(at):
    def damage(mm, rec, lay):
        mm[rec + at(lay)] ^= 0x10
    return damage


def _write(at, data: bytes):
    def damage(mm, rec, lay):
        where = rec + at(lay)
        mm[where:where + len(data)] = data
    return damage


def _crc_window(lay) -> int:
    return lay.props_at + lay.props_len - 20


@pytest.mark.parametrize("field, damage, served", [
    ("total size", _flip(lambda lay: 3), False), ("magic", _flip(lambda lay: 7), False),
    ("body crc", _flip(lambda lay: 11), False), ("queue id", _flip(lambda lay: 15), False),
    ("queue offset", _flip(lambda lay: 27), False),
    ("commit-log offset", _flip(lambda lay: 35), False),
    ("host bits", _flip(lambda lay: 39), False), ("body", _flip(lambda lay: 88 + 50), False),
    ("body length", _flip(lambda lay: 87), False),
    ("topic", _flip(lambda lay: lay.topic_at), False),
    ("properties length", _flip(lambda lay: lay.props_at - 1), False),
    # A third of the record CRC property's name where it would lie: not the property (the
    # full check says so), served.
    ("record CRC name third", _write(_crc_window, b"__C"), True),
    # The property itself, after a separator, with digits that are not the record's CRC.
    ("record CRC property", _write(lambda lay: _crc_window(lay) - 1,
                                   b"\x02__CRC32#\x01" + b"0" * 10 + b"\x02"), False),
])
def test_damage_to_a_record_of_a_known_shape(make_store, monkeypatch, field, damage, served):
    store = _shaped_store(make_store)
    _fresh_shapes(monkeypatch)
    before = store.get("g", SHAPED, 0, 0, 32)
    size = before.messages[0].size
    assert size in pull_plain._shapes[bytes([len(SHAPED)]) + SHAPED.encode()]
    victim = before.messages[7]  # the usual split
    pos = victim.phys_offset
    seg = store.internals.commit_log.segments.find(pos)
    damage(seg.mm, pos - seg.start, victim._lay)
    calls = [(0, off, n) for off in range(0, 10) for n in (2, 5, 32)]
    _compare(store, monkeypatch, calls, SHAPED)
    got = store.get("g", SHAPED, 0, 7, 5)
    if served:
        assert got.corrupt == []
        assert got.messages[0].raw == seg.mm[pos - seg.start:pos - seg.start + size]
    else:
        assert [c[0] for c in got.corrupt][:1] == [7]
        assert 7 not in [m.queue_offset for m in got.messages]


def test_the_shape_tables_are_bounded(make_store, monkeypatch):
    store = make_store()
    # 12 topics of 20 messages in 4 sizes: 48 shapes, each met five times.
    msgs = [Message(f"B{i % 12}", b"x" * (40 + i // 12 % 4), tags="TagA",
                    keys=[f"key-{i:04d}"], queue_id=0) for i in range(240)]
    assert store.put_batch(msgs).status is PutStatus.PUT_OK
    store.wait_dispatched()
    _fresh_shapes(monkeypatch)
    monkeypatch.setattr(pull_plain, "_MAX_SHAPES", 8)
    monkeypatch.setattr(pull_plain, "_learned", [0])
    most = 0
    for _ in range(3):
        for t in range(12):
            got = store.get("g", f"B{t}", 0, 0, 32)
            assert [m.body for m in got.messages] == [b"x" * (40 + i // 12 % 4)
                                                      for i in range(t, 240, 12)]
            most = max(most, sum(map(len, pull_plain._shapes.values())))
            assert len(pull_plain._shapes) <= 8 and len(pull_plain._seen) <= 8
    assert 0 < most <= 8


def test_a_served_message_pickles_and_copies_with_its_fields(make_store, monkeypatch):
    store = _shaped_store(make_store)
    _fresh_shapes(monkeypatch)
    store.get("g", SHAPED, 0, 0, 32)  # the shape is learned
    served = store.get("g", SHAPED, 0, 0, 32).messages
    for m in served[:6]:
        again = pickle.loads(pickle.dumps(m))
        assert _fields(again) == _fields(copy.deepcopy(m)) == _fields(copy.copy(m)) \
            == _fields(store.message_at(m.phys_offset))

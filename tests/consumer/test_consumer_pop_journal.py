"""The pop state's files (NOTE [ Pop journal ], issues 24 and 26): every shape of the checkpoint
validated and refused naming the file; a journal cut short, garbled, zero-filled or with a
damaged header reported and recovered (messages delivered again, none lost, never a
traceback); a journal that continues a lost checkpoint refused; an interrupted compaction
recovered; compaction keeps every handle good; and the fsync policy."""

from __future__ import annotations

import json
import logging
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import MessageStore
from mqstore.consumer import ReceiptHandleError, StaleReceiptHandleError, pop_journal
from mqstore.consumer.pop_state import POP_DIR, journal_path, pop_state_path
from mqstore.errors import CorruptStateError
from mqstore.format import pop_record
from mqstore.testing import fill

TOPIC = "T"


def put_all(store, per_queue: int, queues: int = 2) -> None:
    fill(store, per_queue * queues, topic=TOPIC, queues=queues)  # bodies m0000, m0001, ...


def keys(popped) -> list[tuple[int, int, int]]:
    return sorted((m.queue_id, m.queue_offset, m.delivery_attempt) for m in popped)


def files(root) -> dict:
    """The state files' bytes (not the lock files': an empty file to flock, created once)."""
    folder = os.path.join(root, POP_DIR)
    out = {}
    for name in sorted(os.listdir(folder)):
        if name.endswith(".lock"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            out[name] = f.read()
    return out


def record_ends(path: str) -> list[int]:
    """Where each record of a journal ends."""
    with open(path, "rb") as f:
        data = f.read()
    ends, pos = [], pop_record.HEADER_SIZE
    while pos < len(data):
        count = int.from_bytes(data[pos + 4:pos + 8], "little")
        pos += pop_record.RECORD_HEADER_SIZE + count * pop_record.ENTRY_SIZE
        ends.append(pos)
    assert pos == len(data)
    return ends


def reader(root, clock) -> MessageStore:
    """Another opener of the store: its own view of the pop state, read from the files."""
    return MessageStore.open(root, read_only=True, clock=clock)


# -- every shape of the checkpoint ------------------------------------------------------------

DEEP = "[" * 100_000
GOOD_QUEUE = {"offset": 3, "inflight": {"1": [1, 5, 9]}}


@pytest.mark.parametrize("text, rule", [
    ('{"queues": {"0": "x"}}', "version: Field required"),  # issue 24's file, first rule
    ('{"version": 1, "queues": {"0": "x"}}', "queues.0: Input should be an object"),
    ("{}", "version: Field required"),
    ("[]", "Input should be an object"),
    ('"text"', "Input should be an object"),
    ("", "Invalid JSON"),
    ('{"version": 1, "deliv', "Invalid JSON"),
    (DEEP, "recursion limit exceeded"),
    ('{"version": 2, "delivery": 1, "rotate": 0, "queues": {}}',
     "version 2 needs a generation"),
    ('{"version": 3, "queues": {}}', "version: Input should be 1 or 2"),
    ('{"version": 1, "delivery": "7", "queues": {}}', "delivery: Input should be a valid integer"),
    ('{"version": 1, "delivery": true, "queues": {}}',
     "delivery: Input should be a valid integer"),
    ('{"version": 1, "rotate": -1, "queues": {}}', "rotate: Input should be greater than or equal"),
    ('{"version": 1, "queues": {"x": %s}}' % json.dumps(GOOD_QUEUE), "String should match"),
    ('{"version": 1, "queues": {"-1": %s}}' % json.dumps(GOOD_QUEUE), "String should match"),
    ('{"version": 1, "queues": {"0": {"offset": 3, "inflight": {"5": [1, 5, 9]}}}}',
     "offsets ['5'] are in flight but not below the queue's next offset 3"),
    ('{"version": 1, "queues": {"0": {"offset": 3, "inflight": {"1": [0, 5, 9]}}}}',
     "inflight.1.0: Input should be greater than or equal to 1"),
    ('{"version": 1, "queues": {"0": {"offset": 3, "inflight": {"1": [1, 5]}}}}',
     "inflight.1.2: Field required"),
    ('{"version": 1, "queues": {"0": {"offset": 3, "inflight": {"1": {"a": 1}}}}}',
     "Input should be a valid array"),
    ('{"version": 1, "queues": {"0": {"offset": 3.5}}}', "offset: Input should be a valid integer"),
    ('{"version": 1, "queues": {"0": {"offset": 3, "more": 1}}}', "more: Extra inputs"),
    ('{"version": 1, "queues": {}, "more": 1}', "more: Extra inputs are not permitted"),
    ('{"version": 1, "queues": {"4294967296": %s}}' % json.dumps(GOOD_QUEUE),
     "queue ids ['4294967296'] are beyond 2**31-1"),
])
def test_every_shape_of_the_checkpoint_is_validated(make_store, text, rule):
    store = make_store()
    put_all(store, 2)
    path = pop_state_path(store.root, TOPIC, "g")
    os.makedirs(os.path.dirname(path))
    with open(path, "w") as f:
        f.write(text)
    before = files(store.root)
    for call in (lambda: store.pop("g", TOPIC, 4, 1_000, consume_from="first"),
                 lambda: store.ack("mq1:T:g:0:1:1:9"),
                 lambda: store.change_invisible_duration("mq1:T:g:0:1:1:9", 5),
                 lambda: store.ack(["mq1:T:g:0:1:1:9"])):
        with pytest.raises(CorruptStateError) as err:
            call()
        message = str(err.value)
        assert path in message and "is not pop state of the expected shape" in message
        assert rule in message
        assert len(message) < 2_000
    assert files(store.root) == before  # refused: nothing written, the file left as it is
    assert (TOPIC, "g") not in store.consumer_groups()  # progress unknown, not a crash
    assert store.delete_consumer_group("g") == [(TOPIC, "g")]  # and it can be forgotten
    assert len(store.pop("g", TOPIC, 4, 1_000, consume_from="first")) == 4


# -- damaged journals -------------------------------------------------------------------------

def _popped_and_acked(store):
    """Three records: a pop of four, an ack of one, an ack of another."""
    popped = store.pop("g", TOPIC, 4, 10_000, consume_from="first")
    assert len(popped) == 4
    store.ack(popped[0].receipt_handle)
    store.ack([popped[1].receipt_handle])
    path = journal_path(store.root, TOPIC, "g")
    assert len(record_ends(path)) == 3
    return popped, path


def _damage_report(caplog, path: str) -> str:
    warnings = [r.getMessage() for r in caplog.records
                if r.name == "mqstore.consumer.pop_journal" and r.levelno == logging.WARNING]
    assert any(path in w for w in warnings), warnings
    return " ".join(warnings)


@pytest.mark.parametrize("damage, why, acked_kept", [
    ("cut the last record in half", "cut short", 1),
    ("garble a byte of the middle record", "fails its crc", 0),
    ("zero 4 KiB past the end", "no record at byte", 2),
    ("garble the header", "header is unreadable", None),
    ("cut the header short", "header cut short", None),
])
def test_a_damaged_journal_is_reported_and_recovered(make_store, store_dir, manual_clock, caplog,
                                                     damage, why, acked_kept):
    store = make_store()
    put_all(store, 2)
    popped, path = _popped_and_acked(store)
    ends = record_ends(path)
    with open(path, "r+b") as f:
        if damage == "cut the last record in half":
            f.truncate((ends[1] + ends[2]) // 2)
        elif damage == "garble a byte of the middle record":
            f.seek(ends[0] + 30)
            byte = f.read(1)
            f.seek(ends[0] + 30)
            f.write(bytes([byte[0] ^ 0x40]))
        elif damage == "zero 4 KiB past the end":
            f.seek(0, os.SEEK_END)
            f.write(bytes(4096))
        elif damage == "garble the header":
            f.write(b"XXXX")
        else:
            f.truncate(10)
    size = os.path.getsize(path)
    caplog.set_level(logging.WARNING, logger="mqstore.consumer.pop_journal")
    with reader(str(store_dir), manual_clock) as other:
        # A reader (shared flock) passes over the damage and leaves the file alone.
        consumed = other.consumer_groups()[(TOPIC, "g")]
        assert os.path.getsize(path) == size
        assert why in _damage_report(caplog, path)
        # A change (exclusive flock) moves the damage aside and cuts it off.
        fresh = other.pop("g", TOPIC, 4, 10_000)
        report = _damage_report(caplog, path)
        assert "delivered again" in report
        with open(path + ".damaged", "rb") as f:
            assert len(f.read()) > 0
        manual_clock.advance(10_000)
        again = other.pop("g", TOPIC, 10, 10_000)
    if "header" in why:
        # Nothing of the journal counts, but the group is known to have popped: its queues
        # start at their first message (not at their end, as a new group with "last" would),
        # so everything comes again and nothing is skipped.
        assert consumed == {}
        assert keys(fresh) == [(q, o, 1) for q in (0, 1) for o in range(2)]
        assert keys(again) == [(q, o, 2) for q in (0, 1) for o in range(2)]
    else:
        acked = {(m.queue_id, m.queue_offset) for m in popped[:acked_kept]}
        # Every message not acknowledged in the kept prefix is delivered again: none lost,
        # none acknowledged there delivered again.
        assert fresh == []
        assert {(m.queue_id, m.queue_offset) for m in again} == {
            (m.queue_id, m.queue_offset) for m in popped} - acked
        assert {m.delivery_attempt for m in again} == {2}
    # The journal holds only whole records again, and the writer goes on with it.
    record_ends(path)
    manual_clock.advance(10_000)
    left = store.pop("g", TOPIC, 10, 10_000)
    assert store.ack([m.receipt_handle for m in left]) == [None] * len(left)


def test_handles_of_a_cut_journal_do_not_match_the_deliveries_after_it(make_store, store_dir,
                                                                         manual_clock):
    """Delivery numbers never repeat, even when the state lost its newest records: an old
    handle cannot acknowledge a new delivery of the same message."""
    store = make_store()
    put_all(store, 1, queues=1)
    path = journal_path(store.root, TOPIC, "g")
    (m,) = store.pop("g", TOPIC, 1, 10_000, consume_from="first")
    first_pop = record_ends(path)[0]
    store.change_invisible_duration(m.receipt_handle, 1)  # a record the cut will lose
    with open(path, "r+b") as f:
        f.truncate(first_pop)
    manual_clock.advance(1)
    with reader(str(store_dir), manual_clock) as other:
        manual_clock.advance(10_000)
        (back,) = other.pop("g", TOPIC, 1, 10_000)
        assert (back.queue_offset, back.delivery_attempt) == (0, 2)
        assert back.receipt_handle != m.receipt_handle
        with pytest.raises(StaleReceiptHandleError):
            other.ack(m.receipt_handle)
        other.ack(back.receipt_handle)


def test_a_journal_that_continues_a_lost_checkpoint_is_refused(make_store, store_dir,
                                                               manual_clock):
    store = make_store()
    put_all(store, 2)
    popped = store.pop("g", TOPIC, 4, 10_000, consume_from="first")
    store.close()  # compacts: checkpoint generation 1, journal naming 1
    path = pop_state_path(str(store_dir), TOPIC, "g")
    with open(path) as f:
        assert json.load(f)["generation"] == 1
    os.unlink(path)
    store = make_store()
    store.pop("h", TOPIC, 1, 10_000)  # other groups are not held up
    for call in (lambda: store.pop("g", TOPIC, 4, 10_000),
                 lambda: store.ack(popped[0].receipt_handle)):
        with pytest.raises(CorruptStateError, match=r"continues checkpoint generation 1, but "
                                                    r".*T@g\.json is missing"):
            call()
    assert os.path.exists(journal_path(str(store_dir), TOPIC, "g"))


def test_an_interrupted_compaction_keeps_the_checkpoint(make_store, store_dir, manual_clock):
    """Killed between the new checkpoint and the new journal: the old journal names the
    generation before, its records are in the checkpoint, and they are not applied again."""
    store = make_store()
    put_all(store, 2)
    popped = store.pop("g", TOPIC, 4, 10_000, consume_from="first")
    path = journal_path(str(store_dir), TOPIC, "g")
    with open(path, "rb") as f:
        old_journal = f.read()  # generation 0, the pop: four messages in flight
    assert store.ack([m.receipt_handle for m in popped]) == [None] * 4
    store.close()  # checkpoint generation 1: nothing in flight
    with open(path, "wb") as f:
        f.write(old_journal)
    store = make_store()
    manual_clock.advance(20_000)
    assert store.pop("g", TOPIC, 10, 10_000) == []  # the acks hold
    assert pop_record.decode_header(open(path, "rb").read()) == 1  # replaced


def test_compaction_keeps_every_handle_good(make_store, store_dir, manual_clock, monkeypatch):
    monkeypatch.setattr(pop_journal, "COMPACT_BYTES", 1024)
    store = make_store()
    put_all(store, 40)
    held = store.pop("g", TOPIC, 4, 60_000, consume_from="first")
    for _ in range(18):  # many records: several compactions
        got = store.pop("g", TOPIC, 4, 60_000)
        assert store.ack([m.receipt_handle for m in got]) == [None] * 4
    with open(pop_state_path(store.root, TOPIC, "g")) as f:
        checkpoint = json.load(f)
    assert checkpoint["generation"] >= 3
    assert os.path.getsize(journal_path(store.root, TOPIC, "g")) < 4096
    with reader(str(store_dir), manual_clock) as other:
        # The held four are queue 0's first; the pops after them take the queues in turn.
        assert other.consumer_groups()[(TOPIC, "g")] == {0: 0, 1: 36}
        assert other.ack([m.receipt_handle for m in held]) == [None] * 4
    assert store.consumer_groups()[(TOPIC, "g")] == {0: 40, 1: 36}
    manual_clock.advance(60_000)
    assert len(store.pop("g", TOPIC, 10, 60_000)) == 4  # the rest, never popped
    with pytest.raises(StaleReceiptHandleError):
        store.ack(held[0].receipt_handle)


def test_closing_the_store_leaves_a_whole_checkpoint(make_store, store_dir):
    store = make_store()
    put_all(store, 2)
    popped = store.pop("g", TOPIC, 3, 60_000, consume_from="first")
    store.ack(popped[0].receipt_handle)
    store.close()
    with open(pop_state_path(str(store_dir), TOPIC, "g")) as f:
        doc = json.load(f)
    assert doc["version"] == 2 and doc["generation"] == 1
    in_flight = {(int(q), int(o)) for q, e in doc["queues"].items() for o in e["inflight"]}
    assert in_flight == {(m.queue_id, m.queue_offset) for m in popped[1:]}
    assert os.path.getsize(journal_path(str(store_dir), TOPIC, "g")) == pop_record.HEADER_SIZE


@pytest.mark.parametrize("fsync", [False, True])
def test_commit_fsync_forces_every_record(make_store, monkeypatch, fsync):
    synced = []
    real = os.fdatasync

    def fdatasync(fd: int) -> None:
        if ".journal" in os.readlink(f"/proc/self/fd/{fd}"):  # the pop journal's, no other
            synced.append(fd)
        real(fd)
    monkeypatch.setattr(pop_journal.os, "fdatasync", fdatasync)
    store = make_store({"consumer": {"commit_fsync": fsync}})
    put_all(store, 2)
    popped = store.pop("g", TOPIC, 4, 60_000, consume_from="first")
    assert len(synced) == (2 if fsync else 0)  # the new journal, then the pop's record
    store.ack([m.receipt_handle for m in popped[:2]])
    store.change_invisible_duration(popped[2].receipt_handle, 5)
    assert len(synced) == (4 if fsync else 0)


def test_an_unknown_group_creates_no_files(make_store):
    store = make_store()
    put_all(store, 1)
    with pytest.raises(ReceiptHandleError, match="has popped nothing"):
        store.ack("mq1:T:g:0:0:1:1")
    assert store.ack(["mq1:T:g:0:0:1:1"])[0] is not None
    assert not os.path.exists(os.path.join(store.root, POP_DIR))


# -- the record layout ------------------------------------------------------------------------

_rows = st.lists(st.tuples(
    st.sampled_from([pop_record.INFLIGHT, pop_record.DONE, pop_record.NEXT]),
    st.integers(0, 2**31 - 1), st.integers(0, 2**62), st.integers(0, 2**62),
    st.integers(0, 2**62 - 1), st.integers(1, 2**31 - 1), st.just(0)), max_size=6)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(_rows, st.integers(0, 2**32 - 1), st.integers(0, 2**62 - 1)),
                max_size=4), st.data())
def test_records_read_back_and_any_damage_leaves_a_prefix(records, data):
    blob = b"".join(pop_record.encode_record(rows, rotate, delivery)
                    for rows, rotate, delivery in records)
    found = pop_record.scan(blob)
    assert found.damage is None and found.end == len(blob)
    assert [(r.tolist(), rot, d) for r, rot, d in found.records] == [
        (list(rows), rot, d) for rows, rot, d in records]
    if not blob:
        return
    # Cut anywhere, or flip any bit: the scan stops at a record boundary, keeps the records
    # before it intact, and says why it stopped.
    cut = data.draw(st.integers(0, len(blob) - 1))
    flipped = bytearray(blob)
    bit = data.draw(st.integers(0, len(blob) * 8 - 1))
    flipped[bit // 8] ^= 1 << (bit % 8)
    for damaged in (blob[:cut], bytes(flipped)):
        found = pop_record.scan(damaged)
        ends = [0]
        for rows, rotate, delivery in records:
            ends.append(ends[-1] + len(pop_record.encode_record(rows, rotate, delivery)))
        assert found.end in ends
        kept = ends.index(found.end)
        assert [(r.tolist(), rot, d) for r, rot, d in found.records] == [
            (list(rows), rot, d) for rows, rot, d in records[:kept]]
        assert (found.damage is None) == (found.end == len(damaged))


def test_a_journal_header_names_its_generation():
    assert pop_record.decode_header(pop_record.encode_header(7)) == 7
    header = bytearray(pop_record.encode_header(7))
    header[8] ^= 1
    with pytest.raises(ValueError, match="header crc mismatch"):
        pop_record.decode_header(bytes(header))
    with pytest.raises(ValueError, match="magic"):
        pop_record.decode_header(b"XXXX" + bytes(header[4:]))

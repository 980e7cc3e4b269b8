"""A read-only open of a store whose consume queue has a damaged unit between intact ones.

A store written by a real writer process (2,000 messages over 4 queues, 64 KiB log segments,
100-unit queue files) gets one unit of queue 1 damaged so that it names bytes past the end of
the commit log (a high bit of its offset flipped, or all 20 bytes 0xff) or reads as a unit not
written yet (zeroed). The units after it are intact, so it is damage, not the torn end of the
queue: a read-only open keeps the queue's length, serves every message at its queue offset
with its exact bytes (the damaged unit's record found in the log and reported in ``corrupt``),
as the writable open does, and writes nothing. Units past the end of the log after the last
intact unit are a torn tail: hidden by a read-only open, cut by a writable one, which then
dispatches again whatever records of the queue the log holds after its last kept unit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.testing import open_store
from mqstore.testing.faults import (
    TOPIC, audit, body_for, pulled_queue, small_store_overrides, store_left_by_writer,
)

pytestmark = pytest.mark.usefixtures("no_plugin_env")
COUNT = 2000
SEED = 11
UNIT = 20
FILE_UNITS = 100  # queue 1 spans several files: damage in one, intact units in the next
OVERRIDES = small_store_overrides(store={"hash": "mmh3"},
                                  consume_queue={"file_units": FILE_UNITS})


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    """(directory, acks) of a store its writer process closed."""
    root = tmp_path_factory.mktemp("pristine") / "store"
    return root, store_left_by_writer(root, OVERRIDES, SEED, COUNT, "clean")


def _queue_file(root: Path, unit: int) -> Path:
    start = unit // FILE_UNITS * FILE_UNITS * UNIT
    return root / "consumequeue" / TOPIC / "1" / f"{start:020d}"


def _rewrite_unit(root: Path, unit: int, make) -> None:
    """Overwrite queue 1's unit ``unit`` in place with ``make(old bytes)``."""
    path, at = _queue_file(root, unit), unit % FILE_UNITS * UNIT
    with open(path, "r+b") as f:
        f.seek(at)
        old = f.read(UNIT)
        f.seek(at)
        f.write(make(old))


def _flip_high_bit(old: bytes) -> bytes:
    return bytes([old[0] ^ 0x40]) + old[1:]  # the offset goes 2**62 further: past the log


def _zero(_old: bytes) -> bytes:
    return bytes(UNIT)  # as a unit not written yet reads


# Queue 1 gets about 500 units: 6 files, of which opens check the last 3 (units 300 on).
DAMAGE = {
    "offset high bit": (370, _flip_high_bit),
    "all 0xff": (450, lambda _old: b"\xff" * UNIT),
    "all 0xff, a file's last unit": (399, lambda _old: b"\xff" * UNIT),
    "offset high bit, the last file": (505, _flip_high_bit),
    "offset high bit, a file before those checked": (237, _flip_high_bit),
    "zeroed": (370, _zero),
    "zeroed, a file's last unit": (399, _zero),
    "zeroed, the last file": (505, _zero),
}


def _mine(acks) -> list:
    return sorted((a for a in acks if a.queue_id == 1), key=lambda a: a.queue_offset)


def _expected(acks) -> list:
    return [(a.queue_offset, a.phys_offset, body_for(SEED, a.index)) for a in _mine(acks)]


def _copy(pristine, tmp_path) -> Path:
    root = tmp_path / "store"
    shutil.copytree(pristine[0], root)
    return root


def _queue_files(root: Path) -> dict[str, bytes]:
    base = root / "consumequeue"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*"))
            if p.is_file()}


def _serves_the_queue(store, acks, bad: int | None) -> None:
    expected = _expected(acks)
    count = len(expected)
    assert (store.min_offset(TOPIC, 1), store.max_offset(TOPIC, 1)) == (0, count)
    pulled = pulled_queue(store, 1)
    assert [(m.queue_offset, m.phys_offset, m.body) for m in pulled] == expected
    past = store.get("g", TOPIC, 1, count, 32)
    assert (past.status, past.messages, past.next_begin_offset) == (
        GetStatus.OFFSET_OVERFLOW_ONE, [], count)
    if bad is None:
        return
    one = store.get("g", TOPIC, 1, bad, 1)
    assert one.status is GetStatus.FOUND
    assert [(m.queue_offset, m.phys_offset, m.body) for m in one.messages] == [expected[bad]]
    assert one.next_begin_offset == bad + 1
    assert [c[0] for c in one.corrupt] == [bad]  # the damage is never silent
    batch = store.get("g", TOPIC, 1, bad - 5, 32)  # a pull ends with its queue file
    assert batch.status is GetStatus.FOUND
    assert [(m.queue_offset, m.phys_offset, m.body) for m in batch.messages] == \
        expected[bad - 5:min(bad + 27, (bad // FILE_UNITS + 1) * FILE_UNITS)]
    assert [c[0] for c in batch.corrupt] == [bad]


@pytest.mark.parametrize("damage", sorted(DAMAGE))
def test_a_read_only_open_serves_past_a_damaged_unit(pristine, tmp_path, damage):
    root = _copy(pristine, tmp_path)
    bad, make = DAMAGE[damage]
    _rewrite_unit(root, bad, make)
    before = _queue_files(root)
    acks = pristine[1]
    reader = open_store(root, OVERRIDES, read_only=True)
    try:
        _serves_the_queue(reader, acks, bad)
        result = audit(reader, SEED, acks)  # every queue, every message
        assert (result.lost, result.wrong) == ([], [])
    finally:
        reader.close()
    assert _queue_files(root) == before  # reads only
    # The writable open keeps every message of the queue too, at the same offsets.
    _writable_serves_and_appends(root, acks)


def _writable_serves_and_appends(root: Path, acks) -> None:
    """A writable open serves queue 1 whole, and its next put takes the next offset and is
    served."""
    store = open_store(root, OVERRIDES)
    try:
        store.wait_dispatched(timeout=30)
        _serves_the_queue(store, acks, None)
        extra = store.put(Message(TOPIC, b"after", queue_id=1))
        assert (extra.status, extra.queue_offset) == (PutStatus.PUT_OK, len(_mine(acks)))
        store.wait_dispatched(timeout=30)
        got = store.get("g", TOPIC, 1, extra.queue_offset, 32)
        assert [(m.queue_offset, m.body) for m in got.messages] == [
            (extra.queue_offset, b"after")]
    finally:
        store.close()


def _append_torn_tail(root: Path, acks, count: int = 3) -> None:
    """Units for queue offsets after the last one, naming records past the end of the log,
    and ``abort``: as a crash leaves them when the log lost bytes the queue kept, past the
    durable end (a put never acknowledged, whose offsets are given out again; after a clean
    close they would be offsets given out before, which stay taken: test_offset_floor)."""
    last = _mine(acks)[-1].queue_offset
    log_end = sum(p.stat().st_size for p in (root / "commitlog").iterdir())
    for i in range(count):
        unit = (log_end + 1000 * i).to_bytes(8, "big") + (200).to_bytes(4, "big") + bytes(8)
        _rewrite_unit(root, last + 1 + i, lambda _old, unit=unit: unit)
    (root / "abort").write_text("12345")


@pytest.mark.parametrize("with_damage", [False, True], ids=["tail only", "damage and tail"])
def test_a_torn_tail_is_hidden_read_only_and_cut_writable(pristine, tmp_path, with_damage):
    root = _copy(pristine, tmp_path)
    acks = pristine[1]
    bad = 370 if with_damage else None
    if with_damage:
        _rewrite_unit(root, bad, _flip_high_bit)
    _append_torn_tail(root, acks)
    before = _queue_files(root)
    reader = open_store(root, OVERRIDES, read_only=True)
    try:
        _serves_the_queue(reader, acks, bad)
    finally:
        reader.close()
    assert _queue_files(root) == before
    _writable_serves_and_appends(root, acks)


def test_a_zeroed_unit_at_the_end_is_not_written_yet(pristine, tmp_path):
    root = _copy(pristine, tmp_path)
    acks = pristine[1]
    last = _mine(acks)[-1].queue_offset
    _rewrite_unit(root, last, _zero)
    reader = open_store(root, OVERRIDES, read_only=True)
    try:
        assert reader.max_offset(TOPIC, 1) == last
        assert [m.body for m in pulled_queue(reader, 1)] == [b for _q, _p, b in
                                                             _expected(acks)[:last]]
    finally:
        reader.close()


@pytest.mark.parametrize("how", ["clean", "killed"])
def test_a_writable_open_redispatches_the_records_of_cut_tail_units(tmp_path, how):
    """The last units name bytes past the end of the log, but their records are there: the
    open cuts the units and dispatches the records again, at their own queue offsets."""
    root = tmp_path / "store"
    acks = store_left_by_writer(root, OVERRIDES, SEED, COUNT, how)
    last = _mine(acks)[-1].queue_offset
    for unit in (last - 1, last):
        _rewrite_unit(root, unit, _flip_high_bit)
    store = open_store(root, OVERRIDES)
    try:
        store.wait_dispatched(timeout=30)
        assert store.recovery_report.consume_queue_units_dropped == {f"{TOPIC}/1": 2}
        _serves_the_queue(store, acks, None)
        result = audit(store, SEED, acks)
        assert (result.lost, result.wrong) == ([], [])
        extra = store.put(Message(TOPIC, b"after", queue_id=1))
        assert (extra.status, extra.queue_offset) == (PutStatus.PUT_OK, last + 1)
    finally:
        store.close()


def test_a_tail_torn_by_a_crash_is_cut_without_duplicates(tmp_path):
    """The log really lost its last records (queue 1's last two among them), acknowledged
    before the kill: their units go, the redispatch from before them finds nothing of them,
    and their queue offsets stay taken (fillers hold them): new messages go on above."""
    root = tmp_path / "store"
    acks = store_left_by_writer(root, OVERRIDES, SEED, COUNT, "killed")
    cut = _mine(acks)[-2].phys_offset
    for path in (root / "commitlog").iterdir():
        start, size = int(path.name), path.stat().st_size
        if start + size > cut:
            with open(path, "r+b") as f:
                at = max(0, cut - start)
                f.seek(at)
                f.write(bytes(size - at))
    kept = [a for a in acks if a.phys_offset < cut]
    store = open_store(root, OVERRIDES)
    try:
        store.wait_dispatched(timeout=30)
        result = audit(store, SEED, kept)
        assert (result.lost, result.wrong) == ([], [])
        for queue in range(4):
            mine = sorted(a.queue_offset for a in kept if a.queue_id == queue)
            given = sorted(a.queue_offset for a in acks if a.queue_id == queue)
            assert mine == list(range(len(mine)))
            assert store.max_offset(TOPIC, queue) == len(given)
            messages = [m.queue_offset for m in pulled_queue(store, queue, end=len(mine))]
            assert messages == mine
        extra = store.put(Message(TOPIC, b"after", queue_id=1))
        assert (extra.status, extra.queue_offset) == (PutStatus.PUT_OK, len(_mine(acks)))
    finally:
        store.close()

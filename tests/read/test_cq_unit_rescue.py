"""A damaged consume-queue unit whose bytes still look like a unit (issue 10 point 8): the
record of its offset is found in the commit log, served, and the damage reported.

A store written by a real writer process (2,000 messages, 64 KiB segments, worker processes,
closed cleanly or SIGKILLed) gets one unit of queue 1 damaged so that opening it finds nothing
wrong: another queue's unit copied in, in log order; one bit of a unit's size flipped; one bit
of a unit's commit-log offset flipped. Every acknowledged message is then still served FOUND
at its queue offset with its exact bytes (get, a batched pull, the column read, a read-only
follower), the damaged unit is named in the pull's ``corrupt``, the next put takes the next
offset, and ``mqstore check --fix`` leaves units byte-identical to a queue rebuilt from the log.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.testing import open_store
from mqstore.testing.faults import (
    QUEUES, TOPIC, audit, body_for, pulled_queue, small_store_overrides, store_left_by_writer,
)
from cli_support import mqstore_json

pytestmark = pytest.mark.usefixtures("no_plugin_env")
COUNT = 2000
SEED = 5
UNIT = 20
OVERRIDES = small_store_overrides(store={"hash": "mmh3"})


@pytest.fixture(scope="module", params=["clean", "killed"])
def pristine(request, tmp_path_factory):
    """(directory, acks) of a store left as its writer left it: closed or killed."""
    root = tmp_path_factory.mktemp(f"pristine-{request.param}") / "store"
    return root, store_left_by_writer(root, OVERRIDES, SEED, COUNT, request.param)


def _queue_file(root: Path, queue_id: int) -> Path:
    return root / "consumequeue" / TOPIC / str(queue_id) / f"{0:020d}"


def _phys(units: bytes, i: int) -> int:
    return int.from_bytes(units[i * UNIT:i * UNIT + 8], "big")


def _copied_in_order(root: Path) -> int:
    """Queue 2's unit of a record lying between queue 1's units k-1 and k+1, written over
    unit k of queue 1 (from 50 on): the queue's units stay in log order. Returns k."""
    one = bytearray(_queue_file(root, 1).read_bytes())
    two = _queue_file(root, 2).read_bytes()
    for k in range(50, 400):
        lo, hi = _phys(one, k - 1), _phys(one, k + 1)
        for i in range(len(two) // UNIT):
            if lo < _phys(two, i) < hi:
                one[k * UNIT:(k + 1) * UNIT] = two[i * UNIT:(i + 1) * UNIT]
                _queue_file(root, 1).write_bytes(bytes(one))
                return k
    raise AssertionError("no unit of queue 2 lies between two of queue 1")


def _flip(root: Path, at: int, bit: int) -> None:
    data = bytearray(_queue_file(root, 1).read_bytes())
    data[at] ^= bit
    _queue_file(root, 1).write_bytes(bytes(data))


def _size_flip(root: Path) -> int:
    _flip(root, 60 * UNIT + 11, 0x02)  # the low byte of unit 60's size
    return 60


def _offset_flip(root: Path) -> int:
    _flip(root, 70 * UNIT + 7, 0x08)  # the low byte of unit 70's commit-log offset
    return 70


FAULTS = {"copied in order": _copied_in_order, "size bit": _size_flip,
          "offset bit": _offset_flip}


def _damaged(pristine, tmp_path, fault) -> tuple[Path, int]:
    root = tmp_path / "store"
    shutil.copytree(pristine[0], root)
    return root, FAULTS[fault](root)


def _serves_everything(store, acks, bad: int) -> None:
    result = audit(store, SEED, acks)  # every ack by get(offset, 1) and by message_at
    assert (result.lost, result.wrong) == ([], [])
    mine = sorted((a for a in acks if a.queue_id == 1), key=lambda a: a.queue_offset)
    ack = next(a for a in mine if a.queue_offset == bad)
    one = store.get("g", TOPIC, 1, bad, 1)
    assert one.status is GetStatus.FOUND
    assert [(m.queue_offset, m.phys_offset, m.body) for m in one.messages] == [
        (bad, ack.phys_offset, body_for(SEED, ack.index))]
    assert [c[0] for c in one.corrupt] == [bad]  # the damage is never silent
    assert f"found in the commit log at offset {ack.phys_offset}" in one.corrupt[0][2]
    # A batch that walks across the damaged unit serves it in place, and says so.
    batch = store.get("g", TOPIC, 1, bad - 5, 32)
    assert [m.queue_offset for m in batch.messages] == list(range(bad - 5, bad + 27))
    assert [c[0] for c in batch.corrupt] == [bad]
    pulled = pulled_queue(store, 1)
    assert [(m.queue_offset, m.phys_offset, m.body) for m in pulled] == [
        (a.queue_offset, a.phys_offset, body_for(SEED, a.index)) for a in mine]
    # The column read (bulk readers, the Spark connector) serves the same rows.
    read = store.read(TOPIC, 1, 0, len(mine))
    assert read.queue_offsets.tolist() == [a.queue_offset for a in mine]
    assert read.phys_offsets.tolist() == [a.phys_offset for a in mine]
    assert [bytes(read.body(i)) for i in range(len(read))] == [
        body_for(SEED, a.index) for a in mine]
    assert [c[0] for c in read.corrupt] == [bad]


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_damaged_unit_is_served_from_the_log(pristine, tmp_path, fault):
    root, bad = _damaged(pristine, tmp_path, fault)
    acks = pristine[1]
    store = open_store(root, OVERRIDES)
    try:
        store.wait_dispatched(timeout=30)
        _serves_everything(store, acks, bad)
        # Reads only: the same answers, no writes.
        follower = open_store(root, OVERRIDES, read_only=True)
        try:
            _serves_everything(follower, acks, bad)
        finally:
            follower.close()
        highest = {q: max(a.queue_offset for a in acks if a.queue_id == q)
                   for q in range(QUEUES)}
        extra = store.put(Message(TOPIC, b"after", queue_id=1))
        assert (extra.status, extra.queue_offset) == (PutStatus.PUT_OK, highest[1] + 1)
        store.wait_dispatched(timeout=30)
        assert [m.body for m in store.get("g", TOPIC, 1, extra.queue_offset, 1).messages] \
            == [b"after"]
    finally:
        store.close()
    store = open_store(root, OVERRIDES)  # and again after a reopen
    try:
        store.wait_dispatched(timeout=30)
        result = audit(store, SEED, acks)
        assert (result.lost, result.wrong) == ([], [])
    finally:
        store.close()


def _queue_files(root: Path) -> dict[str, bytes]:
    base = root / "consumequeue"
    return {str(p.relative_to(base)): p.read_bytes() for p in sorted(base.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("fault", sorted(FAULTS))
@pytest.mark.slow
def test_check_fix_rewrites_the_unit_from_the_log(pristine, tmp_path, fault):
    config = tmp_path / "store.yaml"
    config.write_text(json.dumps(OVERRIDES))  # JSON is YAML
    root, bad = _damaged(pristine, tmp_path, fault)
    found = mqstore_json("check", root, "-c", config, check=1)
    units = [p for p in found["problems"] if p["kind"] == "consume-queue"]
    assert [(p["file"], p["offset"]) for p in units] == [
        (f"consumequeue/{TOPIC}/1/{0:020d}", bad * UNIT)]
    out = mqstore_json("check", root, "-c", config, "--fix")
    assert out["after"]["clean"] and out["after"]["problems"] == []
    # A queue rebuilt from the same log with nothing to go on: the units must be the same.
    fresh = tmp_path / "fresh"
    shutil.copytree(pristine[0], fresh)
    shutil.rmtree(fresh / "consumequeue")
    store = open_store(fresh, OVERRIDES)
    try:
        store.wait_dispatched(timeout=30)
    finally:
        store.close()
    assert _queue_files(root) == _queue_files(fresh)
    store = open_store(root, OVERRIDES)
    try:
        store.wait_dispatched(timeout=30)
        result = audit(store, SEED, pristine[1])
        assert (result.lost, result.wrong) == ([], [])
        assert store.get("g", TOPIC, 1, bad, 1).corrupt == []
    finally:
        store.close()

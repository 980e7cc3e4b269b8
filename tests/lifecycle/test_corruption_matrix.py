"""A store written by a real writer process, damaged file by file, reopened with its workers.

Every case copies one pristine store (2,000 messages over 64 KiB segments, written by
``mqstore.testing.fault_writer`` in worker-process mode, closed cleanly or killed), damages
one kind of file, reopens it in the default configuration and audits every acknowledgement:

- damage to derived files (consume queues, index, checkpoint, manifest, mqstore.json, a stale
  ``abort``) loses nothing: what is missing is rebuilt from the commit log;
- damage to the commit log loses exactly the messages whose bytes were hit, never one after
  them, and nothing is ever served wrong;
- the report says what happened (never "clean" after damage), queue offsets are never reused,
  and a second reopen finds nothing left to mend.

``MQSTORE_CORRUPTION_ROUNDS=N`` adds N rounds of random faults at random places and prints
"acked N, lost M (all hit), wrong 0" lines (run with -s).
"""

from __future__ import annotations

import os
import random
import shutil
import struct
from pathlib import Path

import pytest

from mqstore import Message, PutStatus
from mqstore.testing import open_store
from mqstore.testing.faults import (
    QUEUES, TOPIC, audit, small_store_overrides, store_left_by_writer,
)

COUNT = 2000
SEG = 64 * 1024
CQ_FILE = 1000 * 20
SEED = 11
OVERRIDES = small_store_overrides(store={"hash": "mmh3"})
ROUNDS = int(os.environ.get("MQSTORE_CORRUPTION_ROUNDS", "0"))


@pytest.fixture(scope="module", params=["clean", "killed"])
def pristine(request, tmp_path_factory):
    """(directory, acks, {phys: record size}) of a store left as the writer left it."""
    root = tmp_path_factory.mktemp(f"pristine-{request.param}") / "store"
    acks = store_left_by_writer(root, OVERRIDES, SEED, COUNT, request.param)
    return root, acks, _record_sizes(root, acks), request.param


def _record_sizes(root: Path, acks) -> dict[int, int]:
    sizes = {}
    for ack in acks:
        seg = root / "commitlog" / f"{ack.phys_offset - ack.phys_offset % SEG:020d}"
        with open(seg, "rb") as f:
            f.seek(ack.phys_offset % SEG)
            sizes[ack.phys_offset] = struct.unpack(">i", f.read(4))[0]
    return sizes


def _copy(pristine, tmp_path) -> Path:
    dest = tmp_path / "store"
    shutil.copytree(pristine[0], dest)
    return dest


def _segment(root: Path, index: int) -> Path:
    return root / "commitlog" / f"{index * SEG:020d}"


def _hit(acks, sizes, begin: int, end: int) -> set[int]:
    """Indexes of the messages whose record bytes overlap commit-log ``[begin, end)``."""
    return {a.index for a in acks
            if a.phys_offset < end and a.phys_offset + sizes[a.phys_offset] > begin}


def _check(root: Path, acks, allowed_lost: set[int], *, damaged,
           overrides: dict = OVERRIDES):
    """Reopen, audit, and check the mend is complete and stable; ``damaged``: whether the
    open must report damage (or a function of the report that says so)."""
    store = open_store(root, overrides)
    try:
        report = store.recovery_report
        store.wait_dispatched(timeout=30)
        result = audit(store, SEED, acks)
        assert result.wrong == []
        lost = {a.index for a in result.lost}
        assert lost <= allowed_lost, sorted(lost - allowed_lost)[:10]
        if damaged(report) if callable(damaged) else damaged:
            assert not report.clean, report
        # Queue offsets go on after the highest one ever acknowledged, never reused.
        highest = {}
        for a in acks:
            highest[a.queue_id] = max(highest.get(a.queue_id, -1), a.queue_offset)
        for queue_id in range(QUEUES):
            assert store.max_offset(TOPIC, queue_id) == highest[queue_id] + 1
        extra = store.put(Message(TOPIC, b"after", queue_id=0))
        assert (extra.status, extra.queue_offset) == (PutStatus.PUT_OK, highest[0] + 1)
        store.wait_dispatched(timeout=30)
        found = store.get("g", TOPIC, 0, extra.queue_offset, 1).messages
        assert [m.body for m in found] == [b"after"]
        kept = [a for a in acks if a.index not in lost and a.index % 97 == 0]
        for ack in kept:  # the key index answers for the messages that survive
            hits = store.query_by_key(TOPIC, f"k{ack.index}")
            assert [m.phys_offset for m in hits] == [ack.phys_offset]
    finally:
        store.close()
    again = open_store(root, overrides)
    try:
        assert again.recovery_report.clean, again.recovery_report
        assert not again.recovery_report.abnormal
    finally:
        again.close()
    return result, lost


# -- derived files: nothing lost ------------------------------------------------------------
def _rm(path: Path) -> None:
    shutil.rmtree(path) if path.is_dir() else path.unlink()


def _garble(path: Path, rng: random.Random, at: int | None = None, length: int | None = None):
    data = bytearray(path.read_bytes())
    at = rng.randrange(len(data)) if at is None else at
    length = len(data) - at if length is None else length
    data[at:at + length] = rng.randbytes(min(length, len(data) - at))
    path.write_bytes(bytes(data))


DERIVED = {
    "consumequeue deleted": lambda r, rng: _rm(r / "consumequeue"),
    "one queue directory deleted": lambda r, rng: _rm(r / "consumequeue" / TOPIC / "1"),
    "ff unit in a queue": lambda r, rng: _poke(
        r / "consumequeue" / TOPIC / "1" / f"{0:020d}", 100 * 20, b"\xff" * 20),
    "queue file cut short": lambda r, rng: os.truncate(
        r / "consumequeue" / TOPIC / "2" / f"{0:020d}", 2501),
    "queue page zeroed": lambda r, rng: _poke(
        r / "consumequeue" / TOPIC / "3" / f"{0:020d}", 4096, bytes(4096)),
    "unit copied from another queue": lambda r, rng: _copy_unit(r),
    "index deleted": lambda r, rng: _rm(r / "index"),
    "index garbled": lambda r, rng: [_garble(p, rng, 40) for p in (r / "index").iterdir()],
    "checkpoint deleted": lambda r, rng: _rm(r / "checkpoint"),
    "checkpoint garbled": lambda r, rng: _garble(r / "checkpoint", rng, 0, 40),
    "mqstore.json deleted": lambda r, rng: _rm(r / "mqstore.json"),
    "mqstore.json garbled": lambda r, rng: (r / "mqstore.json").write_bytes(b"{\x00garbage"),
    "queue manifest garbled": lambda r, rng: (
        r / "config" / "mqstore_queues.json").write_text("[1, 2"),
    "stale abort": lambda r, rng: (r / "abort").write_text("12345"),
}


def _poke(path: Path, at: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(data)


def _copy_unit(root: Path) -> None:
    """Queue 2's last unit written over unit 50 of queue 1 (a stray unit that jumps ahead)."""
    two = (root / "consumequeue" / TOPIC / "2" / f"{0:020d}").read_bytes()
    units = [two[i:i + 20] for i in range(0, len(two), 20) if two[i:i + 20] != bytes(20)]
    _poke(root / "consumequeue" / TOPIC / "1" / f"{0:020d}", 50 * 20, units[-1])


@pytest.mark.parametrize("fault", sorted(DERIVED))
def test_damaged_derived_files_lose_nothing(pristine, tmp_path, fault):
    root = _copy(pristine, tmp_path)
    DERIVED[fault](root, random.Random(fault))
    _result, lost = _check(root, pristine[1], set(),
                           damaged=fault not in ("stale abort", "checkpoint deleted",
                                                 "checkpoint garbled", "mqstore.json deleted",
                                                 "mqstore.json garbled",
                                                 "queue manifest garbled", "index garbled",
                                                 "index deleted"))
    assert lost == set()
    if fault.startswith("mqstore.json"):
        assert _open_hash(root) == "mmh3"  # inferred from the stored tag codes


def _open_hash(root: Path) -> str:
    store = open_store(root, OVERRIDES)
    try:
        return store.hash_kind
    finally:
        store.close()


# -- the commit log: exactly what was hit is lost --------------------------------------------
def _flip_body_bit(root, acks, sizes, rng):
    ack = acks[len(acks) // 2]
    at = ack.phys_offset + 88 + 3  # a body byte (IPv4 hosts)
    _flip(root, at)
    return _hit(acks, sizes, at, at + 1)


def _flip_header_bit(root, acks, sizes, rng):
    ack = acks[len(acks) // 3]
    _flip(root, ack.phys_offset + 1)  # TOTALSIZE
    return _hit(acks, sizes, ack.phys_offset, ack.phys_offset + 1)


def _zero_page(root, acks, sizes, rng):
    begin = 3 * SEG + 8192
    _poke(_segment(root, 3), 8192, bytes(4096))
    return _hit(acks, sizes, begin, begin + 4096)


def _delete_segment(root, acks, sizes, rng):
    _segment(root, 2).unlink()
    return _hit(acks, sizes, 2 * SEG, 3 * SEG)


def _truncate_segment(root, acks, sizes, rng):
    os.truncate(_segment(root, 4), SEG // 2)
    return _hit(acks, sizes, 4 * SEG + SEG // 2, 5 * SEG)


def _garble_segment(root, acks, sizes, rng):
    _segment(root, 1).write_bytes(rng.randbytes(SEG))
    return _hit(acks, sizes, SEG, 2 * SEG)


def _flip(root: Path, phys: int, bit: int = 2) -> None:
    path = _segment(root, phys // SEG)
    with open(path, "r+b") as f:
        f.seek(phys % SEG)
        byte = f.read(1)[0]
        f.seek(phys % SEG)
        f.write(bytes([byte ^ (1 << bit)]))


COMMIT_LOG = {f.__name__.lstrip("_"): f for f in (
    _flip_body_bit, _flip_header_bit, _zero_page, _delete_segment, _truncate_segment,
    _garble_segment)}


@pytest.mark.parametrize("stale_abort", [False, True])
@pytest.mark.parametrize("fault", sorted(COMMIT_LOG))
def test_commit_log_damage_loses_exactly_what_it_hit(pristine, tmp_path, fault, stale_abort):
    root = _copy(pristine, tmp_path)
    acks, sizes = pristine[1], pristine[2]
    hit = COMMIT_LOG[fault](root, acks, sizes, random.Random(fault))
    assert hit
    if stale_abort:
        (root / "abort").write_text("12345")
    rebuilt = fault in ("flip_body_bit", "zero_page")
    if rebuilt:
        _rm(root / "consumequeue")  # and the queues must be rebuilt across the damage
    # Missing or short files are mended at open wherever they lie, as is everything a rebuild
    # walks; a flipped bit in a part of the log recovery does not read is reported when read.
    noticed = rebuilt or fault in ("delete_segment", "truncate_segment")
    result, lost = _check(root, acks, hit, damaged=noticed)
    # The queues and every message after the damage survive; whatever was hit is gone or,
    # for a bit outside the CRC, still served as stored.
    assert len(lost) <= len(hit)


# -- the newest records: their queue offsets stay taken ---------------------------------------
def _log_end(acks, sizes) -> int:
    last = max(acks, key=lambda a: a.phys_offset)
    return last.phys_offset + sizes[last.phys_offset]


def _delete_newest_segment(root, acks, sizes, rng):
    end = _log_end(acks, sizes)
    newest = (end - 1) // SEG
    _segment(root, newest).unlink()
    return _hit(acks, sizes, newest * SEG, end)


def _truncate_newest_segment(root, acks, sizes, rng):
    end = _log_end(acks, sizes)
    newest = (end - 1) // SEG
    cut = (end - newest * SEG) // 2
    os.truncate(_segment(root, newest), cut)
    return _hit(acks, sizes, newest * SEG + cut, end)


def _zero_newest_4k(root, acks, sizes, rng):
    end = _log_end(acks, sizes)
    begin = max(end - 4096, (end - 1) // SEG * SEG)
    _poke(_segment(root, begin // SEG), begin % SEG, bytes(end - begin))
    return _hit(acks, sizes, begin, end)


def _rot_newest(count: int):
    def rot(root, acks, sizes, rng):
        """One flipped body bit in each of the newest records (issue 24, point 2: the key
        index resumes at the last one, inside the region recovery quarantines)."""
        newest = sorted(acks, key=lambda a: a.phys_offset)[-count:]
        for ack in newest:
            _flip(root, ack.phys_offset + 88 + 3)
        return {a.index for a in newest}
    rot.__name__ = f"_rot_newest_{count}_records"
    return rot


NEWEST = {f.__name__.lstrip("_"): f for f in (
    _delete_newest_segment, _truncate_newest_segment, _zero_newest_4k, _rot_newest(3),
    _rot_newest(5))}


@pytest.mark.parametrize("fault", sorted(NEWEST))
def test_lost_newest_records_keep_their_queue_offsets(pristine, tmp_path, fault):
    """Issue 24, points 1 and 2: the newest records gone (or rotted) after a clean close or
    a kill. The open succeeds and says what it lost; every queue ends where it ended (fillers,
    or the units of quarantined records, hold the lost offsets), new messages go on above
    (``_check``), and nothing else is called lost."""
    root = _copy(pristine, tmp_path)
    acks, sizes = pristine[1], pristine[2]
    hit = NEWEST[fault](root, acks, sizes, random.Random(fault))
    assert hit
    reports = []
    _result, lost = _check(root, acks, hit, damaged=lambda r: reports.append(r) or True)
    assert lost == hit
    report = reports[0]
    held = {(queue, offset) for queue, runs in report.queue_offsets_lost.items()
            for first, last in runs for offset in range(first, last + 1)}
    quarantined = [(q.offset, q.offset + q.length) for q in report.quarantined]
    for ack in (a for a in acks if a.index in hit):
        assert ((f"{TOPIC}/{ack.queue_id}", ack.queue_offset) in held
                or any(b <= ack.phys_offset < e for b, e in quarantined)), ack
    assert held <= {(f"{TOPIC}/{a.queue_id}", a.queue_offset) for a in acks if a.index in hit}


def _garble_magic(root, acks, sizes, rng):
    ack = acks[len(acks) // 2]
    at = ack.phys_offset + 4  # MAGICCODE
    _poke(_segment(root, at // SEG), at % SEG, bytes(b ^ 0x5A for b in _read(root, at, 4)))
    return _hit(acks, sizes, at, at + 4)


def _read(root: Path, phys: int, length: int) -> bytes:
    with open(_segment(root, phys // SEG), "rb") as f:
        f.seek(phys % SEG)
        return f.read(length)


HEADER = {f.__name__.lstrip("_"): f for f in (_garble_magic, _flip_header_bit)}


@pytest.mark.parametrize("stale_abort", [False, True])
@pytest.mark.parametrize("fault", sorted(HEADER))
def test_header_damage_with_index_deleted(pristine, tmp_path, fault, stale_abort):
    """A damaged record header while ``index/`` is rebuilt from the whole log (issue 10,
    point 4): the rebuild passes over the bad record, dispatch keeps going, new puts become
    readable, close leaves no ``abort`` and the next open loses nothing more."""
    root = _copy(pristine, tmp_path)
    acks, sizes = pristine[1], pristine[2]
    hit = HEADER[fault](root, acks, sizes, random.Random(fault))
    assert len(hit) == 1
    _rm(root / "index")
    if stale_abort:
        (root / "abort").write_text("12345")
    _result, lost = _check(root, acks, hit, damaged=False)  # new put readable, lost <= hit
    assert lost == hit  # the bad record, and only it
    assert not (root / "abort").exists()
    after_offset = max(a.queue_offset for a in acks if a.queue_id == 0) + 1
    store = open_store(root, OVERRIDES)
    try:
        store.wait_dispatched(timeout=30)
        result = audit(store, SEED, acks)
        assert result.wrong == []
        assert {a.index for a in result.lost} == lost  # nothing more lost
        found = store.get("g", TOPIC, 0, after_offset, 1).messages
        assert [m.body for m in found] == [b"after"]
        for ack in acks:  # every surviving key answers, with exactly its message
            if ack.index in lost:
                continue
            hits = store.query_by_key(TOPIC, f"k{ack.index}")
            assert [m.phys_offset for m in hits] == [ack.phys_offset], ack.index
        assert not store.worker_status().get("failing"), store.worker_status()
    finally:
        store.close()
    assert not (root / "abort").exists()


# -- the record CRC: a flip anywhere in a record is caught -----------------------------------
CRC_OVERRIDES = small_store_overrides(store={"hash": "mmh3"}, commit_log={"record_crc": True})


@pytest.fixture(scope="module", params=["clean", "killed"])
def pristine_crc(request, tmp_path_factory):
    """As ``pristine``, written (and reopened) with ``commit_log.record_crc``."""
    root = tmp_path_factory.mktemp(f"pristine-crc-{request.param}") / "store"
    acks = store_left_by_writer(root, CRC_OVERRIDES, SEED, COUNT, request.param)
    return root, acks, _record_sizes(root, acks), request.param


@pytest.mark.parametrize("stale_abort", [False, True])
@pytest.mark.slow
def test_record_crc_catches_a_flip_in_every_byte_position(pristine_crc, tmp_path, stale_abort):
    """One record per position: each of the 88 header bytes and the last 48 bytes (topic,
    properties, the CRC property itself) gets one flipped bit. Exactly those records are
    lost, none is served with a wrong field, and recovery after a crash keeps the rest."""
    root = _copy(pristine_crc, tmp_path)
    acks, sizes = pristine_crc[1], pristine_crc[2]
    hit = set()
    for k in range(88 + 48):
        ack = acks[10 + 13 * k]
        size = sizes[ack.phys_offset]
        at = ack.phys_offset + (k if k < 88 else size - (k - 88) - 1)
        _flip(root, at, k % 8)
        hit |= _hit(acks, sizes, at, at + 1)
    assert len(hit) == 88 + 48
    if stale_abort:
        (root / "abort").write_text("12345")
    # After a crash the open walks from the record mqstore.queued names: damage it walks
    # over is reported; below it, like any bit rot an open does not read, when read.
    hit_phys = [a.phys_offset for a in acks if a.index in hit]

    def walked_over_damage(report) -> bool:
        return report.abnormal and any(p >= report.scan_from for p in hit_phys)
    result, lost = _check(root, acks, hit, damaged=walked_over_damage, overrides=CRC_OVERRIDES)
    assert result.wrong == [] and lost == hit


@pytest.mark.skipif(ROUNDS == 0, reason="set MQSTORE_CORRUPTION_ROUNDS for the long run")
def test_random_commit_log_damage_rounds(pristine_crc, tmp_path):
    """Random damage anywhere in a store written with the record CRC: every message served is
    exactly as written (without the record CRC a flip in a header field outside the body CRC
    would be served as stored, and the audit would call it wrong)."""
    pristine = pristine_crc
    acks, sizes = pristine[1], pristine[2]
    rng = random.Random(ROUNDS)
    total_acked = total_lost = 0
    for round_no in range(ROUNDS):
        root = tmp_path / f"r{round_no}"
        shutil.copytree(pristine[0], root)
        segments = sorted(p for p in (root / "commitlog").iterdir())
        seg = rng.randrange(len(segments) - 1)
        begin = rng.randrange(SEG - 4096)
        length = rng.choice([1, 7, 100, 4096])
        _poke(_segment(root, seg), begin, rng.randbytes(length))
        hit = _hit(acks, sizes, seg * SEG + begin, seg * SEG + begin + length)
        if rng.random() < 0.5:
            (root / "abort").write_text("1")
        result, lost = _check(root, acks, hit, damaged=False, overrides=CRC_OVERRIDES)
        total_acked += len(acks)
        total_lost += len(lost)
        print(f"round {round_no}: {length} bytes at {seg * SEG + begin}: acked {len(acks)}, "
              f"lost {len(lost)} (hit {len(hit)}), wrong {len(result.wrong)}")
        shutil.rmtree(root)
    print(f"corruption rounds {ROUNDS} ({pristine[3]}): acked {total_acked}, lost "
          f"{total_lost} (all of them hit by the damage), wrong 0")

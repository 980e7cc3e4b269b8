"""The key index after a crash rolls its newest file back to what it recorded on disk
(``mqstore.indexed``) and re-indexes only the records after that, instead of deleting the file
and indexing everything it held again; every key still answers exactly its messages.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from mqstore import MessageBatch, MessageStore, load_config
from mqstore.format import index_layout as L
from mqstore.storage.index_file import IndexFile
from mqstore.storage.index_progress import PROGRESS_FILE, read_progress

OVERRIDES = {
    "commit_log": {"segment_bytes": 256 * 1024},
    "index": {"max_hash_slots": 97, "max_index_entries": 100_000},
    "plugins": {"load_entry_points": False},
}
FIRST, SECOND = 1200, 900  # messages before and after the progress the test waits for

WRITER = textwrap.dedent("""
    import sys, time
    from mqstore import MessageBatch, MessageStore, load_config
    from mqstore.storage.index_progress import read_progress
    from mqstore.testing import ManualScheduler
    root, overrides = sys.argv[1], eval(sys.argv[2])
    FIRST, SECOND = int(sys.argv[3]), int(sys.argv[4])
    scheduler = ManualScheduler()  # the derived files are forced when it says, not on their own
    store = MessageStore.open(root, config=load_config(overrides=overrides), scheduler=scheduler)

    def put(prefix, lo, hi):
        for at in range(lo, hi, 100):
            n = min(100, hi - at)
            keys = [[prefix + str(i), "shared" + str(i % 7)] for i in range(at, at + n)]
            r = store.put_batch(MessageBatch(topic="T", bodies=[b"%s%d" % (prefix.encode(), i)
                                for i in range(at, at + n)], queue_ids=0, keys=keys))
            assert r.status.name == "PUT_OK", r
    put("a", 0, FIRST)
    store.wait_dispatched()
    end = store.max_phys_offset
    scheduler.run("derived_flush")  # the index records its progress, once
    progress, _ = read_progress(root)
    assert progress.indexed_until == end, (progress, end)
    print("persisted", progress.indexed_until, flush=True)
    put("b", 0, SECOND)
    store.wait_dispatched()
    print("acked", store.max_phys_offset, flush=True)
    time.sleep(600)
""")


def _crash(root) -> tuple[int, int]:
    """Run the writer, SIGKILL its process group once everything is acknowledged; returns
    the recorded progress and the log's end."""
    child = subprocess.Popen([sys.executable, "-c", WRITER, str(root), repr(OVERRIDES),
                              str(FIRST), str(SECOND)],
                             stdout=subprocess.PIPE, start_new_session=True)
    try:
        persisted = child.stdout.readline().split()
        acked = child.stdout.readline().split()
        assert persisted[0] == b"persisted" and acked[0] == b"acked", (persisted, acked)
    finally:
        os.killpg(child.pid, signal.SIGKILL)
        child.wait()
        child.stdout.close()
    return int(persisted[1]), int(acked[1])


def _check_entries(path) -> None:
    """Every record's keys are in the file once: none lost, none indexed twice."""
    f = IndexFile.load(str(path), OVERRIDES["index"]["max_hash_slots"],
                       OVERRIDES["index"]["max_index_entries"], read_only=True)
    try:
        n = f.index_count - 1
        entries = np.frombuffer(open(path, "rb").read(), dtype=L.ENTRY_DTYPE, count=n,
                                offset=L.entry_position(f.slots, 1))
        pairs = set(zip(entries["key_hash"].tolist(), entries["phys_offset"].tolist()))
        assert len(pairs) == n
        assert n == 2 * (FIRST + SECOND)  # two KEYS tokens a message (no unique key)
    finally:
        f.close()


def _check_keys(store) -> None:
    for prefix, count in (("a", FIRST), ("b", SECOND)):
        for i in range(0, count, 7):
            got = [m.body for m in store.query_by_key("T", f"{prefix}{i}")]
            assert got == [b"%s%d" % (prefix.encode(), i)], (prefix, i, got)
    # A key carried by messages on both sides of the recorded progress.
    got = sorted(m.body for m in store.query_by_key("T", "shared3", max_num=1000))
    want = sorted([b"a%d" % i for i in range(FIRST) if i % 7 == 3]
                  + [b"b%d" % i for i in range(SECOND) if i % 7 == 3])
    assert got == want


@pytest.mark.parametrize("record", ["kept", "deleted", "garbled"])
def test_a_crash_re_indexes_only_what_came_after_the_recorded_progress(tmp_path, record):
    root = tmp_path / "store"
    persisted, end = _crash(root)
    assert 0 < persisted < end
    recorded, _ = read_progress(str(root))
    if record == "deleted":
        os.unlink(root / PROGRESS_FILE)
    elif record == "garbled":
        data = bytearray((root / PROGRESS_FILE).read_bytes())
        data[-3] ^= 0x01
        (root / PROGRESS_FILE).write_bytes(bytes(data))
    store = MessageStore.open(root, config=load_config(overrides=OVERRIDES))
    try:
        report = store.recovery_report
        assert report.abnormal
        rolled = [n for n in report.notes if "recorded progress ends" in n]
        if record == "kept":
            assert rolled == [f"index: resumes at {persisted}, where its recorded progress "
                              f"ends ({PROGRESS_FILE})"]
        else:
            assert not rolled
        store.wait_dispatched()
        names = sorted(os.listdir(root / "index"))
        # Kept: the file was rolled back and extended; else deleted and built again.
        assert (names == [recorded.file]) == (record == "kept"), (names, recorded)
        _check_entries(root / "index" / names[-1])
        if record == "garbled":
            assert any("progress record ignored" in n for n in report.notes)
        assert store.max_phys_offset == end
        _check_keys(store)
    finally:
        store.close()
    # A clean reopen after the rollback answers the same.
    store = MessageStore.open(root, config=load_config(overrides=OVERRIDES))
    try:
        _check_keys(store)
    finally:
        store.close()


def _select(f: IndexFile, key_hash: int) -> list[int]:
    return [p for p, _t in f.select(key_hash, 1 << 20, 0, 1 << 62)]


def test_roll_back_restores_every_slot_chain_as_it_was(tmp_path):
    path = str(tmp_path / "20261124000000000")
    f = IndexFile.create(path, slots=13, entries=400)
    rng = np.random.default_rng(7)
    before = rng.integers(0, 1 << 31, size=150)
    after = np.concatenate([before[:40], rng.integers(0, 1 << 31, size=100)])
    f.put_keys(before, np.arange(150) * 100, 1_700_000_000_000 + np.arange(150))
    f.flush()
    header, raw = f.header, open(path, "rb").read()
    answers = {int(h): _select(f, int(h)) for h in before}
    f.put_keys(after, 100_000 + np.arange(len(after)) * 100,
               1_700_000_100_000 + np.arange(len(after)))
    assert _select(f, int(before[0])) != answers[int(before[0])]
    f.roll_back(header)
    assert f.header == header and f.check_header() is None and f.verify() is None
    assert {h: _select(f, h) for h in answers} == answers
    for h in after[40:].tolist():
        assert _select(f, h) == answers.get(h, [])
    # Header and slots are byte for byte as they were on disk; entries past the count are
    # left behind, where nothing reads them.
    now = open(path, "rb").read()
    entries_at = L.entry_position(13, header.index_count)
    assert now[:entries_at] == raw[:entries_at]
    f.close()


def test_roll_back_refuses_a_count_the_file_cannot_hold(tmp_path):
    f = IndexFile.create(str(tmp_path / "20261124000000000"), slots=5, entries=10)
    with pytest.raises(ValueError, match="indexCount 11"):
        f.roll_back(L.IndexHeader(index_count=11))
    f.close()


@pytest.mark.parametrize("loops", ["thread", "process"])
def test_progress_is_recorded_while_the_store_runs(tmp_path, loops, manual_scheduler):
    root = tmp_path / "store"
    store = MessageStore.open(root, config=load_config(overrides={
        **OVERRIDES, "dispatch": {"worker": loops}, "flush": {"worker": loops}}),
        scheduler=manual_scheduler)
    try:
        store.put_batch(MessageBatch(topic="T", bodies=[b"x"] * 10, queue_ids=0,
                                     keys=[[f"k{i}"] for i in range(10)]))
        store.wait_dispatched()
        assert read_progress(str(root)) == (None, None)  # not before the derived files' pass
        manual_scheduler.run("derived_flush")
        progress, _ = read_progress(str(root))
        assert progress.indexed_until == store.max_phys_offset
        assert progress.file is not None and progress.header.index_count == 11
    finally:
        store.close()

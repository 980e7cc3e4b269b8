"""The clean-shutdown marker (``storage.clean_marker``): instant clean reopen, never trusted wrongly.

A clean close leaves ``mqstore.clean``; the next open that finds it matching the files (and no
``abort``) walks no record and re-dispatches nothing. Every way the marker can be wrong (its
end, garbled bytes, another store's, a stale one beside ``abort``, files changed since) falls
back to the full recovery, says why in the report's notes, and loses nothing. Stores run their
loops in worker processes (the default), and the crash cases kill a real writer process.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import struct
import time
from pathlib import Path

import pytest

from mqstore import GetStatus, Message, MessageStore, PutStatus, load_config
from mqstore.plugin_api.contracts import WRITER
from mqstore.format.record import POS_SYSFLAG, store_timestamp_pos
from mqstore.plugins.index_key import KeyIndex
from mqstore.plugin_api.manager import PluginHooks, make_plugin_manager
from mqstore.storage import clean_marker
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.queue_progress import QUEUED_FILE
from mqstore.testing import ManualScheduler
from mqstore.testing.faults import FaultWriter, audit, small_store_overrides
from mqstore.runtime.workers import dispatch_worker, shm

SEG = 16 * 1024
SMALL = {"commit_log": {"segment_bytes": SEG}, "consume_queue": {"file_units": 64},
         "index": {"max_hash_slots": 64, "max_index_entries": 256}}
QUEUES = 3
MARKER = clean_marker.MARKER_FILE


def write(store, count: int, *, keys: bool = True, start: int = 0) -> list:
    """``count`` messages over QUEUES queues of topic T; (PutResult, body, key) each."""
    out = []
    for i in range(start, start + count):
        body = b"m%05d-" % i + bytes(i % 200)
        key = f"k{i}" if keys else None
        r = store.put(Message("T", body, queue_id=i % QUEUES, keys=[key] if key else None))
        assert r.status is PutStatus.PUT_OK, r
        out.append((r, body, key))
    store.wait_dispatched()
    return out


def assert_serves(store, written) -> None:
    """Every written message by offset, by pull at its queue offset, and by key."""
    for r, body, key in written:
        assert store.message_at(r.phys_offset).body == body
        got = store.get("g", "T", r.queue_id, r.queue_offset, 1)
        assert got.status is GetStatus.FOUND and got.messages[0].body == body
    for r, body, key in written[::37]:
        if key is not None:
            assert [m.phys_offset for m in store.query_by_key("T", key)] == [r.phys_offset]
    for q in range(QUEUES):
        assert store.max_offset("T", q) == sum(1 for r, _b, _k in written if r.queue_id == q)


def assert_trusted(store, end: int) -> None:
    report = store.recovery_report
    assert not report.abnormal
    assert (report.records_checked, report.redispatch_bytes) == (0, 0)
    assert report.trusted_end == report.commit_log_end == store.max_phys_offset == end
    assert report.clean
    assert any("marker" in n and "trusted:" in n for n in report.notes), report.notes


def assert_fell_back(store, why: str) -> None:
    report = store.recovery_report
    assert report.trusted_end == -1
    notes = [n for n in report.notes if "not trusted" in n]
    assert notes and why in notes[0], report.notes


def read_marker(root: Path) -> dict:
    body, problem = clean_marker.decode((root / MARKER).read_bytes())
    assert problem is None, problem
    return body


# -- the fast path -------------------------------------------------------------------------
def test_clean_reopen_walks_nothing_and_serves_everything(make_store, store_dir):
    store = make_store(SMALL)
    written = write(store, 600)
    end = store.max_phys_offset
    assert end > 4 * SEG  # several segments, several queue files
    assert not (store_dir / MARKER).exists()  # a new store has none until it closes
    store.close()
    assert not (store_dir / "abort").exists()
    assert not (store_dir / (MARKER + ".tmp")).exists()
    marker = read_marker(store_dir)
    assert marker["end"] == end and marker["index"]["active"]

    again = make_store(SMALL)
    assert_trusted(again, end)
    # Removed as the store opened for writing, before anything was appended.
    assert not (store_dir / MARKER).exists()
    assert_serves(again, written)
    more = write(again, 50, start=600)  # offsets go on where they were
    assert [r.queue_offset for r, _b, _k in more[:QUEUES]] == [200, 200, 200]
    assert_serves(again, written + more)
    end = again.max_phys_offset
    again.close()
    assert read_marker(store_dir)["end"] == end
    third = make_store(SMALL)
    assert_trusted(third, end)
    assert_serves(third, written + more)


def test_transient_pool_writer_leaves_a_marker_too(make_store, store_dir):
    overrides = {**SMALL, "writer": {"kind": "transient_pool"}}
    store = make_store(overrides)
    written = write(store, 300)
    end = store.max_phys_offset
    store.close()
    again = make_store(overrides)
    assert_trusted(again, end)
    assert_serves(again, written)


def test_read_only_open_of_a_clean_store_is_fast_too(make_store, store_dir):
    store = make_store(SMALL)
    written = write(store, 300)
    end = store.max_phys_offset
    store.close()
    reader = make_store(SMALL, read_only=True)
    assert_trusted(reader, end)
    assert_serves(reader, written)
    reader.close()
    assert (store_dir / MARKER).exists()  # a reader changes nothing
    assert_trusted(make_store(SMALL), end)


@pytest.mark.parametrize("loops", ["process", "thread"])
def test_store_without_keys_reopens_without_redispatch(make_store, store_dir, loops):
    overrides = {**SMALL, "dispatch": {"worker": loops}, "flush": {"worker": loops}}
    store = make_store(overrides)
    written = write(store, 400, keys=False)
    end = store.max_phys_offset
    store.close()
    assert read_marker(store_dir)["index"]["files"] == []  # no key: no index file

    again = make_store(overrides)
    assert_trusted(again, end)
    # The key index has no file to say where it is; the marker says it for it.
    assert again.internals.dispatchers.key_lookup().resume_offset() == end
    assert_serves(again, written)
    if loops == "process":
        # The dispatch worker's own key index learns the same end through the channel.
        assert again.internals.channels.append.trusted_end == end
    again.close()
    assert_worker_key_index_resumes_at(store_dir, overrides, end)


def assert_worker_key_index_resumes_at(root: Path, overrides: dict, end: int) -> None:
    """Build the key index as the first dispatch worker builds it after a trusted open."""
    config = load_config(overrides={"plugins": {"load_entry_points": False}, **overrides})
    channels = shm.Channels.create()
    try:
        channels.append.trusted_end = channels.append.written = end  # as Runtime.start
        hooks = PluginHooks(make_plugin_manager(load_entry_points=False))
        view = dispatch_worker._view(str(root), config, channels, time.time, False, hooks,
                                     channels.append.trusted_end)
        index = KeyIndex(view, WRITER)
        try:
            assert index.resume_offset() == end
        finally:
            index.close()
            view.close()
    finally:
        channels.close()


def test_empty_store_reopens_from_its_marker(make_store, store_dir):
    make_store(SMALL).close()
    again = make_store(SMALL)
    assert again.recovery_report.trusted_end == 0
    assert again.put(Message("T", b"x", queue_id=0)).status is PutStatus.PUT_OK


def test_the_record_ending_a_full_segment_is_its_blank(make_store, store_dir, tmp_path):
    """A log can end right after a segment's closing blank (a batch refused after its roll
    leaves the next segment empty): the blank is then the record that ends at the end."""
    store = make_store(SMALL)
    write(store, 200)
    assert store.max_phys_offset > SEG
    store.close()
    root = tmp_path / "one"
    (root / "commitlog").mkdir(parents=True)
    shutil.copy(store_dir / "commitlog" / f"{0:020d}", root / "commitlog")
    body, problem = clean_marker.describe(str(root), SEG, segment_bytes=SEG, index_active=True,
                                          max_record_bytes=4096)
    assert problem is None
    blank_at = body["commit_log"]["last_record"]
    data = (root / "commitlog" / f"{0:020d}").read_bytes()
    assert struct.unpack(">ii", data[blank_at:blank_at + 8]) == (SEG - blank_at, -875286124)
    log = CommitLog(str(root / "commitlog"), None, read_only=True)
    log.load()
    try:
        assert clean_marker.mismatch(body, log, []) is None
        body["end"] = blank_at
        assert "bytes follow" in clean_marker.mismatch(body, log, [])
    finally:
        log.close()


# -- never trusted wrongly --------------------------------------------------------------------
def _rewrite(root: Path, change) -> None:
    body = read_marker(root)
    change(body)
    (root / MARKER).write_bytes(clean_marker.encode(body))


def _other_marker(root: Path, tmp_path: Path) -> None:
    """The marker of another store, written with other segment and file sizes."""
    other = tmp_path / "other"
    cfg = load_config(overrides={**SMALL, "commit_log": {"segment_bytes": 2 * SEG},
                                 "plugins": {"load_entry_points": False},
                                 "dispatch": {"worker": "thread"}, "flush": {"worker": "thread"}})
    with MessageStore.open(other, cfg) as store:
        for i in range(300):
            store.put(Message("T", b"o%d" % i, queue_id=i % QUEUES))
    shutil.copy(other / MARKER, root / MARKER)


def _touch_queue_file(root: Path) -> None:
    path = sorted((root / "consumequeue" / "T" / "1").iterdir())[0]
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 1_000_000_000))


FAULTS = {
    # marker contents that do not describe the files
    "end one byte short": (lambda root, tmp: _rewrite(root, lambda b: b.update(end=b["end"] - 1)),
                           "bytes follow"),
    "end at an earlier record": (lambda root, tmp: _rewrite(
        root, lambda b: b.update(end=b["commit_log"]["last_record"])), "bytes follow"),
    "end past the data": (lambda root, tmp: _rewrite(
        root, lambda b: b.update(end=b["end"] + 100)), "not intact"),
    "garbled": (lambda root, tmp: (root / MARKER).write_bytes(
        (root / MARKER).read_bytes()[:40] + b"\xff\x00garbage"), "garbled"),
    "flipped digit": (lambda root, tmp: (root / MARKER).write_bytes(
        (root / MARKER).read_bytes().replace(b'"end":', b'"end":1', 1)), "CRC mismatch"),
    "empty file": (lambda root, tmp: (root / MARKER).write_bytes(b""), "garbled"),
    "from another store": (_other_marker, "segments"),
    "other format": (lambda root, tmp: _rewrite(root, lambda b: b.update(format=2)), "format"),
    "malformed, CRC right": (lambda root, tmp: _rewrite(
        root, lambda b: b["queues"].update({"T/0": "x"})), "malformed"),
    # the marker is right, the files changed since
    "stale abort": (lambda root, tmp: (root / "abort").write_text("12345"), "abort"),
    "queue file touched": (lambda root, tmp: _touch_queue_file(root), "files changed"),
    "queue directory deleted": (lambda root, tmp: shutil.rmtree(
        root / "consumequeue" / "T" / "2"), "missing or new"),
    "index deleted": (lambda root, tmp: shutil.rmtree(root / "index"), "index files differ"),
    "log appended to": (lambda root, tmp: _append_raw(root), "bytes follow"),
    "last segment deleted": (lambda root, tmp: sorted(
        (root / "commitlog").iterdir())[-1].unlink(), "segments"),
}


def _append_raw(root: Path) -> None:
    """Bytes after the recorded end, as another writer (or a restored copy) would leave."""
    marker = read_marker(root)
    end = marker["end"]
    seg = root / "commitlog" / f"{end - end % SEG:020d}"
    with open(seg, "r+b") as f:
        f.seek(end % SEG)
        f.write(b"\x00\x00\x00\x40" + b"junk" * 15)


@pytest.mark.parametrize("fault", sorted(FAULTS))
def test_a_marker_that_does_not_match_is_not_trusted(make_store, store_dir, tmp_path, fault):
    store = make_store(SMALL)
    written = write(store, 500)
    end = store.max_phys_offset
    store.close()
    damage, why = FAULTS[fault]
    damage(store_dir, tmp_path)

    again = make_store(SMALL)
    assert_fell_back(again, why)
    report = again.recovery_report
    if fault != "last segment deleted":  # that fault cuts what the segment held
        assert report.records_checked > 0  # the full recovery ran
        assert_serves(again, written)
        if fault == "log appended to":  # bytes after the end of a normal exit: quarantined
            assert report.quarantined and report.quarantined[0].offset == end
        else:
            assert again.max_phys_offset == end
    assert report.abnormal == (fault == "stale abort")
    assert not (store_dir / MARKER).exists()
    end = again.max_phys_offset
    again.close()
    assert_trusted(make_store(SMALL), end)  # and the next clean close is trusted again


# -- crashes ----------------------------------------------------------------------------------
OVERRIDES = small_store_overrides()


def test_a_crash_after_reopening_never_trusts_the_old_marker(tmp_path, watchdog):
    root = tmp_path / "store"
    first = FaultWriter(str(root), OVERRIDES, seed=1, count=800, then="close").start()
    assert first.read_until() and first.finish() == 0
    stale = (root / MARKER).read_bytes()

    second = FaultWriter(str(root), OVERRIDES, seed=2, count=1 << 20, pace_ms=1,
                         then="wait").start()
    try:
        assert second.read_until(acks=300)
        # Open for writing: the marker went before the first append.
        assert not (root / MARKER).exists()
        assert (root / "abort").exists()
    finally:
        second.kill(signal.SIGKILL)
    assert not (root / MARKER).exists()

    copies = {}
    for case in ("stale marker back", "stale marker back, abort gone"):
        copies[case] = tmp_path / case.replace(" ", "_").replace(",", "")
        shutil.copytree(root, copies[case])
    copies["as left"] = root  # last: its open also reclaims the killed store's shared memory
    (copies["stale marker back"] / MARKER).write_bytes(stale)
    (copies["stale marker back, abort gone"] / MARKER).write_bytes(stale)
    (copies["stale marker back, abort gone"] / "abort").unlink()

    config = load_config(overrides=OVERRIDES)
    for case, path in copies.items():
        with MessageStore.open(path, config) as store:
            report = store.recovery_report
            assert report.trusted_end == -1, case
            assert report.records_checked > 0, case
            if case == "as left":
                assert report.abnormal
            elif case == "stale marker back":
                assert report.abnormal
                assert any("abort file is there" in n for n in report.notes), report.notes
            else:  # the files went on past the marker's end
                assert any("not trusted" in n for n in report.notes), report.notes
            store.wait_dispatched(30)
            for writer, seed in ((first, 1), (second, 2)):
                result = audit(store, seed, writer.acks)
                assert (result.lost, result.wrong) == ([], []), (case, str(result))


def _checkpoint_times(root: Path) -> tuple[int, int, int]:
    physic, logics, _index, _master, confirm = struct.unpack(
        ">qqqqq", (root / "checkpoint").read_bytes()[:40])
    return physic, logics, confirm


def _store_time(root: Path, phys: int, seg_bytes: int) -> int:
    """STORETIMESTAMP of the record at commit-log offset ``phys``, read from its file."""
    with open(root / "commitlog" / f"{phys - phys % seg_bytes:020d}", "rb") as f:
        f.seek(phys % seg_bytes)
        head = f.read(80)
    return struct.unpack_from(">q", head, store_timestamp_pos(
        struct.unpack_from(">i", head, POS_SYSFLAG)[0]))[0]


@pytest.mark.slow
def test_abnormal_reopen_without_mqstore_queued_walks_from_a_segment_start(tmp_path, watchdog):
    """RocketMQ's rule, at segment granularity, when mqstore's own record of the derived
    files is gone (``tests/lifecycle/test_abnormal_reopen.py`` has the rest): the walk starts at the
    newest segment whose first record is older than the checkpoint's minimum time, not at the
    first one."""
    root = tmp_path / "store"
    scheduler = ManualScheduler()
    writer = FaultWriter(str(root), OVERRIDES, seed=3, count=2500, pace_ms=2,
                         then="wait", scheduler=scheduler).start()
    assert writer.read_until()  # every put answered, the store still open
    # A flush pass, then a metadata tick: the checkpoint records the last put as flushed and
    # dispatched, both its times that record's store time (and mqstore.queued is written).
    seg_bytes = OVERRIDES["commit_log"]["segment_bytes"]
    last = _store_time(root, max(a.phys_offset for a in writer.acks), seg_bytes)
    scheduler.run("flush")
    scheduler.run("metadata", "derived_flush")
    assert _checkpoint_times(root)[:2] == (last, last)
    writer.kill(signal.SIGKILL)
    assert (root / "abort").exists() and not (root / MARKER).exists()
    (root / QUEUED_FILE).unlink()
    physic, logics, _confirm = _checkpoint_times(root)
    min_time = min(physic, logics) - 3000

    with MessageStore.open(root, load_config(overrides=OVERRIDES)) as store:
        report = store.recovery_report
        assert report.abnormal and report.trusted_end == -1
        assert report.scan_from > 0, "the walk started at the first segment"
        walked = [a for a in writer.acks if a.phys_offset >= report.scan_from]
        assert report.records_checked == len(walked) < len(writer.acks)
        assert report.commit_log_end - report.scan_from < report.commit_log_end
        # The newest segment the checkpoint's times allow: its first record is older than
        # the minimum time, the next segment's is not.
        assert store.message_at(report.scan_from).store_timestamp <= min_time
        after = report.scan_from + seg_bytes
        if after < report.commit_log_end:
            assert store.message_at(after).store_timestamp > min_time
        store.wait_dispatched(30)
        result = audit(store, 3, writer.acks)
        assert (result.lost, result.wrong) == ([], []), str(result)


# -- RocketMQ's directories -------------------------------------------------------------------
def test_rocketmq_store_has_no_marker_and_opens_the_old_way(rocketmq_dir, tmp_path):
    root = tmp_path / "rmq"
    shutil.copytree(rocketmq_dir, root)
    assert not (root / MARKER).exists()
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    with MessageStore.open(root, config, read_only=True) as reader:
        assert reader.recovery_report.trusted_end == -1
        assert reader.recovery_report.records_checked > 0
        assert not any("marker" in n for n in reader.recovery_report.notes)
        end = reader.max_phys_offset
    with MessageStore.open(root, config) as store:
        assert store.recovery_report.trusted_end == -1
        assert store.max_phys_offset == end
    # mqstore's own file beside RocketMQ's, whose bytes it did not change.
    assert json.loads((root / MARKER).read_bytes())["end"] == end
    with MessageStore.open(root, config) as store:
        assert store.recovery_report.trusted_end == end
        assert store.recovery_report.records_checked == 0

"""Embedding without surprises: scripts, forgotten closes, dropped stores, killed groups,
failing plugins, other sizes. Real processes, default configuration (worker processes)."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from multiprocessing import resource_tracker
from pathlib import Path

import pytest

from mqstore import Message, MessageStore, PutStatus, load_config
from mqstore.storage.shared_segment import close_segment, open_segment, store_segment_name
from mqstore.storage.store_id import recorded_id
from mqstore.lifecycle.store_meta import load_meta
from mqstore.testing import wait_for
from mqstore.testing.faults import FaultWriter, small_store_overrides

SHM = Path("/dev/shm")


def _run(script: str, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    path = cwd / "app.py"
    path.write_text(textwrap.dedent(script))
    return subprocess.run([sys.executable, str(path)], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


def _segment(root: Path, kind: str) -> str:
    return store_segment_name(recorded_id(load_meta(str(root))[0]), kind)


def _store_segments(root: Path) -> list[str]:
    prefix = _segment(root, "")
    return sorted(p.name for p in SHM.iterdir() if p.name.startswith(prefix))


def test_a_script_without_a_main_guard_runs_once(tmp_path):
    # The README's snippet saved as a file: workers must not run it again.
    done = _run(f"""
        from mqstore import MessageStore, Message, PutStatus, load_config

        cfg = load_config(overrides={{"flush": {{"policy": "sync"}}}})
        with MessageStore.open({str(tmp_path / "data")!r}, config=cfg) as store:
            r = store.put(Message(topic="orders", body=b"...", tags="paid", keys=["order-1"]))
            assert r.status is PutStatus.PUT_OK
            store.wait_dispatched(timeout=5.0)
            print("ran", store.query_by_key("orders", "order-1")[0].body)
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("ran") == 1
    assert "Traceback" not in done.stderr and "restarting" not in done.stderr


@pytest.mark.slow
def test_exiting_without_close_closes_cleanly(tmp_path):
    root = tmp_path / "data"
    done = _run(f"""
        from mqstore import MessageStore, Message, load_config
        store = MessageStore.open({str(root)!r}, config=load_config())
        for i in range(100):
            store.put(Message("T", b"m%d" % i, queue_id=0))
        print("done")
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    for noise in ("restarting", "leaked", "Traceback", "exited with code"):
        assert noise not in done.stderr, done.stderr
    assert not (root / "abort").exists()  # closed at exit, cleanly
    assert _store_segments(root) == []
    with MessageStore.open(root, config=load_config()) as store:
        assert store.recovery_report.clean and not store.recovery_report.abnormal
        assert store.max_offset("T", 0) == 100


def test_a_dropped_store_closes_and_unlocks(tmp_path):
    root = tmp_path / "data"
    store = MessageStore.open(root, config=load_config())
    store.put(Message("T", b"x", queue_id=0))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        del store
        gc.collect()
    assert any(issubclass(w.category, ResourceWarning) and "never closed" in str(w.message)
               for w in caught)
    assert not (root / "abort").exists()
    with MessageStore.open(root, config=load_config()) as again:  # not locked any more
        assert again.max_offset("T", 0) == 1
    assert _store_segments(root) == []


def test_a_program_that_carries_on_after_sigterm_keeps_its_workers(tmp_path):
    """SIGTERM to the whole group reaches the workers too; they leave it to the store process.
    A program whose handler carries on (a reload, say) keeps them: none exits, none is
    restarted, and puts go on being dispatched and flushed."""
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(f"""
        import signal, sys
        from mqstore import MessageStore, Message, load_config
        from mqstore.testing.faults import small_store_overrides

        def on_term(signum, frame):
            print("signalled", flush=True)

        signal.signal(signal.SIGTERM, on_term)
        config = load_config(overrides=small_store_overrides(flush={{"policy": "sync"}}))
        with MessageStore.open({str(tmp_path / "data")!r}, config=config) as store:
            store.put(Message("T", b"before", queue_id=0))
            store.wait_dispatched(timeout=30)
            print("ready", flush=True)
            sys.stdin.readline()
            status = store.put(Message("T", b"after", queue_id=0)).status.name
            store.wait_dispatched(timeout=30)
            d, f = store.worker_status(), store.internals.flush_client.status()
            print(status, d["alive"], d["restarts"], f["alive"], f["restarts"],
                  store.max_offset("T", 0), flush=True)
    """))
    proc = subprocess.Popen([sys.executable, str(path)], cwd=tmp_path, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.stdout.readline().strip() == "signalled"
        # The put after "go" is flushed (sync) and dispatched by the workers, so they ran
        # after the signal; one it ended would be dead (and restarted) by then.
        out, err = proc.communicate("go\n", timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, err
    assert out.split() == ["PUT_OK", "True", "0", "True", "0", "2"], (out, err)
    for noise in ("restarting", "Traceback", "exited with code", "is gone"):
        assert noise not in err, err


def test_a_killed_group_leaves_shared_memory_that_the_next_open_reclaims(tmp_path):
    root = tmp_path / "data"
    overrides = small_store_overrides(writer={"kind": "transient_pool"})
    writer = FaultWriter(str(root), overrides, seed=3, count=10_000).start()
    writer.read_until(500)
    writer.kill(signal.SIGKILL)
    assert _store_segments(root) == sorted([_segment(root, "pool"), _segment(root, "positions")])
    with MessageStore.open(root, config=load_config(overrides=overrides)) as store:
        assert store.recovery_report.abnormal
        assert _store_segments(root) == sorted([_segment(root, "pool"),
                                                _segment(root, "positions")])
        for ack in writer.acks:
            assert store.message_at(ack.phys_offset) is not None
    assert _store_segments(root) == []


def test_store_segments_never_reach_the_resource_tracker(tmp_path, monkeypatch):
    # The store and its workers share one tracker: a register/unregister pair from each,
    # interleaved, left a KeyError traceback on stderr. Anonymous segments stay tracked.
    calls = []
    monkeypatch.setattr(resource_tracker, "register", lambda name, kind: calls.append(name))
    monkeypatch.setattr(resource_tracker, "unregister", lambda name, kind: calls.append(name))
    with MessageStore.open(tmp_path / "data", config=load_config()) as store:
        assert store.put(Message("T", b"x")).status is PutStatus.PUT_OK
        store.wait_dispatched()
    assert calls == []
    shm, owner = open_segment(None, 64)
    close_segment(shm, owner)
    assert calls == [shm._name, shm._name]


@pytest.mark.slow
def test_a_dispatcher_that_keeps_failing_refuses_puts_with_its_reason(tmp_path):
    cfg = load_config(overrides={"plugins": {"modules": ["failing_dispatcher_plugin"],
                                             "load_entry_points": False}})
    store = MessageStore.open(tmp_path / "data", config=cfg)
    try:
        first = store.put(Message("T", b"x", queue_id=0))
        assert first.status is PutStatus.PUT_OK  # taken before dispatch could fail
        wait_for(lambda: store.worker_status()["failing"], what="the dispatch failure")
        status = store.worker_status()
        assert "index backend unreachable" in status["failing"]
        assert status["alive"] and status["restarts"] == 0  # retried in place, not respawned
        refused = store.put(Message("T", b"y", queue_id=0))
        assert refused.status is PutStatus.SERVICE_NOT_AVAILABLE
        assert "RuntimeError: index backend unreachable" in refused.error
        with pytest.raises(TimeoutError, match="index backend unreachable"):
            store.wait_dispatched(timeout=0.5)
    finally:
        store.close()
    assert (tmp_path / "data" / "abort").exists()  # not clean: dispatch never caught up


def test_a_store_keeps_the_segment_size_it_was_written_with(tmp_path):
    root = tmp_path / "data"
    small = load_config(overrides={"commit_log": {"segment_bytes": 64 * 1024}})
    with MessageStore.open(root, config=small) as store:
        for i in range(600):
            store.put(Message("T", b"x" * 200, queue_id=0))
    with MessageStore.open(root, config=load_config()) as store:  # configured: 1 GiB
        assert any("written with 65536-byte segments" in note
                   for note in store.recovery_report.notes)
        assert store.internals.commit_log.segment_bytes == 64 * 1024
        r = store.put(Message("T", b"y", queue_id=0))
        assert (r.status, r.queue_offset) == (PutStatus.PUT_OK, 600)
        store.wait_dispatched()
        assert store.get("g", "T", 0, 600, 1).messages[0].body == b"y"
    sizes = {os.path.getsize(p) for p in (root / "commitlog").iterdir()}
    assert sizes == {64 * 1024}


def test_a_short_queue_file_opened_read_only_is_read_as_far_as_it_goes(tmp_path):
    root = tmp_path / "data"
    cfg = load_config(overrides=small_store_overrides())
    with MessageStore.open(root, config=cfg) as store:
        for i in range(600):
            store.put(Message("T", b"m%d" % i, queue_id=0))
    os.truncate(root / "consumequeue" / "T" / "0" / f"{0:020d}", 5001)  # mid-unit
    with MessageStore.open(root, read_only=True) as reader:
        assert any("5001 bytes" in note for note in reader.recovery_report.notes)
        assert reader.max_offset("T", 0) == 250
        assert [m.body for m in reader.get("g", "T", 0, 0, 2).messages] == [b"m0", b"m1"]
    with MessageStore.open(root, config=cfg) as store:  # the writer rebuilds what is missing
        assert store.recovery_report.queues_rebuilt == {
            "T/0": "it holds 250 units, 600 were written"}
        store.wait_dispatched()
        assert store.max_offset("T", 0) == 600

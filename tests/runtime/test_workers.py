"""The dispatch worker process: lifecycle, crash and restart, cleanup, followers (issue 3)."""

from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing import shared_memory

import pytest

from mqstore import Message, MessageBatch, MessageStore
from mqstore.errors import WorkerError
from mqstore.runtime.workers.supervisor import DISPATCH_CATCH_UP_S, STOP_TIMEOUT_S
from mqstore.testing import patience, wait_for

WORKER = {"dispatch": {"worker": "process"}}


def bodies(store, topic="T", queue_id=0):
    out, offset = [], store.min_offset(topic, queue_id)
    while True:
        res = store.get("g", topic, queue_id, offset, 32)
        if not res.messages:
            return out
        out += [m.body for m in res.messages]
        offset = res.next_begin_offset


def put_many(store, start, count, queue_id=0):
    r = store.put_batch(MessageBatch(topic="T", bodies=[b"m%d" % i for i in range(start, start + count)],
                                     queue_ids=queue_id, keys=[[f"k{i}"] for i in range(start, start + count)]))
    assert r.status.name == "PUT_OK"
    return r


def test_dispatch_runs_in_another_process_and_close_leaves_nothing(make_store):
    store = make_store(WORKER)
    status = store.worker_status()
    assert status["mode"] == "process" and status["alive"] and status["pid"] != os.getpid()
    put_many(store, 0, 50)
    store.wait_dispatched()
    assert bodies(store) == [b"m%d" % i for i in range(50)]
    assert [m.body for m in store.query_by_key("T", "k7")] == [b"m7"]
    name, proc = store.internals.channels.name, store.internals.supervisor.process
    began = time.monotonic()
    store.close()
    assert time.monotonic() - began < patience(STOP_TIMEOUT_S + DISPATCH_CATCH_UP_S)
    assert not proc.is_alive() and proc.exitcode == 0
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_reopen_after_clean_close_is_clean(make_store, store_dir):
    store = make_store(WORKER)
    put_many(store, 0, 30)
    store.close()
    assert not (store_dir / "abort").exists()
    again = make_store(WORKER)
    assert not again.recovery_report.abnormal
    assert again.recovery_report.redispatch_bytes == 0
    assert bodies(again) == [b"m%d" % i for i in range(30)]


def test_a_killed_worker_is_reported_restarted_and_loses_nothing(make_store):
    store = make_store(WORKER)
    put_many(store, 0, 100)
    store.wait_dispatched()
    victim = store.internals.supervisor.process.pid
    os.kill(victim, signal.SIGKILL)
    wait_for(lambda: store.worker_status()["restarts"], what="the worker's restart")
    put_many(store, 100, 100)
    with pytest.raises(WorkerError, match=rf"pid {victim}\) exited with code -9"):
        store.wait_dispatched(timeout=10)
    store.wait_dispatched(timeout=10)  # reported once; the new worker caught up
    status = store.worker_status()
    assert status["alive"] and status["pid"] != victim and status["restarts"] == 1
    assert bodies(store) == [b"m%d" % i for i in range(200)]
    assert [m.body for m in store.query_by_key("T", "k150")] == [b"m150"]
    assert [m.body for m in store.query_by_key("T", "k50")] == [b"m50"]
    name = store.internals.channels.name
    store.close()
    with pytest.raises(FileNotFoundError):
        shared_memory.SharedMemory(name=name)


def test_a_worker_killed_mid_stream_resumes_without_gaps_or_duplicates(make_store):
    store = make_store(WORKER)
    for round_ in range(3):
        put_many(store, round_ * 400, 400, queue_id=round_ % 2)
        os.kill(store.internals.supervisor.process.pid, signal.SIGKILL)
        # Each death is reported once, oldest first; one the monitor noticed after the last
        # round's wait returned is still queued, so a round may see two.
        for _ in range(2):
            try:
                store.wait_dispatched(timeout=15)
                break
            except WorkerError as e:
                assert "exited with code -9" in str(e)
        else:
            store.wait_dispatched(timeout=15)
    got = sorted(bodies(store, queue_id=0) + bodies(store, queue_id=1), key=lambda b: int(b[1:]))
    assert got == [b"m%d" % i for i in range(1200)]
    assert store.max_offset("T", 0) == 800 and store.max_offset("T", 1) == 400


def test_plugins_run_in_the_worker_process(make_store, tmp_path):
    out = tmp_path / "pids"
    src = f'''
import os
from mqstore import hookimpl

@hookimpl
def after_dispatch(batch):
    with open({str(out)!r}, "a") as f:
        f.write(f"dispatch {{os.getpid()}}\\n")

@hookimpl
def after_flush(flushed_offset):
    with open({str(out)!r}, "a") as f:
        f.write(f"flush {{os.getpid()}}\\n")
'''
    plugin_dir = tmp_path / "plug"
    plugin_dir.mkdir()
    (plugin_dir / "pid_recorder_plugin.py").write_text(src)
    sys.path.insert(0, str(plugin_dir))
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(plugin_dir), os.environ.get("PYTHONPATH")]))
    try:
        store = make_store({**WORKER, "flush": {"worker": "process"},
                            "plugins": {"modules": ["pid_recorder_plugin"]}})
        put_many(store, 0, 5)
        store.wait_dispatched()
        store.flush_commit_log()
        dispatch_pid = store.worker_status()["pid"]
        flush_pid = store.internals.flush_client.status()["pid"]
        store.close()
        seen = {tuple(line.split()) for line in out.read_text().splitlines()}
        assert seen == {("dispatch", str(dispatch_pid)), ("flush", str(flush_pid))}
        assert len({dispatch_pid, flush_pid, os.getpid()}) == 3
    finally:
        sys.path.remove(str(plugin_dir))
        os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].replace(str(plugin_dir), "").strip(os.pathsep)
        sys.modules.pop("pid_recorder_plugin", None)


def test_a_read_only_store_sees_queues_grow_while_written(make_store, store_dir):
    writer = make_store(WORKER)
    put_many(writer, 0, 10)
    writer.wait_dispatched()
    reader = MessageStore.open(store_dir, read_only=True)
    try:
        assert reader.max_offset("T", 0) == 10
        put_many(writer, 10, 15)
        writer.put(Message(topic="U", body=b"new topic", queue_id=3))
        writer.wait_dispatched()
        assert reader.max_offset("T", 0) == 25
        assert bodies(reader) == [b"m%d" % i for i in range(25)]
        assert reader.topics() == ["T", "U"] and reader.queue_ids("U") == [3]
        assert [m.body for m in reader.get("g", "U", 3, 0, 32).messages] == [b"new topic"]
        assert [m.body for m in reader.query_by_key("T", "k20")] == [b"m20"]
    finally:
        reader.close()


def test_segments_rolled_while_the_worker_runs(make_store):
    store = make_store({**WORKER, "commit_log": {"segment_bytes": 4096},
                        "consume_queue": {"file_units": 16}})
    put_many(store, 0, 300)
    store.wait_dispatched()
    assert len(store.internals.commit_log.segments.segments) > 5
    assert bodies(store) == [b"m%d" % i for i in range(300)]
    removed = store.delete_expired_segments(force=True, max_segments=3)
    assert removed
    assert store.min_offset("T", 0) > 0
    put_many(store, 300, 10)
    store.wait_dispatched()
    assert store.max_offset("T", 0) == 310


def test_sync_flush_with_a_worker_shows_only_flushed_messages(make_store):
    store = make_store({**WORKER, "flush": {"policy": "sync"}})
    r = store.put(Message(topic="T", body=b"durable", queue_id=0))
    assert store.flushed_offset >= r.phys_offset + r.size
    store.wait_dispatched()
    assert bodies(store) == [b"durable"]


def test_a_program_read_from_stdin_can_run_a_worker(tmp_path):
    import subprocess
    script = f'''
from mqstore import Message, MessageStore, load_config
cfg = load_config(overrides={{"dispatch": {{"worker": "process"}}, "plugins": {{"load_entry_points": False}}}})
with MessageStore.open({str(tmp_path / "s")!r}, config=cfg) as s:
    s.put(Message(topic="T", body=b"from stdin", queue_id=0))
    s.wait_dispatched(timeout=30)
    print(s.get("g", "T", 0, 0, 32).messages[0].body.decode(), s.worker_status()["restarts"])
'''
    out = subprocess.run([sys.executable, "-"], input=script, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["from", "stdin", "0"]


def test_a_worker_that_cannot_be_restarted_is_logged_and_tried_again(make_store, monkeypatch,
                                                                       caplog):
    """A restart that fails (the forkserver gone, say) is one log line, no traceback, and is
    tried again with growing pauses until the supervisor gives up; its thread never dies of
    it (a dead monitor would leave the worker dead and unreported for good)."""
    monkeypatch.setattr("mqstore.runtime.workers.supervisor.MAX_QUICK_FAILURES", 2)
    store = make_store(WORKER)
    sup = store.internals.supervisor

    def refused(restarted):
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.setattr(sup, "_spawn", refused)
    victim = sup.process.pid
    caplog.set_level("ERROR", logger="mqstore.runtime.workers.supervisor")
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 60
    while sup.gave_up is None:
        assert time.monotonic() < deadline and sup._monitor.is_alive(), sup.failures
        time.sleep(0.05)
    assert "could not be started (ConnectionRefusedError: [Errno 111] Connection refused)" \
        in sup.gave_up and "dispatch stopped" in sup.gave_up
    lines = [r for r in caplog.records if r.name == "mqstore.runtime.workers.supervisor"]
    assert len(lines) >= 3 and all(r.exc_info is None for r in lines)
    assert f"pid {victim}) exited with code -9; restarting it" in lines[0].getMessage()
    assert all("could not be started" in r.getMessage() for r in lines[1:])
    with pytest.raises(WorkerError, match=rf"pid {victim}\) exited with code -9"):
        store.wait_dispatched(timeout=1)


@pytest.mark.slow
def test_a_worker_that_cannot_start_is_given_up_on(make_store, tmp_path, monkeypatch):
    plugin_dir = tmp_path / "plug"
    plugin_dir.mkdir()
    (plugin_dir / "worker_breaker_plugin.py").write_text(f'''
import os
from mqstore import hookimpl

@hookimpl
def register_dispatchers(registry):
    if os.getpid() != {os.getpid()}:
        raise SystemExit(3)
''')
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(plugin_dir),
                                                                   os.environ.get("PYTHONPATH")])))
    monkeypatch.setattr("mqstore.runtime.workers.supervisor.QUICK_FAILURE_S", 60.0)
    monkeypatch.setattr("mqstore.runtime.workers.supervisor.MAX_QUICK_FAILURES", 2)
    store = make_store({**WORKER, "plugins": {"modules": ["worker_breaker_plugin"]}})
    store.put(Message(topic="T", body=b"x", queue_id=0))
    deadline = time.monotonic() + 60
    while not any("dispatch stopped" in f for f in store.worker_status()["failures"]):
        assert time.monotonic() < deadline, store.worker_status()
        time.sleep(0.05)
    status = store.worker_status()
    assert not status["alive"] and status["restarts"] == 2
    assert all("exited with code 3" in f for f in status["failures"])
    with pytest.raises(WorkerError, match="exited with code 3"):
        store.wait_dispatched(timeout=1)
    sys.modules.pop("worker_breaker_plugin", None)

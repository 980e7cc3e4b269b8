"""The single-writer lock holds against its file being removed or replaced, and no command
deletes or rewrites a store that a process holds open for writing (NOTE [ Store lock ]).

Writer A is a real process (``mqstore.testing.fault_writer``, worker processes, the default
configuration) putting continuously; everything else happens beside it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import pytest

from mqstore import MessageStore, load_config
from mqstore.errors import StoreLockedError
from mqstore.ops.checking.problems import CONSUME_QUEUE, Problem
from mqstore.ops.checking.repair import repair
from mqstore.runtime.workers.flush_client import TICK_INTERVAL_S
from mqstore.testing.faults import FaultWriter, audit, small_store_overrides

from cli_support import env, error_line, mqstore

OVERRIDES = small_store_overrides()


@pytest.fixture
def writer(tmp_path):
    """Writer A on ``tmp_path / "store"``, 300 messages acknowledged and putting on."""
    a = FaultWriter(str(tmp_path / "store"), OVERRIDES, seed=11, count=1 << 30, pace_ms=1,
                    stop_on_eof=True, then="close").start()
    assert a.read_until(300)
    yield a
    if a.proc.poll() is None:
        a.kill()


def _second_writer(root) -> subprocess.CompletedProcess:
    """Another process opening ``root`` for writing, as a second writer B would."""
    script = textwrap.dedent(f"""
        from mqstore import MessageStore, load_config
        MessageStore.open({str(root)!r}, config=load_config(overrides={OVERRIDES!r})).close()
    """)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env(), timeout=60)


def _reopened_holds_every_ack(root, a: FaultWriter) -> None:
    with MessageStore.open(root, config=load_config(overrides=OVERRIDES)) as store:
        result = audit(store, 11, a.acks)
        assert (result.lost, result.wrong) == ([], []), result


@pytest.mark.parametrize("how", ["removed", "replaced"])
@pytest.mark.slow
def test_a_second_writer_is_refused_after_the_lock_file_goes(writer, tmp_path, how):
    root = tmp_path / "store"
    lock = root / "lock"
    if how == "removed":
        os.unlink(lock)
    else:
        lock.with_name("lock.new").write_text("lock")
        os.replace(lock.with_name("lock.new"), lock)
    refusal = f"is open for writing by another process (pid {writer.proc.pid})"
    with pytest.raises(StoreLockedError, match=refusal.replace("(", r"\(").replace(")", r"\)")):
        MessageStore.open(root, config=load_config(overrides=OVERRIDES))
    b = _second_writer(root)
    assert b.returncode != 0 and "StoreLockedError" in b.stderr and refusal in b.stderr
    # A goes on alone, for longer than the metadata tick (a second) that looks at the lock
    alone_until = time.monotonic() + 2 * TICK_INTERVAL_S
    while time.monotonic() < alone_until:
        assert writer.read_until(len(writer.acks) + 50)
    assert writer.finish() == 0 and writer.done
    # A saw its lock file change: it says so and leaves no clean marker that could lie.
    stderr = writer.stderr.decode()
    assert f"the store's lock file {lock} was removed or replaced" in stderr
    assert "it will not be closed cleanly" in stderr and "closed, but not cleanly" in stderr
    assert (root / "abort").exists() and not (root / "mqstore.clean").exists()
    with MessageStore.open(root, config=load_config(overrides=OVERRIDES)) as store:
        assert store.recovery_report.abnormal
    _reopened_holds_every_ack(root, writer)


@pytest.mark.slow
def test_demo_force_on_a_live_store_is_refused_and_deletes_nothing(writer, tmp_path):
    root = tmp_path / "store"
    before = sorted(os.listdir(root))
    segments = sorted(os.listdir(root / "commitlog"))
    demo = mqstore("demo", "--root", root, "--force", "--count", 1000, check=1)
    assert error_line(demo) == (f"Error: mqstore demo --fresh: store {str(root)!r} is open for "
                                f"writing by another process (pid {writer.proc.pid}); nothing "
                                f"was changed")
    after = os.listdir(root)  # the writer goes on making files; the demo removed none
    assert set(before) <= set(after) and ".mqstore-demo" not in after
    assert set(segments) <= set(os.listdir(root / "commitlog"))
    assert writer.read_until(len(writer.acks) + 100)
    assert writer.finish() == 0
    assert not (root / "abort").exists()  # closed cleanly: nothing changed under it
    _reopened_holds_every_ack(root, writer)


@pytest.mark.slow
def test_check_fix_init_and_export_refuse_a_live_store(writer, tmp_path):
    root = tmp_path / "store"
    os.unlink(root / "abort")  # the writer's PID gone too: the lock alone tells
    with pytest.raises(StoreLockedError, match=f"is held by process {writer.proc.pid} \\(a "
                                               f"writer whose abort file is gone"):
        repair(str(root), load_config(overrides=OVERRIDES),
               [Problem(CONSUME_QUEUE, "consumequeue/F/0", 0, "damaged")])
    assert (root / "consumequeue").is_dir()
    check = mqstore("check", root, "--fix", check=1)
    assert error_line(check).startswith(f"Error: store {str(root)!r} is held by process")
    init = mqstore("init", root, check=1)
    assert error_line(init).startswith(f"Error: mqstore init: store {str(root)!r} is held by "
                                       f"process {writer.proc.pid}")
    mqstore("init", tmp_path / "elsewhere")  # a store to export from
    export = mqstore("export", tmp_path / "elsewhere", "--to", root, "--mode", "overwrite",
                     check=1)
    assert error_line(export).startswith(f"Error: export --to {str(root)!r}: that is a store, "
                                         f"held by process")
    assert (root / "consumequeue").is_dir() and (root / "commitlog").is_dir()
    assert writer.finish() == 0
    _reopened_holds_every_ack(root, writer)

"""What an embedding program finds on its stderr when a store's workers meet trouble: one line
per event, through logging, under a logger named ``mqstore.*``; never a traceback.

Each test runs a real program (default configuration: dispatch and flush in worker processes)
that configures logging the way an application does, with the same line layout the workers
use (``workers.logs``), and reads its whole stderr: an open interrupted by Ctrl-C while it
starts its workers, a dispatch that fails on damage no intact record follows yet (once logged
with a stray ``NoneType: None``), and a dispatch that fails on a full disk (once a full
``DiskFullError`` traceback from the dispatch worker).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from mqstore.testing.faults import small_filesystem

PROGRAM_TIMEOUT_S = 120
# A logging record, as the program's configuration below and every worker write it.
RECORD = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} "
                    r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) mqstore(\.\w+)+\[\d+\]: \S.*")

PRELUDE = """
    import logging, mmap, os, signal, sys, time
    from mqstore import Message, MessageStore, load_config
    from mqstore.runtime.log_format import LINE_FORMAT
    logging.basicConfig(format=LINE_FORMAT)

    def wait_for(what, timeout_s=60.0):
        deadline = time.monotonic() + timeout_s
        while not what():
            assert time.monotonic() < deadline, "timed out"
            time.sleep(0.01)
"""


def run_program(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    path = tmp_path / "app.py"
    path.write_text(textwrap.dedent(PRELUDE) + textwrap.dedent(body))
    # SIGINT as a terminal leaves it: a suite started in the background of a shell without job
    # control inherits it ignored, and so would the program.
    done = subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True,
                          text=True, timeout=PROGRAM_TIMEOUT_S,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert done.returncode == 0, done.stderr
    return done


def records(stderr: str) -> list[str]:
    """The lines of ``stderr``, each of which must be one logging record, without their
    timestamps."""
    lines = stderr.splitlines()
    assert "Traceback" not in stderr and "NoneType: None" not in stderr, stderr
    assert [line for line in lines if not RECORD.fullmatch(line)] == [], stderr
    return [line.split(" ", 2)[2] for line in lines]


# A Ctrl-C while an open starts a worker: sent to the store process's main thread it is held
# back until the worker process exists (the store blocks it there); sent to the process, as a
# terminal's is, another thread may take it in and it lands anywhere, even between the
# worker's fork and the store recording it.
@pytest.mark.parametrize("worker, ctrl_c", [
    ("dispatch", "signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)"),
    ("flush", "os.kill(os.getpid(), signal.SIGINT)"),
])
@pytest.mark.slow
def test_ctrl_c_while_an_open_starts_a_worker(tmp_path, worker, ctrl_c):
    # The open is interrupted; the worker it started is stopped before the store lets go of
    # its shared positions and worker lock: nothing is left running, nothing is printed, and
    # the program opens the store again at once.
    done = run_program(tmp_path, f"""
        import multiprocessing, threading
        from multiprocessing.context import ForkServerProcess

        root = {str(tmp_path / "store")!r}
        with MessageStore.open(root, config=load_config()) as store:
            store.put(Message("T", b"x", queue_id=0))
        start = ForkServerProcess.start

        def start_then_ctrl_c(process):
            start(process)
            if process.name == "mqstore-{worker}":
                {ctrl_c}

        ForkServerProcess.start = start_then_ctrl_c
        try:
            MessageStore.open(root, config=load_config())
        except KeyboardInterrupt:
            print("interrupted", [p.name for p in multiprocessing.active_children()])
        ForkServerProcess.start = start
        # No child left (printed above): a worker that was started has exited, and printed
        # whatever it was going to.
        with MessageStore.open(root, config=load_config()) as store:
            print("reopened", store.max_offset("T", 0))
    """)
    assert done.stdout.splitlines() == ["interrupted []", "reopened 1"], done.stderr
    assert records(done.stderr) == []


def test_a_worker_started_after_its_store_let_go_exits_with_one_line(tmp_path):
    # The narrowest Ctrl-C: the worker's start cut short after the fork but before the
    # process is known, and the store closing its shared positions before the worker attaches.
    root = tmp_path / "store"
    done = run_program(tmp_path, f"""
        from mqstore.clock import system_clock
        from mqstore.runtime.workers import shm
        from mqstore.runtime.workers.supervisor import DispatchSupervisor

        root = {str(root)!r}
        MessageStore.open(root, config=load_config()).close()
        channels = shm.Channels.create(f"mqs_test_{{os.getpid()}}_positions")
        supervisor = DispatchSupervisor(root, load_config(), channels, system_clock)
        channels.close()  # the segment is gone before the worker attaches
        supervisor._spawn(restarted=False)
        supervisor.process.join(60)
        print("exit", supervisor.process.exitcode)
    """)
    assert done.stdout.split() == ["exit", "0"]
    assert [re.sub(r"\[\d+\]", "", line) for line in records(done.stderr)] == [
        f"WARNING mqstore.runtime.workers.dispatch_worker: store {root} closed before its "
        f"dispatch worker "
        f"started; the worker exits"]


def test_a_dispatch_failing_on_damage_logs_one_line(tmp_path):
    # The dispatch worker is held (SIGSTOP) while three more records are written; the last
    # one's size and magic are then zeroed, so dispatch meets damage no intact record
    # follows: it fails (and retries) until the bytes come back.
    done = run_program(tmp_path, f"""
        root = {str(tmp_path / "store")!r}
        store = MessageStore.open(root, config=load_config())
        for i in range(5):
            store.put(Message("T", b"m%d" % i, queue_id=0))
        store.wait_dispatched()
        pid = store.worker_status()["pid"]
        os.kill(pid, signal.SIGSTOP)
        first, _, last = [store.put(Message("T", b"n%d" % i, queue_id=0)) for i in range(3)]
        with open(os.path.join(root, "commitlog", "0" * 20), "r+b") as f, \\
                mmap.mmap(f.fileno(), 0) as mm:
            head = bytes(mm[last.phys_offset:last.phys_offset + 8])
            mm[last.phys_offset:last.phys_offset + 8] = bytes(8)
            os.kill(pid, signal.SIGCONT)
            wait_for(lambda: store.worker_status()["failing"])
            mm[last.phys_offset:last.phys_offset + 8] = head
        store.wait_dispatched(timeout=60)
        print(first.phys_offset, last.phys_offset, "dispatched", store.max_offset("T", 0))
        store.close()
    """)
    batch, damaged = map(int, done.stdout.split()[:2])
    assert done.stdout.split()[2:] == ["dispatched", "8"]
    lines = records(done.stderr)
    failed = [line for line in lines if " failed 1 time(s): " in line]
    assert len(failed) == 1, lines
    assert re.fullmatch(
        rf"ERROR mqstore\.dispatch\.loop\[\d+\]: dispatch of the records at commit-log offset "
        rf"{damaged} failed 1 time\(s\): CorruptRecordError: commit-log offset {damaged}: "
        rf"unknown magic 0x00000000; no intact record follows yet; retrying", failed[0])
    # The retried batch begins at the first record the worker had not dispatched.
    assert any(re.fullmatch(rf"WARNING mqstore\.dispatch\.loop\[\d+\]: dispatch at commit-log "
                            rf"offset {batch} goes on after \d+ failed attempts", line)
               for line in lines), lines


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                    reason="mounting a tmpfs needs root")
def test_a_dispatch_failing_on_a_full_disk_logs_one_line(tmp_path):
    # Messages to a new queue need a new consume-queue file, which a full disk refuses: the
    # dispatch worker fails (and retries) until space comes back.
    mount = tmp_path / "fs"
    with small_filesystem(str(mount), 4 << 20):
        done = run_program(tmp_path, f"""
            from mqstore.testing.faults import fill_filesystem

            root = {str(mount / "store")!r}
            filler = {str(mount / "filler")!r}
            config = load_config(overrides={{
                "commit_log": {{"segment_bytes": 1 << 20}},
                "consume_queue": {{"file_units": 1000}},
                "index": {{"enabled": False}},
                "cleanup": {{"clean_forcibly": False, "disk_forcibly_ratio": 100,
                            "disk_warning_ratio": 100}},  # a full disk, not retention
            }})
            store = MessageStore.open(root, config=config)
            store.put(Message("T", b"first", queue_id=0))
            store.wait_dispatched()
            fill_filesystem(filler)
            # One put: while dispatch fails, the store refuses the next ones.
            got = store.put_batch([Message("T", b"to a new queue", queue_id=q) for q in (1, 2)])
            print("put", got.status.name)
            wait_for(lambda: store.worker_status()["failing"])
            os.unlink(filler)
            store.wait_dispatched(timeout=60)
            print("dispatched", store.max_offset("T", 1), store.max_offset("T", 2))
            store.close()
        """)
    assert done.stdout.splitlines() == ["put PUT_OK", "dispatched 1 1"]
    lines = records(done.stderr)
    failed = [line for line in lines if " failed 1 time(s): " in line]
    assert len(failed) == 1 and re.fullmatch(
        r"ERROR mqstore\.dispatch\.loop\[\d+\]: dispatch of the records at commit-log offset \d+ "
        r"failed 1 time\(s\): DiskFullError: .*No space left on device.*; retrying",
        failed[0]), lines

"""A full disk is a status, never SIGBUS, and nothing acknowledged is lost.

A real writer process (``mqstore.testing.fault_writer``, worker processes as by default) puts
deterministic messages into a store on a small tmpfs until the file system is full to its last
byte, in one of two ways:

- ``self``: the store fills the file system itself; what it cannot use (less than a segment)
  is then grabbed by a filler file, so the reopen below meets a disk with no byte free;
- ``filler``: after a seeded number of acknowledgements a filler file grabs every byte still
  free (os.write in shrinking chunks down to one byte) while the store goes on writing.

Then: the writer exited normally (exit 0, no SIGBUS), every refusal carries RocketMQ's status
and a reason naming the full disk, no worker died; reopening on the still-full disk in a
subprocess ends with returncode 0 or a clean error naming the disk, never a signal; space comes
back (the filler deleted, or the tmpfs resized to 64 MiB) and the audit finds every
acknowledged message at its queue offset and physical offset, byte-identical; the store takes
and serves a new message.

Cleanup: RocketMQ's forced cleanup deletes the oldest segments whatever their age once the disk
is over ``disk_forcibly_ratio`` (a full disk is), and over ``disk_warning_ratio`` the store
refuses puts before the file system is full. That is retention, not what these tests measure:
the main tests turn both off (``KEEP_EVERYTHING``) so the store meets the real ENOSPC and every
acknowledgement must survive; ``test_disk_over_warning_ratio_is_a_status_naming_the_disk``
covers the ratio refusal with the default ratios.

The default run is a half fraction of writer x flush mode x put kind x fill (every pair of
factors appears in all four combinations); ``MQSTORE_FAULT_ROUNDS=N`` runs all sixteen
combinations with N seeds each and file systems of 5 to 16 MiB. ``-s`` prints one
"acked N, lost 0, wrong 0" line per run.
"""

from __future__ import annotations

import json
import os
import random
import re
import subprocess
import sys
import time

import pytest

from mqstore import GetStatus, Message, MessageStore, PutStatus, load_config
from mqstore.testing.faults import (
    TOPIC, FaultWriter, audit, fill_filesystem, resize_filesystem, small_filesystem,
    small_store_overrides,
)

pytestmark = pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0,
                                reason="mounting a tmpfs needs root")

ROUNDS = int(os.environ.get("MQSTORE_FAULT_ROUNDS", "0"))
MiB = 1 << 20
FS_BYTES = 5 * MiB
ROOMY_BYTES = 64 * MiB
ROOM_UNDER_RATIO = 256 * 1024  # what the ratio test leaves free: 5 % of FS_BYTES
WRITER_TIMEOUT_S = 60.0
REOPEN_TIMEOUT_S = 60.0
STOP_AFTER_REFUSALS = 20  # consecutive refused messages that end the writer's run
KEEP_EVERYTHING = {"clean_forcibly": False, "disk_forcibly_ratio": 100,
                   "disk_warning_ratio": 100, "interval_ms": 300}
FULL_DISK_STATUSES = {"CREATE_MAPPED_FILE_FAILED", "SERVICE_NOT_AVAILABLE"}
NAMES_THE_DISK = re.compile(r"No space left on device|ENOSPC|disk (is )?full|DiskFull|"
                            r"no space|disk .*used", re.IGNORECASE)
# A worker that died shows in the writer's stderr as the supervisor's restart message.
WORKER_DIED = re.compile(rb"worker \(pid \d+\) exited with code")

KINDS = ["mmap", "transient_pool"]
MODES = ["async", "sync"]
BATCHES = [0, 16]
FILLS = ["self", "filler"]


def _cases():
    cases = []
    for i, kind in enumerate(KINDS):
        for j, mode in enumerate(MODES):
            for k, batch in enumerate(BATCHES):
                for m, fill in enumerate(FILLS):
                    seeds = range(ROUNDS) if ROUNDS else ([0] if (i + j + k + m) % 2 == 0 else [])
                    for seed in seeds:
                        cases.append(pytest.param(
                            kind, mode, batch, fill, seed,
                            id=f"{kind}-{mode}-{'batch' if batch else 'put'}-{fill}-{seed}"))
    return cases


def free_bytes(path: str) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def config(overrides: dict):
    return load_config(overrides=overrides)


REOPEN = r"""
import json, sys
from mqstore import Message, MessageStore, load_config
root, overrides = sys.argv[1], json.loads(sys.argv[2])
try:
    store = MessageStore.open(root, config=load_config(overrides=overrides))
except Exception as exc:
    print("refused", type(exc).__name__, " ".join(str(exc).split()), flush=True)
    sys.exit(3)
try:
    r = store.put(Message("F", b"put on the full disk", queue_id=0))
    print("put", r.status.name, " ".join(str(r.error).split()), flush=True)
finally:
    store.close()
print("closed", flush=True)
"""


def reopen_on_full_disk(root: str, overrides: dict) -> subprocess.CompletedProcess:
    """Open the store in a subprocess (faulthandler on: a fatal signal shows its stack), put
    one message, close."""
    return subprocess.run(
        [sys.executable, "-X", "faulthandler", "-c", REOPEN, root, json.dumps(overrides)],
        capture_output=True, text=True, timeout=REOPEN_TIMEOUT_S, start_new_session=True)


def check_reopen(proc: subprocess.CompletedProcess) -> str:
    where = f"\nstdout:\n{proc.stdout}\nstderr:\n{proc.stderr[-6000:]}"
    assert proc.returncode >= 0, f"reopen on the full disk died of signal {-proc.returncode}{where}"
    assert proc.returncode in (0, 3), f"reopen crashed (exit {proc.returncode}){where}"
    lines = proc.stdout.splitlines()
    if proc.returncode == 3:
        kind, _, message = lines[-1].partition(" ")
        assert kind == "refused" and NAMES_THE_DISK.search(message), \
            f"reopen refused without naming the full disk{where}"
        return lines[-1]
    assert lines[-1] == "closed", where
    _put, status, reason = lines[0].split(" ", 2)
    assert status == "PUT_OK" or (status in FULL_DISK_STATUSES and NAMES_THE_DISK.search(reason)), \
        f"put on the reopened full store answered {lines[0]!r}{where}"
    return lines[0]


def check_refusals(writer: FaultWriter) -> None:
    assert writer.refusals, "the writer met no full disk"
    for line in writer.refusals:
        _index, status, reason = line.split(" ", 2)
        assert status in FULL_DISK_STATUSES, line
        assert NAMES_THE_DISK.search(reason), f"refusal does not name the full disk: {line}"


def check_workers(writer: FaultWriter) -> None:
    died = WORKER_DIED.search(writer.stderr)
    if died is not None:
        around = writer.stderr[max(0, died.start() - 3000):died.end() + 200]
        pytest.fail("a worker died:\n" + around.decode(errors="replace"))
    status = writer.status
    assert status is not None, writer.stderr.decode(errors="replace")[-4000:]
    for name in ("dispatch", "flush"):
        worker = status[name]
        assert worker["mode"] == "process", status
        assert worker["alive"] is True, (name, status)
        assert (worker["restarts"], worker["failures"]) == (0, []), (name, status)


@pytest.mark.parametrize("kind, mode, batch, fill, seed", _cases())
@pytest.mark.slow
def test_full_disk_is_a_status_and_loses_nothing(tmp_path, watchdog, kind, mode, batch, fill,
                                                  seed):
    began = time.monotonic()
    rng = random.Random(f"{kind}:{mode}:{batch}:{fill}:{seed}")
    fs_bytes = FS_BYTES if not ROUNDS else rng.randint(5, 16) * MiB
    overrides = small_store_overrides(writer={"kind": kind}, flush={"policy": mode},
                                      cleanup=KEEP_EVERYTHING)
    with small_filesystem(str(tmp_path / "fs"), fs_bytes) as fs:
        root = os.path.join(fs, "store")
        filler = os.path.join(fs, "filler")
        writer = FaultWriter(root, overrides, seed=seed, batch=batch,
                             stop_after_refusals=STOP_AFTER_REFUSALS, then="close",
                             wait_s=1.0).start(timeout_s=WRITER_TIMEOUT_S)
        try:
            if fill == "filler":
                # Somewhere between the first segments and most of the file system.
                if writer.read_until(rng.randint(50, fs_bytes // 2 // 300)):
                    fill_filesystem(filler)
            writer.read_until()
        finally:
            code = writer.finish()
        wrote_s = time.monotonic() - began
        err = writer.stderr.decode(errors="replace")[-6000:]
        assert code == 0, f"writer exit code {code} (-7 is SIGBUS):\n{err}"
        assert writer.done, err
        check_refusals(writer)
        check_workers(writer)

        # Whatever is still free goes too: the reopen meets a disk without a free byte.
        fill_filesystem(filler)
        assert free_bytes(fs) == 0
        reopened = check_reopen(reopen_on_full_disk(root, overrides))
        reopen_s = time.monotonic() - began - wrote_s

        if fill == "filler":
            os.unlink(filler)
        else:
            resize_filesystem(fs, ROOMY_BYTES)
        store = MessageStore.open(root, config=config(overrides))
        try:
            store.wait_dispatched(timeout=30.0)
            result = audit(store, seed, writer.acks)
            print(f"\n{kind} {mode} {'put_batch' if batch else 'put'} {fill} seed {seed} "
                  f"({fs_bytes // MiB} MiB): {result}; {len(writer.refusals)} refusals, "
                  f"reopen on the full disk: {reopened}; writer {wrote_s:.1f} s, reopen "
                  f"{reopen_s:.1f} s, all {time.monotonic() - began:.1f} s")
            assert len(writer.acks) > 0
            assert (result.lost, result.wrong) == ([], []), str(result)

            # The store keeps working.
            r = store.put(Message(TOPIC, b"after space came back", queue_id=1))
            assert r.status is PutStatus.PUT_OK, r
            store.wait_dispatched(timeout=30.0)
            assert r.queue_offset == store.max_offset(TOPIC, 1) - 1
            got = store.get("g", TOPIC, 1, r.queue_offset, 1)
            assert got.status is GetStatus.FOUND
            assert [(m.body, m.phys_offset) for m in got.messages] == \
                [(b"after space came back", r.phys_offset)]
        finally:
            store.close()


def test_disk_over_warning_ratio_is_a_status_naming_the_disk(tmp_path, watchdog,
                                                             manual_scheduler):
    """Default ratios: over ``disk_warning_ratio`` puts are refused (RocketMQ's DISK_FULL
    running flag) with SERVICE_NOT_AVAILABLE and a reason that says the disk is full; once
    space is back they are taken again, and nothing acknowledged went missing."""
    overrides = small_store_overrides(cleanup={"interval_ms": 100})
    with small_filesystem(str(tmp_path / "fs"), FS_BYTES) as fs:
        filler = os.path.join(fs, "filler")
        store = MessageStore.open(os.path.join(fs, "store"), config=config(overrides),
                                  scheduler=manual_scheduler)
        try:
            first = store.put(Message(TOPIC, b"before", queue_id=0))
            assert first.status is PutStatus.PUT_OK, first
            # Over 90 % used, with room left for the consume queue and index to grow: only
            # the ratio can refuse (the segment of "before" has room too).
            os.truncate(filler, fill_filesystem(filler) - ROOM_UNDER_RATIO)
            st = os.statvfs(fs)
            assert free_bytes(fs) >= ROOM_UNDER_RATIO - 4096
            assert st.f_bavail / st.f_blocks < 1 - store.config.cleanup.disk_warning_ratio / 100
            manual_scheduler.run("cleanup")  # the cleanup job looks at the disk
            r = store.put(Message(TOPIC, b"while full", queue_id=0))
            assert r.status is PutStatus.SERVICE_NOT_AVAILABLE, r
            assert NAMES_THE_DISK.search(r.error or ""), \
                f"the refusal does not say the disk is full: {r.error!r}"
            os.unlink(filler)
            manual_scheduler.run("cleanup")
            again = store.put(Message(TOPIC, b"after", queue_id=0))
            assert again.status is PutStatus.PUT_OK, again
            assert store.message_at(first.phys_offset).body == b"before"
        finally:
            store.close()


@pytest.mark.parametrize("kind", KINDS)
def test_segments_larger_than_the_disk_fill_it_in_steps(tmp_path, watchdog, kind):
    """Segments reserve their blocks in steps ahead of the writes, so a 32 MiB segment on an
    8 MiB file system takes puts until the disk is really full (before, its first put was
    refused: the whole segment could not be reserved), then refuses them with a status that
    names the disk, from the put path's reservation, never from a write into the map or the
    transient pool's commit; nothing acknowledged is lost."""
    seg_bytes = 32 * MiB
    overrides = small_store_overrides(commit_log={"segment_bytes": seg_bytes},
                                      writer={"kind": kind, "transient_pool_buffers": 2},
                                      cleanup=KEEP_EVERYTHING)
    with small_filesystem(str(tmp_path / "fs"), 8 * MiB) as fs:
        root = os.path.join(fs, "store")
        writer = FaultWriter(root, overrides, seed=7, batch=16,
                             stop_after_refusals=STOP_AFTER_REFUSALS, then="close",
                             wait_s=1.0).start(timeout_s=WRITER_TIMEOUT_S)
        try:
            writer.read_until()
        finally:
            code = writer.finish()
        err = writer.stderr.decode(errors="replace")[-6000:]
        assert code == 0, f"writer exit code {code} (-7 is SIGBUS):\n{err}"
        assert writer.done, err
        check_refusals(writer)
        check_workers(writer)
        segment = os.path.join(root, "commitlog", "0" * 20)
        assert os.path.getsize(segment) == seg_bytes
        last = max(writer.acks, key=lambda a: a.phys_offset)
        assert 4 * MiB < last.phys_offset < os.stat(segment).st_blocks * 512 < 8 * MiB

        resize_filesystem(fs, ROOMY_BYTES)
        store = MessageStore.open(root, config=config(overrides))
        try:
            store.wait_dispatched(timeout=30.0)
            result = audit(store, 7, writer.acks)
            assert (result.lost, result.wrong) == ([], []), str(result)
            r = store.put(Message(TOPIC, b"after space came back", queue_id=1))
            assert r.status is PutStatus.PUT_OK, r
            store.wait_dispatched(timeout=30.0)  # the transient pool's commit included
            assert store.message_at(r.phys_offset).body == b"after space came back"
        finally:
            store.close()

"""SIGKILL a real writer process mid-stream, reopen its directory, check what survived.

The fault writer (``mqstore.testing.fault_writer``) prints one line per acknowledged put. The
test stops reading at a seeded random count, kills the writer's process with SIGKILL (the store
is never closed, so ``abort`` stays; its workers see their store gone and exit), reads whatever
acknowledgements were already in the pipe, and reopens the directory:

- sync flush: every acknowledged message is present and byte-identical;
- both modes: the store holds an exact prefix of what the writer put (message 0..M-1 in
  commit-log order, every queue offsets 0..n-1 with no gap), the recovery was abnormal, and
  the next put lands right after the last surviving record.
"""

from __future__ import annotations

import os
import random
import signal
import struct
from pathlib import Path

import pytest

from mqstore import GetStatus, Message, MessageStore, PutStatus, load_config
from mqstore.errors import StoreLockedError
from mqstore.testing import open_store
from mqstore.testing.faults import (
    QUEUES, TOPIC, FaultWriter, audit, body_for, queue_for, small_store_overrides, tags_for,
)

SEG = small_store_overrides()["commit_log"]["segment_bytes"]
BLANK_MAGIC = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_BYTES = 8
# Kill points per (flush mode, writer): a slice of 5 in every run (20 kills), more for a long
# run (MQSTORE_KILL_POINTS=300).
KILL_SEEDS = range(int(os.environ.get("MQSTORE_KILL_POINTS", "5")))
WRITERS = ["mmap", "transient_pool"]
MAX_KILL_AFTER = 600  # acknowledgements; about two and a half 64 KiB segments
WATCHDOG_S = 60.0


def _overrides(flush_mode: str, writer: str = "mmap") -> dict:
    return small_store_overrides(flush={"policy": flush_mode}, writer={"kind": writer})


def start_writer(root: Path, flush_mode: str, seed: int, writer: str = "mmap") -> FaultWriter:
    """The writer process, putting one message at a time until it is killed."""
    return FaultWriter(str(root), _overrides(flush_mode, writer), seed=seed).start(WATCHDOG_S)


def read_acks(writer: FaultWriter, count: int) -> None:
    if not writer.read_until(acks=count):
        writer.kill()
        pytest.fail(f"writer ended after {len(writer.acks)} acks: "
                    f"{writer.stderr.decode(errors='replace')}")


def kill(writer: FaultWriter) -> None:
    """SIGKILL to the writer's process, then every complete acknowledgement still in the
    pipe."""
    assert writer.kill(signal.SIGKILL, group=False) == -signal.SIGKILL
    assert [a.index for a in writer.acks] == list(range(len(writer.acks)))


def read_queue(store: MessageStore, queue_id: int) -> list:
    messages, offset = [], 0
    while offset < store.max_offset(TOPIC, queue_id):
        got = store.get("g", TOPIC, queue_id, offset, 32)
        assert got.status is GetStatus.FOUND, (queue_id, offset, got.status)
        assert got.next_begin_offset > offset
        messages += got.messages
        offset = got.next_begin_offset
    return messages


def blank_follows(root: Path, end: int) -> bool:
    """True when the bytes at ``end`` are the blank record that closes its segment."""
    start = end - end % SEG
    path = root / "commitlog" / f"{start:020d}"
    if not path.exists():
        return False
    with open(path, "rb") as f:
        f.seek(end - start)
        head = f.read(8)
    if len(head) < 8:
        return False
    size, magic = struct.unpack(">ii", head)
    return magic == BLANK_MAGIC and size == SEG - (end - start)


def check_recovered(root: Path, flush_mode: str, writer: FaultWriter, kind: str = "mmap"
                    ) -> None:
    seed = writer.seed
    store = open_store(root, _overrides(flush_mode, kind))
    try:
        report = store.recovery_report
        assert report.abnormal is True

        # Every queue holds offsets 0..n-1 of the writer's messages, nothing else.
        recovered = []
        for queue_id in range(QUEUES):
            messages = read_queue(store, queue_id)
            assert [m.queue_offset for m in messages] == list(range(len(messages)))
            assert store.min_offset(TOPIC, queue_id) == 0
            for m in messages:
                index = int(m.body[:8])
                assert m.body == body_for(seed, index)
                assert m.queue_id == queue_id == queue_for(seed, index)
                assert m.tags == tags_for(index)
                assert m.topic == TOPIC
            recovered += messages

        # Together they are messages 0..M-1, in commit-log order.
        recovered.sort(key=lambda m: m.phys_offset)
        indexes = [int(m.body[:8]) for m in recovered]
        assert indexes == list(range(len(recovered)))
        if flush_mode == "sync":
            assert len(recovered) >= len(writer.acks)

        # What the writer was told matches what is stored.
        by_index = {int(m.body[:8]): m for m in recovered}
        for index, queue_id, queue_offset, phys in (
                (a.index, a.queue_id, a.queue_offset, a.phys_offset) for a in writer.acks):
            if index not in by_index:
                assert flush_mode == "async"
                continue
            m = by_index[index]
            assert (m.queue_id, m.queue_offset, m.phys_offset) == (queue_id, queue_offset, phys)
            at = store.message_at(phys)
            assert at is not None and at.body == body_for(seed, index)
            assert at.queue_offset == queue_offset

        # Writes continue right after the last surviving record.
        end = recovered[-1].phys_offset + recovered[-1].size if recovered else 0
        if blank_follows(root, end):
            end += SEG - end % SEG
        assert store.max_phys_offset == end
        assert store.message_at(end) is None
        queue_id = 0
        count = sum(1 for m in recovered if m.queue_id == queue_id)
        result = store.put(Message(TOPIC, b"after the crash", queue_id=queue_id))
        assert result.status is PutStatus.PUT_OK
        expected_phys = (end if end % SEG + result.size + END_FILE_MIN_BLANK_BYTES <= SEG
                         else end + SEG - end % SEG)
        assert (result.phys_offset, result.queue_offset) == (expected_phys, count)
        store.wait_dispatched()
        got = store.get("g", TOPIC, queue_id, count, 32)
        assert [m.body for m in got.messages] == [b"after the crash"]
    finally:
        store.close()
    assert not (root / "abort").exists()


@pytest.mark.parametrize("seed", KILL_SEEDS)
@pytest.mark.parametrize("flush_mode", ["sync", "async"])
@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.slow
def test_sigkill_keeps_an_exact_prefix(tmp_path, kind, flush_mode, seed):
    root = tmp_path / "store"
    kill_after = random.Random(f"{flush_mode}:{seed}").randint(1, MAX_KILL_AFTER)
    writer = start_writer(root, flush_mode, seed, kind)
    read_acks(writer, kill_after)
    kill(writer)
    assert (root / "abort").exists()
    assert len(writer.acks) >= kill_after
    check_recovered(root, flush_mode, writer, kind)


def test_running_writer_holds_the_lock_until_killed(tmp_path):
    root = tmp_path / "store"
    writer = start_writer(root, "sync", 1234)
    read_acks(writer, 5)
    try:
        with pytest.raises(StoreLockedError, match="another process") as err:
            open_store(root, _overrides("sync"))
        assert "read_only=True" in str(err.value)
        with MessageStore.open(root, read_only=True) as reader:
            assert reader.max_phys_offset >= writer.acks[4].phys_offset
            assert reader.message_at(writer.acks[0].phys_offset).body == body_for(1234, 0)
    finally:
        kill(writer)
    check_recovered(root, "sync", writer)


# -- the whole process group killed: nothing acknowledged is lost, in any mode ---------------
GROUP_KILLS = int(os.environ.get("MQSTORE_FAULT_ROUNDS", "0"))


@pytest.mark.parametrize("seed", range(GROUP_KILLS or 1))
@pytest.mark.parametrize("batch", [0, 16])
@pytest.mark.parametrize("flush_mode", ["sync", "async"])
@pytest.mark.parametrize("kind", WRITERS)
@pytest.mark.slow
def test_sigkill_of_the_whole_group_loses_no_acknowledged_message(tmp_path, kind, flush_mode,
                                                                   batch, seed):
    """Store process and workers killed at once, as the OOM killer or a container stop does:
    under async flush too, every acknowledged message survives (the page cache holds what the
    mmap writer copied; the transient pool, kept out of the resource tracker, is written back
    by the next open)."""
    overrides = small_store_overrides(writer={"kind": kind}, flush={"policy": flush_mode})
    root = tmp_path / "store"
    writer = FaultWriter(str(root), overrides, seed=seed, batch=batch, count=1 << 30).start()
    kill_after = random.Random(f"{kind}{flush_mode}{batch}{seed}").randint(50, 3000)
    assert writer.read_until(kill_after)
    assert writer.kill(signal.SIGKILL) == -signal.SIGKILL
    store = MessageStore.open(root, config=load_config(overrides=overrides))
    try:
        assert store.recovery_report.abnormal
        result = audit(store, seed, writer.acks)
        print(f"SIGKILL group {kind}/{flush_mode}/batch {batch}/seed {seed}: {result}")
        assert (result.lost, result.wrong) == ([], [])
    finally:
        store.close()

"""RocketMQ 5's epoch file (``format.epoch_file``, ``storage.epoch_file``): its bytes, its
checks, findConsistentPoint, and the file with its backup."""

from __future__ import annotations

import pytest

from mqstore.format.epoch_file import (
    EpochEntry, EpochFileError, appended, consistent_point, decode, encode, truncated,
)
from mqstore.storage.epoch_file import BACKUP, FILE, EpochFile, read_epochs

E = EpochEntry


def test_bytes_are_rocketmqs_checkpoint_file():
    # CheckpointFile's own example: count, CRC32 of the entry lines masked to 31 bits
    # (UtilAll.crc32), then epoch-startOffset lines.
    data = encode([E(7, 7000), E(8, 8000)])
    assert data == b"2\n773307083\n7-7000\n8-8000\n"
    assert decode(data) == [E(7, 7000), E(8, 8000)]
    assert encode([]) == b"0\n0\n"
    # A CRC of 0 is RocketMQ's "not checked".
    assert decode(b"1\n0\n1-0\n") == [E(1, 0)]


@pytest.mark.parametrize("data, says", [
    (b"2\n773307083\n7-7000\n", "says 2 entries and holds 1"),
    (b"2\n773307084\n7-7000\n8-8000\n", "CRC32 is 773307084, its entries' is 773307083"),
    (b"1\n0\n7:7000\n", "line 3 of the epoch file, '7:7000', is not 'epoch-startOffset'"),
    (b"x\n0\n", "count line and a CRC32 line"),
    (b"", "count line and a CRC32 line"),
    (b"2\n0\n8-8000\n7-7000\n", "epochs and start offsets must both strictly increase"),
    (b"2\n0\n7-7000\n8-7000\n", "epochs and start offsets must both strictly increase"),
    (b"\xff\n", "not UTF-8"),
])
def test_damaged_or_disordered_files_are_refused_naming_why(data, says):
    with pytest.raises(EpochFileError, match=says.replace("(", r"\(").replace(")", r"\)")):
        decode(data)


def test_appending_needs_both_epoch_and_start_above_the_last():
    entries = appended([E(1, 0)], 2, 100)
    assert entries == [E(1, 0), E(2, 100)]
    for epoch, start in ((2, 200), (3, 100), (1, 300)):
        with pytest.raises(EpochFileError, match="strictly increase"):
            appended(entries, epoch, start)
    assert truncated([E(1, 0), E(2, 100), E(3, 500)], 100) == [E(1, 0)]


@pytest.mark.parametrize("local, local_end, remote, remote_end, point", [
    # The old master wrote 1 from 0 to 900; the slave had 600 when it became master in 2.
    ([E(1, 0)], 900, [E(1, 0), E(2, 600)], 1200, 600),
    # The slave that lags: its log is a prefix of the master's.
    ([E(1, 0)], 400, [E(1, 0), E(2, 600)], 1200, 400),
    # Newest common epoch wins: 2 began at the same offset on both sides.
    ([E(1, 0), E(2, 600)], 1000, [E(1, 0), E(2, 600), E(3, 800)], 1500, 800),
    # Epoch 2 began elsewhere on each side: the point is epoch 1's nearer end.
    ([E(1, 0), E(2, 700)], 1000, [E(1, 0), E(2, 600)], 1500, 600),
    # No epoch in common.
    ([E(5, 0)], 100, [E(1, 0)], 100, -1),
    ([], 100, [E(1, 0)], 100, -1),
])
def test_consistent_point_is_rocketmqs(local, local_end, remote, remote_end, point):
    assert consistent_point(local, local_end, remote, remote_end) == point


def test_the_file_keeps_the_version_before_as_its_backup(tmp_path):
    epochs = EpochFile(str(tmp_path))
    assert epochs.entries == [] and epochs.last_epoch == 0 and epochs.problem is None
    epochs.append(1, 0)
    assert (tmp_path / FILE).read_bytes() == encode([E(1, 0)])
    assert not (tmp_path / BACKUP).exists()
    epochs.append(2, 4096)
    assert (tmp_path / FILE).read_bytes() == encode([E(1, 0), E(2, 4096)])
    assert (tmp_path / BACKUP).read_bytes() == encode([E(1, 0)])
    assert EpochFile(str(tmp_path)).entries == [E(1, 0), E(2, 4096)]
    with pytest.raises(EpochFileError, match="strictly increase"):
        epochs.append(2, 8192)
    assert (tmp_path / FILE).read_bytes() == encode([E(1, 0), E(2, 4096)])  # unchanged


def test_a_damaged_file_is_read_from_its_backup_and_reported(tmp_path):
    epochs = EpochFile(str(tmp_path))
    epochs.append(1, 0)
    epochs.append(2, 100)
    (tmp_path / FILE).write_bytes(b"2\n1\n1-0\n2-100\n")
    entries, problem = read_epochs(str(tmp_path))
    assert entries == [E(1, 0)]
    assert f"{FILE}: the epoch file's CRC32 is 1" in problem
    (tmp_path / FILE).unlink()
    assert read_epochs(str(tmp_path)) == (
        [E(1, 0)], f"{FILE} is missing or empty; its backup {BACKUP} was read")


def test_emptied_entries_remove_file_and_backup(tmp_path):
    """RocketMQ reads an empty file as "take the backup": a cut to no entry removes both."""
    epochs = EpochFile(str(tmp_path))
    epochs.append(1, 0)
    epochs.append(2, 100)
    epochs.replace(truncated(epochs.entries, 0))
    assert not (tmp_path / FILE).exists() and not (tmp_path / BACKUP).exists()
    assert read_epochs(str(tmp_path)) == ([], None)

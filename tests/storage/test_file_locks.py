"""``storage.file_locks.is_file_at``: a lock guards the file its descriptor opened, so a holder
asks whether the path still names that file."""

from __future__ import annotations

import os

from mqstore.storage.file_locks import is_file_at


def test_the_file_is_at_its_path_until_removed_or_replaced(tmp_path):
    path = tmp_path / "lock"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        assert is_file_at(fd, str(path))
        os.unlink(path)
        assert not is_file_at(fd, str(path))  # gone
        path.write_bytes(b"")
        assert not is_file_at(fd, str(path))  # another file at the path now
        other = tmp_path / "other"
        other.write_bytes(b"")
        os.replace(other, path)
        assert not is_file_at(fd, str(path))
    finally:
        os.close(fd)


def test_a_renamed_file_goes_with_its_descriptor(tmp_path):
    path = tmp_path / "lock"
    path.write_bytes(b"")
    fd = os.open(path, os.O_RDWR)
    try:
        os.rename(path, tmp_path / "moved")
        assert is_file_at(fd, str(tmp_path / "moved")) and not is_file_at(fd, str(path))
    finally:
        os.close(fd)

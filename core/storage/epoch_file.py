"""``epochFileCheckpoint`` and ``epochFileCheckpoint.bak`` in the store root: RocketMQ 5's epoch
file (``format.epoch_file`` draws the bytes), read and replaced as its ``CheckpointFile`` does.

A write keeps the previous content as the ``.bak`` first, then replaces the file (each by a
fsynced temporary file renamed over it, ``storage.durable_file``): a crash leaves the old file
or the new one, and the ``.bak`` the one before. A reader takes the file, or the ``.bak`` when
the file is missing, damaged or empty (RocketMQ's ``CheckpointFile.read`` does the same); a
damage found is reported (``problem``), never raised. An empty list of entries removes both
files: RocketMQ reads an empty file as "look at the backup", which would bring back entries a
cut removed.
"""

from __future__ import annotations

import contextlib
import os
import threading

from mqstore.format.epoch_file import (
    EpochEntry, EpochFileError, appended, check_entries, decode, encode,
)
from mqstore.storage.durable_file import replace_file, sync_dir

FILE = "epochFileCheckpoint"
BACKUP = FILE + ".bak"


def _read(path: str) -> tuple[list[EpochEntry] | None, str | None]:
    try:
        with open(path, "rb") as f:
            data = f.read(1 << 20)
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        return None, f"{path} cannot be read ({exc.strerror or exc})"
    try:
        return decode(data), None
    except EpochFileError as exc:
        return None, f"{path}: {exc}"


def read_epochs(root: str) -> tuple[list[EpochEntry], str | None]:
    """The entries (the file's, else the backup's) and a problem found on the way (None if
    fine)."""
    entries, problem = _read(os.path.join(root, FILE))
    if entries:
        return entries, problem
    backup, backup_problem = _read(os.path.join(root, BACKUP))
    if backup:
        return backup, problem or f"{FILE} is missing or empty; its backup {BACKUP} was read"
    return [], problem or backup_problem


class EpochFile:
    """A store's epoch entries, in memory and on disk. Thread-safe."""

    def __init__(self, root: str, *, read_only: bool = False) -> None:
        self.root = root
        self.read_only = read_only
        self._lock = threading.Lock()
        self.entries, self.problem = read_epochs(root)

    @property
    def last(self) -> EpochEntry | None:
        return self.entries[-1] if self.entries else None

    @property
    def last_epoch(self) -> int:
        """The newest epoch (0: none)."""
        return self.entries[-1].epoch if self.entries else 0

    def append(self, epoch: int, start: int) -> None:
        """Add ``(epoch, start)``: EpochFileError unless both are above the last entry's."""
        with self._lock:
            self._write(appended(self.entries, epoch, start))

    def replace(self, entries: list[EpochEntry]) -> None:
        """Make ``entries`` the file's (a slave taking its master's, a cut log's own)."""
        with self._lock:
            self._write(check_entries(entries))

    def _write(self, entries: list[EpochEntry]) -> None:
        if self.read_only:
            raise PermissionError(f"the epoch file of {self.root!r} is open read-only")
        if entries == self.entries and not self.problem:
            return
        path, backup = os.path.join(self.root, FILE), os.path.join(self.root, BACKUP)
        if not entries:
            for name in (path, backup):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)
            sync_dir(self.root)
        else:
            if self.entries:
                replace_file(backup, encode(self.entries), fsync=True)
            replace_file(path, encode(entries), fsync=True, sync_directory=True)
        self.entries, self.problem = entries, None


__all__ = ["FILE", "BACKUP", "EpochFile", "read_epochs"]

"""The abort marker: ``abort`` in the store root exists while a writer has the store open and
holds its PID (as RocketMQ 5.x writes it; 4.x leaves it empty). A leftover one means the last
exit was not clean, so the next open recovers abnormally."""

from __future__ import annotations

import os

from mqstore.storage.durable_file import write_small_file

ABORT_FILE = "abort"


def abort_exists(root: str) -> bool:
    return os.path.exists(os.path.join(root, ABORT_FILE))


def create_abort(root: str) -> None:
    write_small_file(os.path.join(root, ABORT_FILE), str(os.getpid()).encode())


def remove_abort(root: str) -> None:
    try:
        os.unlink(os.path.join(root, ABORT_FILE))
    except FileNotFoundError:
        pass

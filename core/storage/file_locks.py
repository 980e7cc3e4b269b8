"""Locks on files that other processes may remove: is the file we locked still the one there?

A lock taken on a descriptor guards the file that descriptor opened. Another process may have
unlinked (or replaced) the path after we opened it and before the lock was granted; the lock
then guards a file nobody else will ever open, so a holder checks after locking that the path
still names its file.
"""

from __future__ import annotations

import os


def is_file_at(fd: int, path: str) -> bool:
    """Whether ``fd`` is the file now at ``path`` (not one unlinked or replaced since)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return False
    own = os.fstat(fd)
    return (own.st_dev, own.st_ino) == (st.st_dev, st.st_ino)

"""Create or attach a named shared-memory segment, and let go of it: one owner unlinks.

A store's segments (its shared positions and its transient pool) are named after the store's
id (``store_segment_name``; ``storage.store_id``: recorded in ``mqstore.json``, so it moves
with the directory) and kept out of multiprocessing's resource tracker: the tracker unlinks
what it tracks when the process that started it dies, and a killed store's transient pool
holds acknowledged messages that the next open writes back into the commit log
(``storage.transient_pool.salvage``). The owner unlinks them at close; after a crash, the next
writable open of the store, wherever its directory went, reclaims them. Stores written before
the id existed named them after the directory's path (``path_segment_name``): an open still
reclaims those. Anonymous segments (``name=None``) stay tracked, as multiprocessing makes
them.
"""

from __future__ import annotations

import hashlib
import os
import sys
import threading
from multiprocessing import resource_tracker, shared_memory

import _posixshmem

from mqstore.storage.mapped_file import reserve_file

SHM_DIR = "/dev/shm"


def store_segment_name(store_id: str, kind: str) -> str:
    """The name of a store's ``kind`` segment: one per store (``storage.store_id``)."""
    return f"mqs_{store_id}_{kind}"


def path_segment_name(root: str, kind: str) -> str:
    """The name a store's ``kind`` segment had before stores had an id: one per path."""
    digest = hashlib.sha1(os.path.realpath(root).encode()).hexdigest()[:20]
    return f"mqs_{digest}_{kind}"


def open_segment(name: str | None, size: int, *, create: bool | None = None,
                 tracked: bool = True) -> tuple[shared_memory.SharedMemory, bool]:
    """A new segment of ``size`` bytes (owned) when ``name`` is None or ``create`` is set,
    else the named one. ``tracked=False`` keeps it out of the resource tracker."""
    if create is None:
        create = name is None
    if not create:
        return _shared_memory(name, False, 0, tracked), False
    shm = _shared_memory(name, True, size, tracked)
    try:
        # Pages of a full /dev/shm are SIGBUS on first touch; refuse now instead.
        reserve_file(shm._fd, size, f"{SHM_DIR}{shm._name}")
    except BaseException:
        close_segment(shm, True, tracked)
        raise
    return shm, True


class _Untracked:
    """Stands in for the resource tracker inside ``shared_memory`` while an untracked segment
    opens: registering and then unregistering it would race the same calls of the store's
    other processes in the one tracker they share, whose set then misses a name (a KeyError
    traceback on stderr)."""

    @staticmethod
    def register(_name, _rtype) -> None:
        return None

    unregister = register


_UNTRACKED_LOCK = threading.Lock()


def _shared_memory(name: str | None, create: bool, size: int,
                   tracked: bool) -> shared_memory.SharedMemory:
    if sys.version_info >= (3, 13):
        return shared_memory.SharedMemory(name=name, create=create, size=size, track=tracked)
    with _UNTRACKED_LOCK:  # a tracked one opening meanwhile would miss its registration
        if tracked:
            return shared_memory.SharedMemory(name=name, create=create, size=size)
        shared_memory.resource_tracker = _Untracked
        try:
            return shared_memory.SharedMemory(name=name, create=create, size=size)
        finally:
            shared_memory.resource_tracker = resource_tracker


def close_segment(shm: shared_memory.SharedMemory, owner: bool, tracked: bool = True) -> None:
    """Detach; the owner also unlinks, so the segment is gone once every view closes."""
    shm.close()
    if owner:
        unlink_segment(shm._name, tracked)


def unlink_segment(name: str, tracked: bool = False) -> bool:
    """Remove a segment by name (a leftover of a killed store); True if it existed."""
    try:
        _posixshmem.shm_unlink(name if name.startswith("/") else "/" + name)
    except FileNotFoundError:
        return False
    if tracked:
        resource_tracker.unregister(name if name.startswith("/") else "/" + name,
                                    "shared_memory")
    return True

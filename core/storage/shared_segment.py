"""Create or attach a named shared-memory segment, and let go of it: one owner unlinks.

Spawned workers share the store's resource tracker, so attaching only repeats the store's
registration: a segment is unlinked by its owner's close(), or by the tracker if the owning
process is killed.
"""

from __future__ import annotations

from multiprocessing import shared_memory


def open_segment(name: str | None, size: int) -> tuple[shared_memory.SharedMemory, bool]:
    """A new segment of ``size`` bytes when ``name`` is None (owned), else the named one."""
    if name is None:
        return shared_memory.SharedMemory(create=True, size=size), True
    return shared_memory.SharedMemory(name=name), False


def close_segment(shm: shared_memory.SharedMemory, owner: bool) -> None:
    """Detach; the owner also unlinks, so the segment is gone once every view closes."""
    shm.close()
    if owner:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass

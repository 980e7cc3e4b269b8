"""Create or attach a named shared-memory segment, and let go of it: one owner unlinks.

Spawned workers share the store's resource tracker, so attaching only repeats the store's
registration: a segment is unlinked by its owner's close(), or by the tracker if the owning
process is killed.
"""

from __future__ import annotations

from multiprocessing import shared_memory

from mqstore.storage.mapped_file import reserve_file


def open_segment(name: str | None, size: int) -> tuple[shared_memory.SharedMemory, bool]:
    """A new segment of ``size`` bytes when ``name`` is None (owned), else the named one."""
    if name is None:
        shm = shared_memory.SharedMemory(create=True, size=size)
        try:
            # Pages of a full /dev/shm are SIGBUS on first touch; refuse now instead.
            reserve_file(shm._fd, size, f"/dev/shm{shm._name}")
        except BaseException:
            close_segment(shm, True)
            raise
        return shm, True
    return shared_memory.SharedMemory(name=name), False


def close_segment(shm: shared_memory.SharedMemory, owner: bool) -> None:
    """Detach; the owner also unlinks, so the segment is gone once every view closes."""
    shm.close()
    if owner:
        try:
            shm.unlink()
        except FileNotFoundError:
            pass

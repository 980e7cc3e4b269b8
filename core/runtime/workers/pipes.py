"""One-byte pipe signals between the store and its workers.

A byte in a pipe says "look at the shared positions again"; the positions carry the meaning.
Unlike locks, events or conditions, a pipe cannot be left held by a process killed at any
instant, so a SIGKILL on either side never deadlocks the other.
"""

from __future__ import annotations

import os
import select


def poke(conn) -> None:
    """Write one byte to a pipe without blocking (a full pipe already means "wake up")."""
    try:
        os.write(conn.fileno(), b"\0")
    except (BlockingIOError, BrokenPipeError, OSError):
        pass


def wait_and_drain(conn, timeout: float) -> bool:
    """Sleep until a byte arrives or ``timeout`` passes, then empty the pipe; True when a
    byte came.

    One ``poll`` on one descriptor and one read (``poll``, unlike ``select``, takes descriptors
    past 1024, which a store with many mapped files reaches). A readable pipe never blocks
    ``read``; the bytes it holds are far fewer than one read takes.
    """
    fd = conn.fileno()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    if poller.poll(1000.0 * max(timeout, 0.0)):
        os.read(fd, 65536)
        return True
    return False

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


def wait_and_drain(conn, timeout: float) -> None:
    """Sleep until a byte arrives or ``timeout`` passes, then empty the pipe.

    One ``select`` on one descriptor and one read: this runs once per sync-flush round trip,
    so it avoids building a selector or flipping the descriptor's blocking mode each time. A
    readable pipe never blocks ``read``; the bytes it holds are far fewer than one read takes.
    """
    fd = conn.fileno()
    if select.select((fd,), (), (), max(timeout, 0.0))[0]:
        os.read(fd, 65536)

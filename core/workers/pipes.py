"""One-byte pipe signals between the store and its workers.

A byte in a pipe says "look at the shared positions again"; the positions carry the meaning.
Unlike locks, events or conditions, a pipe cannot be left held by a process killed at any
instant, so a SIGKILL on either side never deadlocks the other.
"""

from __future__ import annotations

import os
from multiprocessing import connection


def poke(conn) -> None:
    """Write one byte to a pipe without blocking (a full pipe already means "wake up")."""
    try:
        os.write(conn.fileno(), b"\0")
    except (BlockingIOError, BrokenPipeError, OSError):
        pass


def wait_and_drain(conn, timeout: float) -> None:
    """Sleep until a byte arrives or ``timeout`` passes, then empty the pipe."""
    if connection.wait([conn], timeout):
        fd = conn.fileno()
        blocking = os.get_blocking(fd)
        os.set_blocking(fd, False)
        try:
            while os.read(fd, 4096):
                pass
        except (BlockingIOError, OSError):
            pass
        finally:
            os.set_blocking(fd, blocking)

"""Taking connections off a listening socket on an asyncio loop, whatever the descriptor limit
leaves: what ``serve``'s HTTP server and the remoting listener share.

``Acceptor`` takes up to ACCEPT_BATCH connections off the queue per wake-up of the loop and
hands each to its owner (``admit``), who decides whether to keep it. When accept itself fails
for want of descriptors, a descriptor kept in reserve is let go for an instant to take the
pending connection off the queue and close it (``refused``); when not even that can be had,
or accept fails otherwise, accepting rests ACCEPT_PAUSE_S (``failed``). Either way the
listening socket never stays readable with nothing taken off it (a busy loop), and asyncio's
own accept (a traceback per failed accept, over and over) is not used. What is logged, and
how often, is the owner's: the callbacks say what happened.
"""

from __future__ import annotations

import asyncio
import errno
import os
import socket
from typing import Callable

ACCEPT_BATCH = 64  # connections taken off the listen queue per wake-up of the loop
ACCEPT_PAUSE_S = 0.5  # accepting rests this long when not even the reserve descriptor is free
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
THEIR_OWN_TROUBLE = (errno.ECONNABORTED, errno.EPROTO, errno.EPERM)  # that connection's own


class Acceptor:
    """A listening socket on ``host:port`` (bound by the constructor: a port in use fails
    there). Once started, each accepted connection goes to ``admit(sock)``; each one taken
    off the queue on the reserve descriptor and closed is told to ``refused(exc)`` (``exc``
    the accept's failure); an accept failing otherwise to ``failed(exc)``, before accepting
    rests ACCEPT_PAUSE_S. ``start`` and ``close`` on the loop's thread."""

    def __init__(self, host: str, port: int, backlog: int, *,
                 admit: Callable[[socket.socket], None],
                 refused: Callable[[OSError], None],
                 failed: Callable[[OSError], None]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=backlog)
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self._admit = admit
        self._refused = refused
        self._failed = failed
        self._reserve = _reserve_fd()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        """No new connections; those admitted stay the owner's to close."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None

    def _accept(self) -> None:
        for _ in range(ACCEPT_BATCH):
            try:
                sock, _address = self._sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_DESCRIPTORS and self._refuse_on_reserve(exc):
                    continue
                if exc.errno in THEIR_OWN_TROUBLE:
                    continue
                self._failed(exc)
                self._pause()
                return
            self._admit(sock)

    def _refuse_on_reserve(self, exc: OSError) -> bool:
        """Take one pending connection off the queue on the reserve descriptor and close it;
        False when not even the reserve could be had."""
        if self._reserve is None:
            self._reserve = _reserve_fd()
            if self._reserve is None:
                return False
        os.close(self._reserve)
        self._reserve = None
        try:
            sock, _address = self._sock.accept()
        except BlockingIOError:
            return True  # nothing pending any more
        except OSError:
            return False  # another thread took the descriptor first
        else:
            sock.close()
            self._refused(exc)
            return True
        finally:
            self._reserve = _reserve_fd()

    def _pause(self) -> None:
        self._loop.remove_reader(self._sock.fileno())
        self._loop.call_later(ACCEPT_PAUSE_S, self._resume)

    def _resume(self) -> None:
        if not self._closed:
            self._loop.add_reader(self._sock.fileno(), self._accept)


def _reserve_fd() -> int | None:
    try:
        return os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None


__all__ = ["Acceptor", "ACCEPT_BATCH", "ACCEPT_PAUSE_S", "OUT_OF_DESCRIPTORS"]

"""The remoting port's listening socket: it accepts at most ``cap`` connections at once (NOTE
[ Listener descriptors ]) and closes a connection past it at once, before a byte of it is read,
so strangers that only connect hold no descriptor for long.

When accept itself fails for want of descriptors, a descriptor kept in reserve is let go for an
instant to take the pending connection off the queue and close it; when not even that can be
had, accepting rests ACCEPT_PAUSE_S. Either way the listening socket never stays readable with
nothing taken off it (a busy loop), and asyncio's own accept (a traceback per failed accept,
over and over) is not used. Closings past the cap and refusals for want of descriptors are
logged at most once a minute each, with the count of those not logged (``mqstore.log_limit``).
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import socket
from typing import Callable

from mqstore import log_limit

log = logging.getLogger(__name__)
ACCEPT_BATCH = 64  # connections taken off the listen queue per wake-up of the loop
ACCEPT_PAUSE_S = 0.5  # accepting rests this long when not even the reserve descriptor is free
BACKLOG = 1024
OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)
THEIR_OWN_TROUBLE = (errno.ECONNABORTED, errno.EPROTO, errno.EPERM)


class Listener:
    """Connections on ``host:port`` for ``protocol_factory``, at most ``cap`` at once: those
    ``held()`` says are open and those accepted but not yet handed over. Bound by the
    constructor (a port in use fails there); ``start`` and ``close`` on the loop's thread."""

    def __init__(self, host: str, port: int, cap: int, protocol_factory: Callable,
                 held: Callable[[], int]) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._sock = socket.create_server((host, port), family=family, backlog=BACKLOG)
        self._sock.setblocking(False)
        self.port: int = self._sock.getsockname()[1]
        self.cap = cap
        self._factory = protocol_factory
        self._held = held
        self._handing = 0  # accepted, their transports not made yet
        self._tasks: set[asyncio.Task] = set()
        self._reserve = _reserve_fd()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limiter: log_limit.RateLimit | None = None
        self._closed = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._limiter = log_limit.limit(log, level=logging.WARNING)
        self._loop.add_reader(self._sock.fileno(), self._accept)

    def close(self) -> None:
        """No new connections; those accepted stay the server's to close."""
        if self._closed:
            return
        self._closed = True
        if self._loop is not None:
            self._loop.remove_reader(self._sock.fileno())
        self._sock.close()
        if self._reserve is not None:
            os.close(self._reserve)
            self._reserve = None
        if self._limiter is not None:
            log_limit.remove(log, self._limiter)

    # -- accepting ---------------------------------------------------------------------------
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
                log.warning("accepting remoting connections failed: %s; accepting again in "
                            "%.1f s", exc, ACCEPT_PAUSE_S)
                self._pause()
                return
            open_now = self._held() + self._handing
            if open_now >= self.cap:
                sock.close()
                log.warning("closed new remoting connections at once: %d connections are "
                            "open, the most this server takes (server.remoting_max_"
                            "connections, or fewer as the descriptor limit leaves room)",
                            open_now)
                continue
            self._hand_over(sock)

    def _hand_over(self, sock: socket.socket) -> None:
        self._handing += 1
        task = self._loop.create_task(self._connect(sock))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _connect(self, sock: socket.socket) -> None:
        try:
            await self._loop.connect_accepted_socket(self._factory, sock)
        except (OSError, RuntimeError) as exc:  # the peer left first, or the loop is closing
            log.debug("a remoting connection ended as it was accepted: %s", exc)
            sock.close()
        finally:
            self._handing -= 1

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
            log.warning("refused remoting connections: out of file descriptors (%s)",
                        os.strerror(exc.errno))
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


__all__ = ["Listener", "ACCEPT_PAUSE_S", "BACKLOG"]

"""The remoting port's listening socket: it accepts at most ``cap`` connections at once (NOTE
[ Listener descriptors ]) and closes a connection past it at once, before a byte of it is read,
so strangers that only connect hold no descriptor for long.

Accepting, and refusing for want of descriptors without a busy loop, is
``mqstore.accepting.Acceptor``'s. Closings past the cap and refusals for want of descriptors
are logged at most once a minute each, with the count of those not logged
(``mqstore.log_limit``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import Callable

from mqstore import log_limit
from mqstore.accepting import ACCEPT_PAUSE_S, Acceptor

log = logging.getLogger(__name__)
BACKLOG = 1024


class Listener:
    """Connections on ``host:port`` for ``protocol_factory``, at most ``cap`` at once: those
    ``held()`` says are open and those accepted but not yet handed over. Bound by the
    constructor (a port in use fails there); ``start`` and ``close`` on the loop's thread."""

    def __init__(self, host: str, port: int, cap: int, protocol_factory: Callable,
                 held: Callable[[], int]) -> None:
        self._acceptor = Acceptor(host, port, BACKLOG, admit=self._admit,
                                  refused=self._refused, failed=self._failed)
        self.port: int = self._acceptor.port
        self.cap = cap
        self._factory = protocol_factory
        self._held = held
        self._handing = 0  # accepted, their transports not made yet
        self._tasks: set[asyncio.Task] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._limiter: log_limit.RateLimit | None = None
        self._closed = False

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._limiter = log_limit.limit(log, level=logging.WARNING)
        self._acceptor.start()

    def close(self) -> None:
        """No new connections; those accepted stay the server's to close."""
        if self._closed:
            return
        self._closed = True
        self._acceptor.close()
        if self._limiter is not None:
            log_limit.remove(log, self._limiter)

    # -- accepting ---------------------------------------------------------------------------
    def _admit(self, sock: socket.socket) -> None:
        open_now = self._held() + self._handing
        if open_now >= self.cap:
            sock.close()
            log.warning("closed new remoting connections at once: %d connections are "
                        "open, the most this server takes (server.remoting_max_"
                        "connections, or fewer as the descriptor limit leaves room)",
                        open_now)
            return
        self._hand_over(sock)

    @staticmethod
    def _refused(exc: OSError) -> None:
        log.warning("refused remoting connections: out of file descriptors (%s)",
                    os.strerror(exc.errno))

    @staticmethod
    def _failed(exc: OSError) -> None:
        log.warning("accepting remoting connections failed: %s; accepting again in %.1f s",
                    exc, ACCEPT_PAUSE_S)

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


__all__ = ["Listener", "ACCEPT_PAUSE_S", "BACKLOG"]

"""The HTTP/1.1 server behind ``mqstore serve``'s endpoints, on asyncio, bounded in everything
a client can hold: connections, time, bytes and file descriptors.

h11 parses and frames; this module owns the sockets and the limits (``Limits``, from the
``server`` section):

- connections: at most ``max_connections``. One more takes the place of the connection that
  has waited longest for a request (idle, or sending one); when every connection has a
  request being answered, the new one is closed at once.
- time: a connection with no request under way is closed after ``idle_timeout_ms``; once the
  first byte of a request is in, the whole request has ``request_timeout_ms`` to arrive (a
  client trickling a byte at a time gains nothing by it), and the response as long again to
  be taken.
- bytes: the request line and headers together at most ``max_header_bytes`` (answered 431);
  the endpoints take no request body (413).
- file descriptors: the last ``fd_headroom(limit)`` descriptors under the process's
  RLIMIT_NOFILE are the store's (segments, queues, index files): a connection accepted onto
  one of them is closed at once. When accept itself fails for want of descriptors, the
  pending connection is taken off the queue and closed (``mqstore.accepting``). Either way
  the listening socket never stays readable with nothing taken off it (that is a busy loop).
  Refusals are logged at most once per REFUSAL_LOG_INTERVAL_S, with their count.

The application is WSGI (prometheus_client's metrics app is one), called through
``wsgi_call`` on a pool of APP_THREADS threads so that the event loop never waits on the
store: the loop stays free for the other asyncio servers of the process to share.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import h11

from mqstore.accepting import ACCEPT_PAUSE_S, Acceptor
from mqstore.ops.wsgi_call import call_wsgi, wsgi_environ

log = logging.getLogger(__name__)
APP_THREADS = 4  # requests answered at once; the rest wait their turn, connections held
REFUSAL_LOG_INTERVAL_S = 10.0
FD_HEADROOM = 64  # descriptors under RLIMIT_NOFILE that connections never take (see fd_headroom)
READ_BYTES = 16384
LINGER_S = 1.0  # after a final response, unread request bytes are drained this long (no RST)
LINGER_BYTES = 65536
CLOSE_GRACE_S = 5.0  # requests being answered when the server closes get this long
BACKLOG = 128


@dataclass(frozen=True)
class Limits:
    max_connections: int
    idle_timeout_s: float
    request_timeout_s: float
    max_header_bytes: int

    @classmethod
    def of(cls, server) -> "Limits":
        """From the configuration's ``server`` section."""
        return cls(server.max_connections, server.idle_timeout_ms / 1000.0,
                   server.request_timeout_ms / 1000.0, server.max_header_bytes)


def fd_headroom(limit: int) -> int:
    """Descriptors kept for the store under a limit of ``limit``: FD_HEADROOM, or a quarter of a
    small limit."""
    return min(FD_HEADROOM, limit // 4)


def descriptor_ceiling() -> int | None:
    """The lowest descriptor number a connection may not take, or None without a limit."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        return None
    return soft - fd_headroom(soft)


class _Tally:
    """Connections refused for one reason: the first is logged at once, then at most one line
    per REFUSAL_LOG_INTERVAL_S with the count since the last."""

    def __init__(self, loop: asyncio.AbstractEventLoop, reason: str) -> None:
        self._loop = loop
        self.reason = reason
        self.count = 0
        self._timer: asyncio.TimerHandle | None = None

    def add(self) -> None:
        self.count += 1
        if self._timer is None:
            self._report(first=True)

    def _report(self, first: bool = False) -> None:
        if not self.count:
            self._timer = None
            return
        self._log(first)
        self._timer = self._loop.call_later(REFUSAL_LOG_INTERVAL_S, self._report)

    def _log(self, first: bool) -> None:
        log.warning("%s: %d connection(s) closed at once%s", self.reason, self.count,
                    "" if first else f" in the last {REFUSAL_LOG_INTERVAL_S:.0f} s")
        self.count = 0

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            if self.count:  # what the interval under way refused
                self._log(first=False)


class _Conn:
    __slots__ = ("sock", "transport", "since", "busy", "closed", "opening")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.transport: asyncio.Transport | None = None
        self.since = time.monotonic()  # waiting for a request since
        self.busy = False  # a request of it is being answered
        self.closed = False
        self.opening = False  # its transport is being made

    def abort(self) -> None:
        """Close now (the descriptor is free within a turn or two of the loop)."""
        self.closed = True
        if self.transport is not None:
            self.transport.abort()
        elif not self.opening:
            self.sock.close()
        # else the transport being made holds the socket, registered with the loop: closing
        # it under the transport could hand its number to a new socket while still
        # registered; ``_serve`` aborts the transport as soon as it has it.


class HttpServer:
    """``app`` (WSGI) on ``host:port`` within ``limits``. Bound by the constructor (so a port
    in use fails there); ``start`` and ``close`` run on the event loop."""

    def __init__(self, app, host: str, port: int, limits: Limits) -> None:
        self.app = app
        self.host = host
        self.limits = limits
        self._acceptor = Acceptor(host, port, BACKLOG, admit=self._admit,
                                  refused=self._refused, failed=self._failed)
        self.port: int = self._acceptor.port
        self.fd_ceiling = descriptor_ceiling()
        self._conns: set[_Conn] = set()
        self._tasks: set[asyncio.Task] = set()
        self._pool = ThreadPoolExecutor(APP_THREADS, thread_name_prefix="mqstore-http")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False

    # -- life --------------------------------------------------------------------------------
    async def start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
        self.out_of_fds = _Tally(loop, f"out of file descriptors (RLIMIT_NOFILE {limit}, the "
                                       f"last {fd_headroom(limit)} kept for the store)")
        self.all_busy = _Tally(loop, "")
        self.evicted = _Tally(loop, "")
        self.set_limits(self.limits)
        self._acceptor.start()

    def set_limits(self, limits: Limits) -> None:
        """New bounds, for the connections and requests from now on (serve's SIGHUP). On the
        loop's thread."""
        self.limits = limits
        self.all_busy.reason = (f"server.max_connections ({limits.max_connections}) reached "
                                f"with every connection answering a request")
        self.evicted.reason = (f"server.max_connections ({limits.max_connections}) reached: "
                               f"the connection waiting longest made room")

    async def close(self) -> None:
        """Stop accepting; requests being answered get CLOSE_GRACE_S, other connections
        close at once."""
        if self._closing:
            return
        self._closing = True
        self._acceptor.close()
        for conn in [c for c in self._conns if not c.busy]:
            self._drop(conn)
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CLOSE_GRACE_S)
        for conn in list(self._conns):
            self._drop(conn)
        for task in list(self._tasks):
            task.cancel()
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=CLOSE_GRACE_S)
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._loop is not None:
            for tally in (self.out_of_fds, self.all_busy, self.evicted):
                tally.close()

    # -- accepting ---------------------------------------------------------------------------
    def _admit(self, sock: socket.socket) -> None:
        if self.fd_ceiling is not None and sock.fileno() >= self.fd_ceiling:
            sock.close()
            self.out_of_fds.add()
            return
        if len(self._conns) >= self.limits.max_connections:
            waiting = [c for c in self._conns if not c.busy]
            if not waiting:
                sock.close()
                self.all_busy.add()
                return
            self._drop(min(waiting, key=lambda c: c.since))
            self.evicted.add()
        conn = _Conn(sock)
        self._conns.add(conn)
        task = self._loop.create_task(self._serve(conn))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _refused(self, exc: OSError) -> None:
        self.out_of_fds.add()

    @staticmethod
    def _failed(exc: OSError) -> None:
        log.debug("accept failed: %s; accepting again in %.1f s", exc, ACCEPT_PAUSE_S)

    def _drop(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        conn.abort()

    # -- one connection ----------------------------------------------------------------------
    async def _serve(self, conn: _Conn) -> None:
        try:
            if conn.closed:
                return
            conn.opening = True
            try:
                reader, writer = await asyncio.open_connection(sock=conn.sock, limit=READ_BYTES)
            finally:
                conn.opening = False
            conn.transport = writer.transport
            if conn.closed:  # dropped while the transport was made
                return
            writer.transport.set_write_buffer_limits(high=0)  # drain waits for every byte
            await self._exchange(conn, reader, writer)
        except (OSError, TimeoutError, h11.ProtocolError) as exc:
            log.debug("connection ended: %r", exc)
        finally:
            self._drop(conn)

    async def _exchange(self, conn: _Conn, reader, writer) -> None:
        """Requests and responses until the client or a limit ends the connection."""
        h = h11.Connection(h11.SERVER, max_incomplete_event_size=self.limits.max_header_bytes)
        peer = writer.get_extra_info("peername")
        while True:
            try:
                request = await self._receive(h, reader)
            except h11.RemoteProtocolError as exc:
                status = exc.error_status_hint
                await self._send(h, writer, status, _REASONS.get(status, ""), _CLOSE,
                                 f"{exc}\n".encode())
                await _linger(reader)
                return
            if request is None:
                return
            if _has_body(request):
                await self._send(h, writer, 413, "Content Too Large", _CLOSE,
                                 b"these endpoints take no request body\n")
                await _linger(reader)
                return
            conn.busy = True
            status, reason, headers, body = await self._loop.run_in_executor(
                self._pool, self._call, request, peer)
            await self._send(h, writer, status, reason, headers, body,
                             head=request.method == b"HEAD")
            conn.busy = False
            if h.our_state is not h11.DONE or h.their_state is not h11.DONE:
                await _linger(reader)
                return
            h.start_next_cycle()
            conn.since = time.monotonic()

    async def _receive(self, h: h11.Connection, reader) -> h11.Request | None:
        """The next whole request (or its head, when it announces a body), or None when the
        connection is to end: the client closed it, or a time limit passed."""
        loop, limits = self._loop, self.limits
        fed = len(h.trailing_data[0])  # pipelined bytes of it came with the last request
        begun = fed > 0
        deadline = loop.time() + (limits.request_timeout_s if begun else limits.idle_timeout_s)
        request = None
        while True:
            event = h.next_event()
            if event is h11.NEED_DATA:
                # h11 measures only a head still incomplete after a read: reading no more
                # than the limit (then one byte) makes any longer head one (431).
                want = min(READ_BYTES, max(1, limits.max_header_bytes - fed))
                try:
                    async with asyncio.timeout_at(deadline):
                        data = await reader.read(want)
                except TimeoutError:
                    log.debug("closing a connection: %s", "request not complete in time"
                              if begun else "idle")
                    return None
                if data and not begun:
                    begun = True
                    deadline = loop.time() + limits.request_timeout_s
                fed += len(data)
                h.receive_data(data)
            elif isinstance(event, h11.Request):
                if _has_body(event):
                    return event
                request = event
            elif isinstance(event, h11.EndOfMessage):
                return request
            else:  # ConnectionClosed (PAUSED cannot come: a cycle ends before the next read)
                return None

    async def _send(self, h: h11.Connection, writer, status: int, reason: str, headers,
                    body: bytes, head: bool = False) -> None:
        headers = [*headers, ("Content-Length", str(len(body)))]
        data = h.send(h11.Response(status_code=status, reason=reason, headers=headers))
        if body and not head:
            data += h.send(h11.Data(data=body))
        data += h.send(h11.EndOfMessage())
        writer.write(data)
        async with asyncio.timeout(self.limits.request_timeout_s):
            await writer.drain()

    def _call(self, request: h11.Request, peer) -> tuple[int, str, list, bytes]:
        return call_wsgi(self.app, wsgi_environ(request, self.host, self.port, peer))


_CLOSE = [("Content-Type", "text/plain"), ("Connection", "close")]
_REASONS = {400: "Bad Request", 431: "Request Header Fields Too Large"}


def _has_body(request: h11.Request) -> bool:
    for name, value in request.headers:
        if name == b"transfer-encoding" or (name == b"content-length" and value != b"0"):
            return True
    return False


async def _linger(reader) -> None:
    """Read what the client still sends for a moment before closing: a socket closed with
    unread bytes answers with a reset, which can destroy the response just sent."""
    got = 0
    try:
        async with asyncio.timeout(LINGER_S):
            while got < LINGER_BYTES:
                data = await reader.read(READ_BYTES)
                if not data:
                    return
                got += len(data)
    except (TimeoutError, OSError):
        pass

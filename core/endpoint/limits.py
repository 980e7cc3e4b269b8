"""Bounds on what a peer controls, so no client can make the endpoint hold unbounded state.

    request size        grpc.max_receive_message_length = server.grpc_max_request_bytes
    streams per conn    grpc.max_concurrent_streams = server.grpc_max_concurrent_streams
    RPCs in flight      the server's maximum_concurrent_rpcs = server.grpc_max_concurrent_rpcs
                        (past it gRPC answers RESOURCE_EXHAUSTED)
    connections         grpc.max_allowed_incoming_connections = ``connection_cap``: at most
                        server.grpc_max_connections TCP connections, fewer when the descriptor
                        limit leaves less room beside the store's own descriptors (past it
                        gRPC closes a new connection at once); ``Peers`` counts them by peer
                        address, refusing an RPC from one past the cap with TOO_MANY_REQUESTS
    idle connections    grpc.max_connection_idle_ms = server.grpc_client_idle_ms; keepalive
                        pings find peers that vanished (a dead client's telemetry stream
                        would otherwise stay open)
    idle clients        ``settings.Sessions`` forgets client ids not heard from for as long
    what receives hold  ``backlog.Backlog``: NOTE [ Unwritten bytes ]
    what peers create   ``creations.Creations``: topics and groups per client host
    its log             warnings and errors a peer can cause (a malformed request, a call it
                        cancelled) are rate-limited: one line per kind a minute, with the
                        count of those suppressed (``mqstore.log_limit``; ``LIMITED_LOGGERS``)
    the admin service   open only on loopback (``check_exposure``)

gRPC accepts a TCP connection before a byte of HTTP/2 arrives, and each holds a descriptor, so
its own cap (``connection_cap``) is what keeps strangers that only connect from taking the
descriptors the store needs. ``Peers`` counts peer addresses (one per TCP connection) from
their first RPC until they have none in flight and were idle for the idle time, when gRPC has
closed the connection; an RPC from a new peer past the cap is refused with TOO_MANY_REQUESTS
before it does any work.
"""

from __future__ import annotations

import time

import ctypes
import ipaddress
import logging

from mqstore import log_limit
from mqstore.config import descriptors, parse_listen
from mqstore.config.descriptors import reserved_descriptors  # noqa: F401 - gRPC's callers'
from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError
from mqstore.errors import ConfigError

KEEPALIVE_TIME_MS = 60_000  # ping a connection silent this long
KEEPALIVE_TIMEOUT_MS = 20_000  # and close it when the ping is not answered in this time
MAX_METADATA_BYTES = 16 * 1024  # request headers (the clients send about 400 bytes)
# gRPC's own logger (a traceback per malformed request, per call cancelled mid-write) and ours.
LIMITED_LOGGERS = ("grpc._cython.cygrpc", "grpc.aio._server", "mqstore.endpoint")


M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
BIG_BUFFER_BYTES = 1 << 20


def return_big_buffers() -> bool:
    """Have glibc give every allocation of BIG_BUFFER_BYTES or more memory of its own, returned
    to the system when freed (NOTE [ Unwritten bytes ]: what a receive held goes when its
    stream is done). Left alone, glibc raises that threshold to the size of the first such
    buffer freed and keeps later ones in its heap, so the process's RSS stays at the highest
    it ever held. False where there is no glibc."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, BIG_BUFFER_BYTES))


class LogLimits:
    """Rate-limit the warnings and errors of ``LIMITED_LOGGERS`` (``mqstore.log_limit``) until
    ``remove``."""

    def __init__(self) -> None:
        self._limited = [(logger, log_limit.limit(logger, level=logging.WARNING))
                         for logger in map(logging.getLogger, LIMITED_LOGGERS)]

    def remove(self) -> None:
        for logger, limiter in self._limited:
            log_limit.remove(logger, limiter)


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:  # a name: it may resolve to anything
        return False


def check_exposure(server, admin_served: bool) -> None:
    """ConfigError when the admin service would be open to anyone who reaches a port that
    listens beyond loopback: it creates and changes topics, resets offsets, deletes groups."""
    if not admin_served or not server.grpc_admin_enabled or server.grpc_admin_keys:
        return
    host, _port = parse_listen(server.grpc_listen)
    if is_loopback(host):
        return
    raise ConfigError(
        f"server.grpc_listen {server.grpc_listen!r} listens beyond loopback, and the admin "
        f"service (mqstore.admin.v1.Admin: `mqstore topic|group --server`, which creates and "
        f"updates topics, resets offsets and deletes groups) would answer anyone who reaches "
        f"it: set server.grpc_admin_keys (['ADMIN_KEY:SECRET_KEY'], then `mqstore topic ... "
        f"--server HOST:PORT --admin-access-key ADMIN_KEY` with MQSTORE_ADMIN_SECRET_KEY), or "
        f"turn the admin service off with server.grpc_admin_enabled: false")


def server_options(server, max_connections: int) -> list[tuple[str, int]]:
    """gRPC channel arguments of the endpoint from the ``server`` config section; at most
    ``max_connections`` connections (``connection_cap``)."""
    return [
        ("grpc.max_receive_message_length", server.grpc_max_request_bytes),
        ("grpc.max_send_message_length", -1),  # what we send is bounded by what was stored
        ("grpc.max_concurrent_streams", server.grpc_max_concurrent_streams),
        ("grpc.max_allowed_incoming_connections", max_connections),
        ("grpc.max_connection_idle_ms", server.grpc_client_idle_ms),
        ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.max_metadata_size", MAX_METADATA_BYTES),
        # Without this a second server could bind the same port and split the clients.
        ("grpc.so_reuseport", 0),
    ]


def other_listeners(config) -> int:
    """Connections the remoting server may hold beside gRPC's (0 when it does not listen)."""
    server = config.server
    return server.remoting_max_connections if server.remoting_listen else 0


def connection_cap(configured: int, reserved: int, others: int = 0, limit: int | None = None,
                   open_now: int | None = None) -> int:
    """The TCP connections gRPC may hold: ``configured`` (server.grpc_max_connections), or its
    share beside the remoting server's ``others`` connections of the room the descriptor
    limit leaves (``descriptors.connection_cap``, NOTE [ Listener descriptors ])."""
    return descriptors.connection_cap(
        "the gRPC endpoint", "server.grpc_max_connections", configured, reserved,
        {"the remoting server": others} if others else None, limit, open_now)


class Peers:
    """Connections by peer address. Only the event loop's thread calls it."""

    def __init__(self, max_connections: int, idle_ms: int, clock=time.monotonic) -> None:
        self.max_connections = max_connections
        self._idle_s = idle_ms / 1000.0
        self._clock = clock
        self._peers: dict[str, list] = {}  # peer -> [RPCs in flight, last seen]

    def enter(self, peer: str) -> None:
        entry = self._peers.get(peer)
        if entry is None:
            if len(self._peers) >= self.max_connections:
                self._forget_idle()
                if len(self._peers) >= self.max_connections:
                    raise EndpointError(Code.TOO_MANY_REQUESTS, (
                        f"{len(self._peers)} connections are open, the most this endpoint "
                        f"takes (server.grpc_max_connections); try again later"))
            entry = self._peers[peer] = [0, 0.0]
        entry[0] += 1
        entry[1] = self._clock()

    def leave(self, peer: str) -> None:
        entry = self._peers.get(peer)
        if entry is not None:
            entry[0] -= 1
            entry[1] = self._clock()

    def _forget_idle(self) -> None:
        before = self._clock() - self._idle_s
        for peer in [p for p, (busy, seen) in self._peers.items() if not busy and seen < before]:
            del self._peers[peer]

    def __len__(self) -> int:
        return len(self._peers)


__all__ = ["Peers", "server_options", "check_exposure", "is_loopback", "return_big_buffers",
           "LogLimits", "LIMITED_LOGGERS"]

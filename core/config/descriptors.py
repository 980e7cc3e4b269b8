"""How ``mqstore serve``'s listeners share the file descriptors RLIMIT_NOFILE leaves beside the
store's own.

NOTE [ Listener descriptors ]
A listener's TCP connection holds a descriptor from the moment it is accepted, before its peer
sent a byte, so strangers that only connect could take every descriptor the process may open:
then the store can open no file and ``/healthz`` is reset. Each listener that holds
connections beside the HTTP server (the gRPC endpoint, the remoting server) therefore accepts
at most ``connection_cap``: its configured maximum, or, when the limit leaves less room beside
the descriptors open at its start, DESCRIPTOR_HEADROOM and what the store's files and the HTTP
server may take (``reserved_descriptors``) than every listening maximum together wants, its
share of that room in proportion to its maximum (at least one). The shares of the listeners
that listen add up to no more than the room, whichever starts first; past its cap a listener
closes a new connection at once.
"""

from __future__ import annotations

import logging
import os
import resource

DESCRIPTOR_HEADROOM = 64  # descriptors under RLIMIT_NOFILE no listener's connection takes

log = logging.getLogger(__name__)


def reserved_descriptors(config) -> int:
    """Descriptors this process's other parts may open beside the listeners' connections: the
    mapped consume-queue files and the pop states (two each, NOTE [ Mapped budget ]) and the
    HTTP server's connections."""
    return (2 * config.consume_queue.max_mapped_files + 2 * config.consumer.max_open_pop_states
            + config.server.max_connections)


def open_descriptors() -> int:
    """Descriptors this process holds now (0 where /proc does not say)."""
    return len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else 0


def connection_cap(listener: str, key: str, configured: int, reserved: int,
                   others: dict[str, int] | None = None, limit: int | None = None,
                   open_now: int | None = None) -> int:
    """The TCP connections ``listener`` (a name for the log) may hold: ``configured`` (its
    ``key``), or its share of the room the descriptor limit (``limit``, RLIMIT_NOFILE's soft
    one) leaves beside the ``open_now`` descriptors, the ``reserved`` ones and
    DESCRIPTOR_HEADROOM when that room is less than ``configured`` and the ``others``
    listeners' maxima (name -> connections) together (NOTE [ Listener descriptors ]). Logs a
    warning when it is fewer than ``configured``."""
    if limit is None:
        limit = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if limit == resource.RLIM_INFINITY:
        return configured
    if open_now is None:
        open_now = open_descriptors()
    shared = sum((others or {}).values())
    room = limit - DESCRIPTOR_HEADROOM - open_now - reserved
    if room >= configured + shared:
        return configured
    cap = max(1, room * configured // (configured + shared))
    beside = "".join(f" and the share of {name} ({most} connections)"
                     for name, most in (others or {}).items())
    log.warning("%s accepts at most %d connections, not %s (%d): the descriptor limit "
                "(RLIMIT_NOFILE %d) leaves no more beside the %d open, the %d the store's "
                "files and the HTTP server may take%s (raise the limit, e.g. LimitNOFILE= or "
                "ulimit -n)", listener, cap, key, configured, limit, open_now, reserved, beside)
    return cap


__all__ = ["DESCRIPTOR_HEADROOM", "connection_cap", "open_descriptors", "reserved_descriptors"]

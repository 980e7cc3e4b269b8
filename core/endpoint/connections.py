"""Closing one peer's connection from the server side.

gRPC's Python server can neither cancel one call nor close one connection: a stream whose peer
stopped reading stays open, holding what gRPC accepted for it, for as long as the peer keeps
the connection (NOTE [ Unwritten bytes ] in ``backlog``). So the endpoint finds the socket gRPC
accepted from that peer among the process's descriptors (psutil: the process's TCP
connections with their descriptors) and shuts it down: gRPC then sees the connection end,
fails its calls and frees them, as if the peer had gone. The descriptor is duplicated before
it is touched and checked to be that connection still (gRPC may have closed it and reused the
number meanwhile); the duplicate is closed, gRPC's descriptor is left to gRPC.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import socket

import psutil

log = logging.getLogger(__name__)


def _ip(text: str) -> str:
    """An IP address as one spelling: IPv4-mapped IPv6 (a dual-stack socket's view of an IPv4
    peer) as the IPv4 address, a zone dropped."""
    address = ipaddress.ip_address(text.strip("[]").split("%")[0])
    mapped = getattr(address, "ipv4_mapped", None)
    return str(mapped or address)


def _address(peer: str) -> tuple[str, int] | None:
    """gRPC's ``ipv4:1.2.3.4:5`` / ``ipv6:[::1]:5`` as ``(ip, port)``; None otherwise."""
    scheme, _sep, rest = peer.partition(":")
    if scheme not in ("ipv4", "ipv6"):
        return None
    host, _sep, port = rest.rpartition(":")
    try:
        return _ip(host), int(port)
    except ValueError:
        return None


def _same(address: tuple, ip: str, port: int) -> bool:
    try:
        return _ip(address[0]) == ip and address[1] == port
    except (ValueError, IndexError, TypeError):
        return False


def close(peer: str, local_port: int) -> bool:
    """Shut down this process's TCP connection from ``peer`` (gRPC's peer string) to
    ``local_port``; False when there is none (gone already) or it cannot be found here."""
    remote = _address(peer)
    if remote is None:
        return False
    ip, port = remote
    try:
        found = [c.fd for c in psutil.Process().net_connections(kind="tcp")
                 if c.fd >= 0 and c.raddr and c.laddr and c.laddr[1] == local_port
                 and _same(c.raddr, ip, port)]
    except (psutil.Error, OSError) as exc:
        log.warning("cannot list this process's connections to close %s: %s", peer, exc)
        return False
    for fd in found:
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:  # closed since the listing
            continue
        try:
            if sock.getsockname()[1] == local_port and _same(sock.getpeername(), ip, port):
                sock.shutdown(socket.SHUT_RDWR)
                return True
        except OSError:  # not connected any more
            pass
        finally:
            sock.close()  # the duplicate only
    return False


__all__ = ["close"]

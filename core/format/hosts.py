"""Socket addresses as RocketMQ stores them: 4 or 16 address bytes then an int port.

The API speaks ``"host:port"`` strings (``"[::1]:8080"`` for IPv6); on disk a host is
``addr(4|16) + port(int32 BE)``. The family decides the record's v6 sysflag bits.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from typing import NamedTuple


class Host(NamedTuple):
    address: bytes  # 4 bytes (IPv4) or 16 bytes (IPv6), network order
    port: int

    @property
    def is_v6(self) -> bool:
        return len(self.address) == 16

    def __str__(self) -> str:
        ip = ipaddress.ip_address(self.address)
        return f"[{ip}]:{self.port}" if self.is_v6 else f"{ip}:{self.port}"


MAX_PORT = 65535  # TCP and UDP ports are 16-bit


def parse_host(text: str) -> Host:
    """Parse ``"1.2.3.4:5"`` or ``"[::1]:5"``; errors name the value and the rule.

    This checks what users and configuration hand in; hosts read from disk are taken as
    stored (the record decoder builds ``Host(address, port)`` directly), whatever their port.
    """
    if not isinstance(text, str):
        raise ValueError(f"host {text!r} must be a string 'ip:port'")
    return _parse_host(text)


@lru_cache(maxsize=4096)
def _parse_host(text: str) -> Host:
    bracketed = text.startswith("[")
    if bracketed:
        addr, sep, port = text[1:].partition("]:")
    else:
        addr, sep, port = text.rpartition(":")
    try:
        if not sep:
            raise ValueError("missing port")
        ip = ipaddress.ip_address(addr)
        if ip.version == 6 and not bracketed:
            raise ValueError("an IPv6 address needs brackets, or its last group reads as the port")
        if getattr(ip, "scope_id", None):
            raise ValueError(f"scope id {ip.scope_id!r} cannot be stored")
        # int() would also take signs, spaces, underscores and non-ASCII digits
        if not (port.isascii() and port.isdigit()):
            raise ValueError(f"port {port!r} is not a decimal number")
        port_num = int(port)
        if port_num > MAX_PORT:
            raise ValueError(f"port {port_num} is outside 0..{MAX_PORT}, the TCP/UDP port range")
    except ValueError as exc:
        raise ValueError(
            f"host {text!r} is not 'ipv4:port' or '[ipv6]:port' ({exc})"
        ) from None
    return Host(ip.packed, port_num)

"""Values the configuration spells as text: hours, listen addresses, byte amounts, delay
levels; and the bounds several sections share."""

from __future__ import annotations

import ipaddress

GiB = 1 << 30
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
JAVA_INT_MAX = (1 << 31) - 1


def parse_hours(text: str) -> frozenset[int]:
    """RocketMQ's ``deleteWhen``: ``"04"`` or ``"01;04;13"``, local hours 0-23."""
    hours = set()
    for token in text.split(";"):
        token = token.strip()
        # isdigit alone admits digits like '²' that int() then refuses.
        if not (token.isascii() and token.isdigit()) or not 0 <= int(token) <= 23:
            raise ValueError(f"hour {token!r} in {text!r} must be 0-23 (hours separated by ';')")
        hours.add(int(token))
    return frozenset(hours)


def parse_listen(text: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[ipv6]:port"`` -> ``(host, port)``; port 0 picks a free one."""
    bracketed = text.startswith("[")
    host, sep, port = (text[1:].partition("]:") if bracketed else text.rpartition(":"))
    if not sep or not host or (":" in host and not bracketed):
        raise ValueError(f"listen address {text!r} must be 'host:port' or '[ipv6]:port'")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"listen address {text!r}: port {port!r} must be 0..65535")
    return host, int(port)


def is_loopback_host(host: str) -> bool:
    """Whether a listen host reaches this machine only (``127.0.0.0/8``, ``::1``,
    ``localhost``); a host name other than ``localhost`` is not resolved, so it is not."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


_BYTE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"20GiB"``, ``"500 MB"``, ``"4096B"`` -> bytes (> 0)."""
    number = text.rstrip("BKMGTi ")
    unit = text[len(number):].strip()
    if (not (number.isascii() and number.isdigit()) or unit not in _BYTE_UNITS
            or int(number) <= 0):
        raise ValueError(f"byte amount {text!r} must be a whole number > 0 followed by one of "
                         f"{', '.join(_BYTE_UNITS)} (e.g. '20GiB')")
    return int(number) * _BYTE_UNITS[unit]


def describe_watermark(value: int | str) -> str:
    """``90`` -> ``"over 90% used"``, ``"20GiB"`` -> ``"under 20GiB free"``."""
    return f"over {value}% used" if isinstance(value, int) else f"under {value} free"


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 1m"`` -> ``[1000, 5000, 60000]`` (levels 1..n)."""
    levels = []
    for token in text.split():
        unit = _DELAY_UNITS_MS.get(token[-1:])
        digits = token[:-1]
        if unit is None or not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"delay level {token!r} must be digits followed by s, m, h or d")
        levels.append(int(token[:-1]) * unit)
    if not levels:
        raise ValueError("message_delay_levels must list at least one level")
    return levels

"""Message properties string: ``name \\x01 value \\x02`` repeated, UTF-8 on disk.

Decoding follows RocketMQ's ``string2messageProperties`` exactly: the text is split on ``\\x02``;
a segment is kept only when it is at least 3 characters long and its first ``\\x01`` has at least
one character before it and one after it. The value is everything after the first ``\\x01`` (so
it may hold more ``\\x01``). Anything else is dropped silently; a last segment without a trailing
``\\x02`` still counts. Later duplicates win, as in a Java ``HashMap``.
"""

from __future__ import annotations

from typing import Mapping

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
TRANSIENT_PREFIX = "__RMQ.TRANSIENT."
MAX_PROPERTIES_BYTES = 32767  # the length field is a signed short

PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_INNER_NUM = "INNER_NUM"
KEY_SEPARATOR = " "


def check_property(name: object, value: object) -> None:
    """Reject what RocketMQ's client rejects, plus anything that would corrupt the encoding."""
    if not isinstance(name, str) or not name:
        raise ValueError(f"property name {name!r} must be a non-empty string")
    if not isinstance(value, str) or not value:
        raise ValueError(f"property {name!r} value {value!r} must be a non-empty string")
    for text, what in ((name, "name"), (value, "value")):
        if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
            raise ValueError(
                f"property {what} {text!r} contains a reserved separator (\\x01 or \\x02)"
            )


def encode_properties(properties: Mapping[str, str]) -> str:
    """Encode a checked mapping; transient names are never stored."""
    return "".join(
        f"{name}\x01{value}\x02"
        for name, value in properties.items()
        if not name.startswith(TRANSIENT_PREFIX)
    )


def decode_properties(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        cut = segment.find(NAME_VALUE_SEPARATOR)
        if len(segment) >= 3 and 0 < cut < len(segment) - 1:
            out[segment[:cut]] = segment[cut + 1 :]
    return out


def find_property(raw: bytes, name: bytes) -> bytes | None:
    """Value of ``name`` in encoded properties without decoding the rest (dispatch hot path).

    Gives the same answer as ``decode_properties(raw.decode()).get(name)``: the last segment
    whose key is exactly ``name`` and whose value is non-empty.
    """
    probe = name + b"\x01"
    found = None
    start = 0
    while True:
        at = raw.find(probe, start)
        if at < 0:
            return found
        if at == 0 or raw[at - 1] == 2:
            begin = at + len(probe)
            end = raw.find(b"\x02", begin)
            if end < 0:
                end = len(raw)
            if end > begin:
                found = raw[begin:end]
        start = at + 1

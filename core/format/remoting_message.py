"""Messages inside remoting bodies: a SEND_BATCH_MESSAGE body (``MessageDecoder.
encodeMessages``) and the offset message id a broker answers with.

A batch body is its items one after another (big-endian)::

    +--------------+--------------+-------------+-----------+----------------+------+
    | total (4)    | magic (4)    | body crc(4) | flag (4)  | body length(4) | body |
    +--------------+--------------+-------------+-----------+----------------+------+
    | properties length (2) | properties (name\\x01value\\x02...)                   |
    +-----------------------+--------------------------------------------------------+
      total = 20 + body length + 2 + properties length; the client leaves magic and CRC 0
"""

from __future__ import annotations

import struct
from typing import NamedTuple

_ITEM = struct.Struct(">iiiii")
_SHORT = struct.Struct(">h")
ITEM_FIXED_BYTES = _ITEM.size + _SHORT.size  # 22


class BatchItem(NamedTuple):
    flag: int
    body: bytes
    properties: str


def decode_batch(body: bytes, max_items: int) -> list[BatchItem]:
    """The items of a batch body; ValueError naming the item and what is wrong."""
    items = []
    at, end = 0, len(body)
    while at < end:
        if len(items) >= max_items:
            raise ValueError(f"batch holds more than {max_items} messages")
        if end - at < ITEM_FIXED_BYTES:
            raise ValueError(f"batch item {len(items)} at byte {at} is cut short "
                             f"({end - at} bytes left, an item takes at least "
                             f"{ITEM_FIXED_BYTES})")
        total, _magic, _crc, flag, body_len = _ITEM.unpack_from(body, at)
        if body_len < 0 or at + _ITEM.size + body_len + 2 > end:
            raise ValueError(f"batch item {len(items)}: body length {body_len} runs past the "
                             f"batch's {end} bytes")
        data = body[at + _ITEM.size:at + _ITEM.size + body_len]
        p_at = at + _ITEM.size + body_len
        (props_len,) = _SHORT.unpack_from(body, p_at)
        if props_len < 0 or p_at + 2 + props_len > end:
            raise ValueError(f"batch item {len(items)}: properties length {props_len} runs "
                             f"past the batch's {end} bytes")
        if total != ITEM_FIXED_BYTES + body_len + props_len:
            raise ValueError(f"batch item {len(items)}: total size {total} is not "
                             f"{ITEM_FIXED_BYTES} + body {body_len} + properties {props_len}")
        try:
            props = body[p_at + 2:p_at + 2 + props_len].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"batch item {len(items)}: properties are not UTF-8") from None
        items.append(BatchItem(flag, data, props))
        at = p_at + 2 + props_len
    return items


def encode_batch(items: list[BatchItem]) -> bytes:
    """A batch body, as a client encodes it."""
    out = []
    for flag, data, props in items:
        p = props.encode("utf-8")
        out.append(_ITEM.pack(ITEM_FIXED_BYTES + len(data) + len(p), 0, 0, flag, len(data))
                   + data + _SHORT.pack(len(p)) + p)
    return b"".join(out)


__all__ = ["BatchItem", "decode_batch", "encode_batch", "ITEM_FIXED_BYTES"]

"""RocketMQ 5's whole-record CRC: the ``__CRC32#`` property (``enabledAppendPropCRC``).

The body CRC in the header covers the body only: a flipped bit in a timestamp, a host, the
flag or a property would be served as a sound message. With this property a record ends with
``__CRC32#`` ``\\x01``, ten ASCII digits and ``\\x02`` (20 bytes, reserved when the properties
are encoded), the digits being the CRC-32 (sign bit dropped) of every byte before those 20,
least significant digit first and padded with zeros on the right. It is filled in once the
offsets and the store time are known, so it covers the whole header.

A record is taken to carry the property only when it is the last one and whole: the 20 bytes
are preceded by a property separator or begin the properties. A user property merely named
like it cannot be mistaken for it, because the store drops a message's own ``__CRC32#``
before encoding (as RocketMQ does).
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from mqstore.hashing import zlib_crc32

PROPERTY_CRC32 = "__CRC32#"
MARK = b"__CRC32#\x01"
RESERVED = len(MARK) + 10 + 1  # RocketMQ's CRC32_RESERVED_LEN: 20
PLACEHOLDER = MARK + b"0" * 10 + b"\x02"
_POWERS = 10 ** np.arange(10, dtype=np.int64)
_TEN = np.arange(10, dtype=np.int64)
_SEP = 2
ABSENT, CARRIED, DAMAGED = 0, 1, 2
# The property's fixed bytes with the separator before it: a near match is damage.
_FRAME = b"\x02" + MARK + b"\x02"
MAX_FLIPPED_BITS = 2
_FRAME_ARRAY = np.frombuffer(_FRAME, dtype=np.uint8)
_MARK_VOID = np.frombuffer(MARK, dtype=np.dtype((np.void, len(MARK))))[0]
# Up to two damaged bytes leave a third of the name intact.
THIRDS = (MARK[:3], MARK[3:6], MARK[6:])
_FRAME_AT = np.array([-1, *range(len(MARK)), RESERVED - 1], dtype=np.int64)


def reserve(block: bytes) -> bytes:
    """An encoded properties block with the 20 bytes the record's CRC will fill."""
    if block and not block.endswith(b"\x02"):
        block += b"\x02"
    return block + PLACEHOLDER


def digits(crc: int) -> bytes:
    """The ten digits RocketMQ writes for ``crc``: least significant first, 0-padded right."""
    return str(crc)[::-1].ljust(10, "0").encode("ascii")


def state(raw, props_at: int, end: int) -> int:
    """Whether the record whose properties lie at ``raw[props_at:end]`` ends with the
    property (CARRIED; its digits unchecked), does not (ABSENT), or nearly does (DAMAGED): a
    bit or two flipped in the property's name or separators would otherwise pass for a record
    without one, served with a garbled property."""
    at = end - RESERVED
    if at < props_at:
        return ABSENT
    # Up to two damaged bytes leave a third of the name intact: the cheap test for the common
    # case, records without the property.
    first, second, third = THIRDS
    if raw[at:at + 3] != first and raw[at + 3:at + 6] != second and \
            raw[at + 6:at + 9] != third:
        return ABSENT
    head = raw[at:at + len(MARK)]
    if head == MARK and raw[end - 1] == _SEP and (at == props_at or raw[at - 1] == _SEP):
        return CARRIED
    before = raw[at - 1] if at > props_at else _SEP
    got = bytes((before, *head, raw[end - 1]))
    return DAMAGED if _bit_distance(got, _FRAME) <= MAX_FLIPPED_BITS else ABSENT


@lru_cache(maxsize=4096)  # a store sees a handful of property names, again and again
def near_name(name: str) -> bool:
    """Whether a property name other than ``__CRC32#`` is within a flipped bit or two of it:
    as a record's last property it would read as a damaged CRC property."""
    raw = name.encode("utf-8", "replace")
    return (len(raw) == len(PROPERTY_CRC32) and raw != MARK[:-1]
            and _bit_distance(raw, MARK[:-1]) <= MAX_FLIPPED_BITS)


def _bit_distance(a: bytes, b: bytes) -> int:
    return (int.from_bytes(a, "big") ^ int.from_bytes(b, "big")).bit_count()


def intact(raw, start: int, end: int) -> bool:
    """Whether the record ``raw[start:end]``, known to carry the property, matches it."""
    text = bytes(raw[end - 11:end - 1])
    if not text.isdigit():
        return False
    return zlib_crc32(raw[start:end - RESERVED]) & 0x7FFFFFFF == int(text[::-1])


def stamp(tail: bytes, crc: int) -> bytes:
    """``tail`` (ending with the reserved bytes) with the digits of ``crc`` filled in."""
    return b"".join((tail[:-11], digits(crc), b"\x02"))


def stamp_records(buf: np.ndarray, sizes: np.ndarray) -> None:
    """Fill in the CRC of each record of ``buf`` (uint8, writable; records back to back from
    0, ``sizes`` long, each ending with the reserved bytes)."""
    n = len(sizes)
    ends = np.cumsum(sizes, dtype=np.int64)
    width = int(sizes[0]) if n else 0
    if n > 1 and (sizes == width).all():
        # Records of one size: their covered bytes as one strided array of void items, whose
        # tolist() and the CRC's map run as C loops (no Python frame per record).
        covered = np.ndarray((n,), dtype=np.dtype((np.void, width - RESERVED)), buffer=buf,
                             strides=(width,))
        crcs = np.fromiter(map(zlib_crc32, covered.tolist()), dtype=np.int64, count=n)
    else:
        mv = memoryview(buf)
        try:
            spans = zip((ends - sizes).tolist(), (ends - RESERVED).tolist())
            crcs = np.fromiter((zlib_crc32(mv[s:e]) for s, e in spans), dtype=np.int64, count=n)
        finally:
            mv.release()
    crcs &= 0x7FFFFFFF
    buf[(ends - 11)[:, None] + _TEN] = (crcs[:, None] // _POWERS) % 10 + 48


def rows_carrying(data: np.ndarray, ends: np.ndarray, props_at: np.ndarray
                  ) -> np.ndarray | None:
    """``state`` for many records of ``data`` at once: a bool per record; None when any
    nearly carries the property (``state`` then says which)."""
    at = ends - RESERVED
    room = at >= props_at
    if not room.any():
        return room
    safe = np.where(room, at, 1)
    before = np.where(safe > props_at, data[safe - 1], _SEP)  # none before: as a separator
    after = data[ends - 1]
    mark = _runs(data, len(MARK))[safe]
    exact = room & (mark == _MARK_VOID) & (before == _SEP) & (after == _SEP)
    near = room & ~exact
    if near.any():
        # Up to MAX_FLIPPED_BITS damaged bytes leave one of three bytes of the name intact:
        # a cheap test before counting bits (most records without the property fail it).
        near &= ((data[safe + 2] == MARK[2]) | (data[safe + 5] == MARK[5])
                 | (data[safe + 7] == MARK[7]))
        if near.any():
            rows = np.flatnonzero(near)
            got = data[safe[rows, None] + _FRAME_AT]
            got[:, 0] = before[rows]
            flipped = np.unpackbits(got ^ _FRAME_ARRAY, axis=1).sum(axis=1)
            if (flipped <= MAX_FLIPPED_BITS).any():
                return None
    return exact


def _runs(data: np.ndarray, width: int) -> np.ndarray:
    """Every ``width``-byte run of ``data`` (uint8, contiguous) as one void item per byte
    offset: picking items copies each run with one memcpy, not byte by byte."""
    return np.ndarray(shape=(max(len(data) - width + 1, 0),),
                      dtype=np.dtype((np.void, width)), buffer=data, strides=(1,))


def rows_stored(data: np.ndarray, ends: np.ndarray) -> np.ndarray | None:
    """The CRC each record ending at ``ends`` (each carrying the property) stores; None when
    any digit is not one."""
    got = _runs(data, 10)[ends - 11].view(np.uint8).reshape(-1, 10).astype(np.int64) - 48
    if ((got < 0) | (got > 9)).any():
        return None
    return got @ _POWERS

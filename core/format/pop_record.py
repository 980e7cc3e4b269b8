"""Pop journal: the bytes of ``consumer/pop/<topic>@<group>.journal`` (mqstore's own format).

A journal is a file header, then records appended whole, one per pop, batch of acks or change
of invisible time. Little-endian throughout.

File header:

    +---------------+-------------+----------------+-------------+----------+
    | magic "MQPJ"  | version u32 | generation u64 | crc32 u32   | zero (4) |
    +---------------+-------------+----------------+-------------+----------+
    total = 4 + 4 + 8 + 4 + 4 = 24 bytes; the crc covers the 16 bytes before it

Record, a header then ``count`` entries:

    +-----------+-----------+------------+--------------+-----------+
    | magic u32 | count u32 | rotate u32 | delivery u64 | crc32 u32 |
    +-----------+-----------+------------+--------------+-----------+
    total = 4 + 4 + 4 + 8 + 4 = 24 bytes, then count x 40; crc32 of bytes 0..19 and the entries

Entry:

    +----------+-----------+------------+----------------+--------------+-------------+----------+
    | kind i32 | queue i32 | offset i64 | visible_at i64 | delivery i64 | attempt i32 | zero (4) |
    +----------+-----------+------------+----------------+--------------+-------------+----------+
    total = 4 + 4 + 8 + 8 + 8 + 4 + 4 = 40 bytes

Kinds: ``INFLIGHT`` (the message at queue/offset is in flight: its attempt, the store-clock ms
it becomes visible again, its delivery number), ``DONE`` (its delivery numbered ``delivery``
ended: acknowledged, or its record is gone; -1 ends whatever delivery is current) and ``NEXT``
(the queue's next never-popped offset is ``offset``) and ``DEAD`` (dead-lettering of the
message at queue/offset, delivery ``delivery``, has begun: ``visible_at`` holds the commit
log's end before its dead letter is put, where a look for that dead letter starts; the
message stays in flight until a ``DONE`` ends it). A record's ``rotate`` is the queue the
next pop starts with, its ``delivery`` the last delivery number handed out so far.

Records are only ever read as a prefix: scanning stops at the first record that is cut short,
fails its crc or breaks a rule of the layout, and says why (``Scan.damage``).
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass

import numpy as np

FILE_MAGIC = b"MQPJ"
VERSION = 1
RECORD_MAGIC = 0x31504F50  # "POP1"
INFLIGHT, DONE, NEXT, DEAD = 1, 2, 3, 4

_HEADER = struct.Struct("<4sIQI4x")
HEADER_SIZE = _HEADER.size
_RECORD = struct.Struct("<IIIQI")
RECORD_HEADER_SIZE = _RECORD.size
ENTRY = np.dtype([("kind", "<i4"), ("queue", "<i4"), ("offset", "<i8"), ("visible_at", "<i8"),
                  ("delivery", "<i8"), ("attempt", "<i4"), ("zero", "<i4")])
ENTRY_SIZE = ENTRY.itemsize
MAX_ENTRIES = 1 << 24  # far beyond any pop; a larger count is damage, not a record
MAX_DELIVERY = (1 << 62) - 1  # room above it for the next numbers in an int64
assert HEADER_SIZE == 24 and RECORD_HEADER_SIZE == 24 and ENTRY_SIZE == 40


def encode_header(generation: int) -> bytes:
    head = _HEADER.pack(FILE_MAGIC, VERSION, generation, 0)[:16]
    return _HEADER.pack(FILE_MAGIC, VERSION, generation, zlib.crc32(head))


def decode_header(buf: bytes) -> int:
    """The generation a journal's header names; ValueError saying what is wrong."""
    if len(buf) < HEADER_SIZE:
        raise ValueError(f"header cut short ({len(buf)} of {HEADER_SIZE} bytes)")
    magic, version, generation, crc = _HEADER.unpack_from(buf)
    if magic != FILE_MAGIC:
        raise ValueError(f"magic {magic!r} is not {FILE_MAGIC!r}")
    if zlib.crc32(bytes(buf[:16])) != crc:
        raise ValueError("header crc mismatch")
    if version != VERSION:
        raise ValueError(f"version {version} is not {VERSION}")
    return generation


def encode_record(rows, rotate: int, delivery: int) -> bytes:
    """One record of ``rows``: ``ENTRY`` tuples ``(kind, queue, offset, visible_at,
    delivery, attempt, 0)`` or an ``ENTRY`` array."""
    body = np.asarray(rows, dtype=ENTRY).tobytes() if len(rows) else b""
    head = _RECORD.pack(RECORD_MAGIC, len(rows), rotate, delivery, 0)[:20]
    return _RECORD.pack(RECORD_MAGIC, len(rows), rotate, delivery,
                        zlib.crc32(body, zlib.crc32(head))) + body


@dataclass
class Scan:
    """What ``scan`` found: ``(entries, rotate, delivery)`` per whole record, where the valid
    prefix ends, and why it ends there when that is not the end of the data."""

    records: list
    end: int
    damage: str | None = None


def _broken_rule(rows: np.ndarray) -> str | None:
    kinds = rows["kind"]
    bad = ~np.isin(kinds, (INFLIGHT, DONE, NEXT, DEAD))
    bad |= (rows["queue"] < 0) | (rows["offset"] < 0) | (rows["zero"] != 0)
    flight = kinds == INFLIGHT
    bad |= flight & ((rows["attempt"] < 1) | (rows["visible_at"] < 0) | (rows["delivery"] < 0)
                     | (rows["delivery"] > MAX_DELIVERY))
    bad |= (kinds == DONE) & (rows["delivery"] < -1)
    bad |= (kinds == DEAD) & ((rows["visible_at"] < 0) | (rows["delivery"] < 0))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        return f"entry {i} breaks the layout's rules ({rows[i].tolist()})"
    return None


def scan(buf, start: int = 0) -> Scan:
    """The whole, valid records of ``buf`` from ``start`` (a record boundary)."""
    view = memoryview(buf)
    records, pos, size = [], start, len(view)
    while pos < size:
        if size - pos < RECORD_HEADER_SIZE:
            return Scan(records, pos, f"record at byte {pos} cut short ({size - pos} bytes)")
        magic, count, rotate, delivery, crc = _RECORD.unpack_from(view, pos)
        if magic != RECORD_MAGIC:
            return Scan(records, pos, f"no record at byte {pos} (magic {magic:#010x})")
        if count > MAX_ENTRIES or delivery > MAX_DELIVERY:
            return Scan(records, pos, f"record at byte {pos} claims {count} entries, "
                                      f"delivery {delivery}")
        end = pos + RECORD_HEADER_SIZE + count * ENTRY_SIZE
        if end > size:
            return Scan(records, pos, f"record at byte {pos} cut short ({size - pos} of "
                                      f"{end - pos} bytes)")
        body = view[pos + RECORD_HEADER_SIZE:end]
        if zlib.crc32(body, zlib.crc32(view[pos:pos + 20])) != crc:
            return Scan(records, pos, f"record at byte {pos} fails its crc")
        rows = np.frombuffer(body, dtype=ENTRY)
        broken = _broken_rule(rows)
        if broken is not None:
            return Scan(records, pos, f"record at byte {pos}: {broken}")
        records.append((rows, rotate, delivery))
        pos = end
    return Scan(records, pos)

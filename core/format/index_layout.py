"""Index file layout: RocketMQ's message-key hash index, big-endian (Java ByteBuffer).

    +--------------------------------------------------------------------------+
    | header (40)                                                              |
    |  @0  beginTimestamp  i64   @8  endTimestamp   i64                        |
    |  @16 beginPhyOffset  i64   @24 endPhyOffset   i64                        |
    |  @32 hashSlotCount   i32   @36 indexCount     i32                        |
    +--------------------------------------------------------------------------+
    | slot table: slots x i32 at 40 + 4*slot (newest entry number, 0 = empty)  |
    +--------------------------------------------------------------------------+
    | entries: entries x 20 bytes at 40 + 4*slots + 20*n                       |
    |  +--------------+------------------+--------------------+--------------+ |
    |  | keyHash (4)  | phyOffset (8)    | timeDiff s (4)     | prevIndex (4)| | = 20
    |  +--------------+------------------+--------------------+--------------+ |
    +--------------------------------------------------------------------------+

size = 40 + 4*slots + 20*entries. Defaults 5,000,000 slots and 20,000,000 entries give
40 + 20,000,000 + 400,000,000 = 420,000,040 bytes. RocketMQ's default ratio is 4 entries per
slot, so a file of unknown counts has ``slots = (size - 40) / 84``: a 2728-byte file is
32 slots and 128 entries (40 + 128 + 2560).

``hashSlotCount`` is the number of slots in use, not the table size. ``indexCount`` is the next
entry number: it starts at 1 (entry 0 is never written), a stored value <= 0 reads as 1, and a
file holds at most ``entries - 1`` entries.

Keys are ``topic + "#" + key``; the stored hash is ``abs(hash)`` with ``Integer.MIN_VALUE``
(whose abs is still negative) taken as 0, and ``slot = hash % slots``. Entry times are whole
seconds after the file's ``beginTimestamp``, so reads see ``begin + diff*1000``.
"""

from __future__ import annotations

import struct
from typing import Callable, NamedTuple

import numpy as np

HEADER_SIZE = 40
SLOT_SIZE = 4
ENTRY_SIZE = 20
INVALID_INDEX = 0
FIRST_INDEX = 1
DEFAULT_SLOTS = 5_000_000
DEFAULT_ENTRIES = 20_000_000
DEFAULT_ENTRIES_PER_SLOT = 4
KEY_SEPARATOR = "#"

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

BEGIN_TIMESTAMP_AT = 0
END_TIMESTAMP_AT = 8
BEGIN_PHYS_OFFSET_AT = 16
END_PHYS_OFFSET_AT = 24
HASH_SLOT_COUNT_AT = 32
INDEX_COUNT_AT = 36

HEADER_STRUCT = struct.Struct(">qqqqii")
ENTRY_STRUCT = struct.Struct(">iqii")
INT_STRUCT = struct.Struct(">i")
LONG_STRUCT = struct.Struct(">q")
assert HEADER_STRUCT.size == HEADER_SIZE and ENTRY_STRUCT.size == ENTRY_SIZE

ENTRY_DTYPE = np.dtype([
    ("key_hash", ">i4"), ("phys_offset", ">i8"), ("time_diff", ">i4"), ("prev_index", ">i4"),
])
SLOT_DTYPE = np.dtype(">i4")
assert ENTRY_DTYPE.itemsize == ENTRY_SIZE


class IndexHeader(NamedTuple):
    begin_timestamp: int = 0
    end_timestamp: int = 0
    begin_phys_offset: int = 0
    end_phys_offset: int = 0
    hash_slot_count: int = 0
    index_count: int = 0


def pack_header(header: IndexHeader) -> bytes:
    return HEADER_STRUCT.pack(*header)


def unpack_header(buf, offset: int = 0) -> IndexHeader:
    """The header exactly as stored (``index_count`` is not yet forced to at least 1).

    Raises ValueError when fewer than 40 bytes follow ``offset``.
    """
    if not 0 <= offset <= len(buf) - HEADER_SIZE:
        raise ValueError(f"index header at {offset} needs {HEADER_SIZE} bytes, the buffer "
                         f"holds {len(buf)}")
    return IndexHeader(*HEADER_STRUCT.unpack_from(buf, offset))


def slot_position(slot: int) -> int:
    return HEADER_SIZE + slot * SLOT_SIZE


def entries_start(slots: int) -> int:
    return HEADER_SIZE + slots * SLOT_SIZE


def entry_position(slots: int, index: int) -> int:
    return HEADER_SIZE + slots * SLOT_SIZE + index * ENTRY_SIZE


def file_size(slots: int, entries: int) -> int:
    return HEADER_SIZE + slots * SLOT_SIZE + entries * ENTRY_SIZE


def counts_for_size(size: int, slots: int | None = None,
                    entries: int | None = None) -> tuple[int, int]:
    """``(slots, entries)`` of an index file of ``size`` bytes.

    Missing counts are derived: from the other count when one is given, otherwise with
    RocketMQ's default ratio ``entries = 4 * slots``. Raises ``ValueError`` when no positive
    counts give exactly ``size``.
    """
    body = size - HEADER_SIZE
    if slots is None and entries is None:
        per = SLOT_SIZE + DEFAULT_ENTRIES_PER_SLOT * ENTRY_SIZE
        slots = body // per if body > 0 else 0
        entries = DEFAULT_ENTRIES_PER_SLOT * slots
    elif slots is None:
        rest = body - entries * ENTRY_SIZE
        slots = rest // SLOT_SIZE if rest > 0 else 0
    elif entries is None:
        rest = body - slots * SLOT_SIZE
        entries = rest // ENTRY_SIZE if rest > 0 else 0
    if slots <= 0 or entries <= 0 or file_size(slots, entries) != size:
        raise ValueError(
            f"index file size {size} does not fit 40 + 4*slots + 20*entries "
            f"with slots={slots}, entries={entries} (both must be positive)"
        )
    return slots, entries


def key_string(topic: str, key: str) -> str:
    return topic + KEY_SEPARATOR + key


def index_hash(key: str, string_hash: Callable[[str], int]) -> int:
    """``abs(string_hash(key))`` as a Java int: ``Integer.MIN_VALUE`` stays negative, so 0."""
    h = string_hash(key)
    if h == INT32_MIN:
        return 0
    return abs(h)


def slot_of(key_hash: int, slots: int) -> int:
    return key_hash % slots


def time_diff_seconds(store_ts: int, begin_ts: int) -> int:
    """Seconds stored for ``store_ts``: truncated, 0 when the file has no begin time yet,
    clamped to ``[0, Integer.MAX_VALUE]``."""
    if begin_ts <= 0:
        return 0
    delta = store_ts - begin_ts
    diff = delta // 1000 if delta >= 0 else -((-delta) // 1000)
    return min(max(diff, 0), INT32_MAX)


def entry_time_ms(begin_ts: int, time_diff: int) -> int:
    return begin_ts + time_diff * 1000

"""Consume-queue extension unit and the bloom bitmap of SQL92 subscriptions (spec section 4).

    +-----------+---------------+------------------+----------------+----------------------+
    | size (2)  | tags code (8) | store time (8)   | bitmap len (2) | bitmap (bitmap len)  |
    +-----------+---------------+------------------+----------------+----------------------+
    20 bytes + bitmap; with RocketMQ's bloom (m = 112 bits) a unit is 20 + 14 = 34 bytes.

A consume-queue unit whose tags code is ``-2147483649`` or less holds an address into the
extension instead of a hash: ``address = offset_in_ext_stream + Long.MIN_VALUE``. A ``short -1``
in place of a size marks the end of an extension file.

Bloom bitmap: ``BloomFilter(f=20 %, n=32)`` gives k = 3 hash positions in m = 112 bits. The
positions of a string come from murmur3_x64_128 (seed 0): h1's low and high 32 bits as signed
ints, ``c = int32(lo + i*hi)`` for i = 1..k, ``c = ~c`` when negative, ``pos = c % m``; bit p is
``byte[p / 8] |= 1 << (p % 8)``. Vector: ``"G#T"`` -> [24, 26, 83].
"""

from __future__ import annotations

import math
import struct

import mmh3
import numpy as np

EXT_HEAD = struct.Struct(">hqqh")  # size, tags code, store time, bitmap length
EXT_HEAD_SIZE = 20
END_OF_FILE = -1
LONG_MIN = -(1 << 63)
BLOOM_MAX_ERROR_PERCENT = 20
BLOOM_EXPECTED_CONSUMERS = 32
BLOOM_K = math.ceil(math.log(BLOOM_MAX_ERROR_PERCENT / 100) / math.log(0.5))
BLOOM_M = -(-math.ceil(BLOOM_EXPECTED_CONSUMERS * math.log2(100 / BLOOM_MAX_ERROR_PERCENT)
                       * math.log2(math.e)) // 8) * 8
BLOOM_BYTES = BLOOM_M // 8
assert (BLOOM_K, BLOOM_M) == (3, 112)


def _int32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def bloom_positions(text: str, k: int = BLOOM_K, m: int = BLOOM_M) -> list[int]:
    h1, _h2 = mmh3.hash64(text.encode("utf-8"), 0, True)
    lo, hi = _int32(h1), _int32(h1 >> 32)
    out = []
    for i in range(1, k + 1):
        c = _int32(lo + i * hi)
        if c < 0:
            c = ~c
        out.append(c % m)
    return out


def subscription_key(group: str, topic: str) -> str:
    return f"{group}#{topic}"


def set_bits(bitmap: bytearray, positions) -> None:
    for p in positions:
        bitmap[p >> 3] |= 1 << (p & 7)


def encode_unit(tags_code: int, store_time: int, bitmap: bytes) -> bytes:
    return EXT_HEAD.pack(EXT_HEAD_SIZE + len(bitmap), tags_code, store_time, len(bitmap)) + bitmap


def to_address(ext_offset: int) -> int:
    return ext_offset + LONG_MIN


def from_address(address: np.ndarray) -> np.ndarray:
    """Extension stream offsets of addresses (vectorized; int64 wrap-around is intended)."""
    return (np.asarray(address, dtype=np.int64) - np.int64(LONG_MIN)).astype(np.int64)


def bitmap_matches(bitmaps: np.ndarray, positions) -> np.ndarray:
    """Rows of ``bitmaps`` (n x BLOOM_BYTES uint8) that have every bit in ``positions`` set."""
    ok = np.ones(len(bitmaps), dtype=bool)
    for p in positions:
        ok &= (bitmaps[:, p >> 3] >> (p & 7)) & 1 == 1
    return ok

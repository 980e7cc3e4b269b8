"""MurmurHash3 x86_32 (seed 0, signed), the same values as ``mmh3.hash``, over many keys at once.

Keys are grouped by length; each group is one uint8 matrix hashed column block by column
block with numpy uint32 arithmetic (wrapping, as the C code's), so a batch of keys costs a few
array passes per 4 bytes of key length instead of one Python call per key.
"""

from __future__ import annotations

import numpy as np

_C1 = np.uint32(0xCC9E2D51)
_C2 = np.uint32(0x1B873593)
_N = np.uint32(0xE6546B64)
_F1 = np.uint32(0x85EBCA6B)
_F2 = np.uint32(0xC2B2AE35)


def _rotl(x: np.ndarray, r: int) -> np.ndarray:
    return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def hash_matrix(keys: np.ndarray) -> np.ndarray:
    """Hashes of the rows of ``keys`` (n x L uint8, every key L bytes long) as int32."""
    n, length = keys.shape
    h = np.zeros(n, dtype=np.uint32)
    blocks = length // 4
    with np.errstate(over="ignore"):
        if blocks:
            words = np.ascontiguousarray(keys[:, :blocks * 4]).view("<u4")
            for j in range(blocks):
                k = words[:, j] * _C1
                k = _rotl(k, 15) * _C2
                h ^= k
                h = _rotl(h, 13) * np.uint32(5) + _N
        tail = length & 3
        if tail:
            k = np.zeros(n, dtype=np.uint32)
            base = blocks * 4
            for t in range(tail - 1, -1, -1):
                k ^= keys[:, base + t].astype(np.uint32) << np.uint32(8 * t)
            k = _rotl(k * _C1, 15) * _C2
            h ^= k
        h ^= np.uint32(length)
        h ^= h >> np.uint32(16)
        h *= _F1
        h ^= h >> np.uint32(13)
        h *= _F2
        h ^= h >> np.uint32(16)
    return h.view(np.int32)


def hash_ranges(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                prefix: bytes = b"") -> np.ndarray:
    """``mmh3.hash(prefix + data[start:start + length])`` for every range, as int64."""
    out = np.empty(len(starts), dtype=np.int64)
    if not len(starts):
        return out
    pre = np.frombuffer(prefix, dtype=np.uint8)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        body = data[starts[rows, None] + np.arange(length)]
        keys = np.concatenate([np.broadcast_to(pre, (len(rows), len(pre))), body], axis=1) \
            if len(pre) else body
        out[rows] = hash_matrix(keys)
    return out

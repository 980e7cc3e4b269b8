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


def _blocks(h: np.ndarray, words: np.ndarray) -> np.ndarray:
    for j in range(words.shape[1]):
        k = _rotl(words[:, j] * _C1, 15) * _C2
        h ^= k
        h = _rotl(h, 13) * np.uint32(5) + _N
    return h


def _finish(h: np.ndarray, keys: np.ndarray, total_length: int) -> np.ndarray:
    """Tail bytes (``keys`` holds whatever follows the whole blocks) and the final mix."""
    tail = keys.shape[1]
    if tail:
        k = np.zeros(len(h), dtype=np.uint32)
        for t in range(tail - 1, -1, -1):
            k ^= keys[:, t].astype(np.uint32) << np.uint32(8 * t)
        h ^= _rotl(k * _C1, 15) * _C2
    h ^= np.uint32(total_length)
    h ^= h >> np.uint32(16)
    h *= _F1
    h ^= h >> np.uint32(13)
    h *= _F2
    h ^= h >> np.uint32(16)
    return h.view(np.int32)


def hash_matrix(keys: np.ndarray, seed_state: int = 0, done: int = 0) -> np.ndarray:
    """Hashes of the rows of ``keys`` (n x L uint8) as int32. ``seed_state`` and ``done``
    resume a hash after ``done`` bytes (a multiple of 4) of a shared prefix."""
    n, length = keys.shape
    blocks = length // 4
    with np.errstate(over="ignore"):
        h = np.full(n, seed_state, dtype=np.uint32)
        if blocks:
            h = _blocks(h, np.ascontiguousarray(keys[:, :blocks * 4]).view("<u4"))
        return _finish(h, keys[:, blocks * 4:], done + length)


def _prefix_state(prefix: bytes) -> tuple[int, bytes]:
    """The hash state after the whole 4-byte blocks of ``prefix``, and its leftover bytes."""
    whole = len(prefix) // 4 * 4
    h = np.zeros(1, dtype=np.uint32)
    with np.errstate(over="ignore"):
        if whole:
            h = _blocks(h, np.frombuffer(prefix[:whole], dtype="<u4").reshape(1, -1))
    return int(h[0]), prefix[whole:]


def hash_ranges(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                prefix: bytes = b"") -> np.ndarray:
    """``mmh3.hash(prefix + data[start:start + length])`` for every range, as int64.

    The prefix's whole blocks are hashed once; only its last ``len % 4`` bytes are copied in
    front of each key."""
    out = np.empty(len(starts), dtype=np.int64)
    if not len(starts):
        return out
    state, rest = _prefix_state(prefix)
    done = len(prefix) - len(rest)
    pre = np.frombuffer(rest, dtype=np.uint8)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        body = data[starts[rows, None] + np.arange(length)]
        keys = np.concatenate([np.broadcast_to(pre, (len(rows), len(pre))), body], axis=1) \
            if len(pre) else body
        out[rows] = hash_matrix(keys, state, done)
    return out

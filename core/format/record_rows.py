"""Record headers and bodies of the records a pull serves, as numpy columns.

The fixed part of a V1 record with IPv4 hosts (the common case: RocketMQ writes V2 only for
topics longer than 127 bytes, IPv6 only for IPv6 hosts) is 88 bytes, TOTALSIZE to BODYLENGTH;
``HEADER_V4`` is that layout as a numpy structured dtype (``record.header_dtype``). Rows are taken from a segment's map
through a strided window, one contiguous copy per row, so a thousand headers cost about as much
as a few dozen Python calls. Records of any other shape are left to the per-record code
(``format.record``, ``format.verify``), which names what is wrong.
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import as_strided

from mqstore.format import record_crc
from mqstore.format.record import MAGIC_V1, header_dtype
from mqstore.hashing import zlib_crc32

HEADER_V4 = header_dtype(False, False)
HEADER_V4_BYTES = HEADER_V4.itemsize  # 88
_HOST_BITS = 0x30  # sysflag bits 4 and 5: born / store host is IPv6
# A V1 record is at least its header, a one-byte topic length and a two-byte properties length.
MIN_V1_RECORD = HEADER_V4_BYTES + 3


def segment_bytes(mm) -> np.ndarray:
    """The segment's map as bytes (no copy). The array holds the map open past a close: a
    segment deleted meanwhile stays readable until the array is dropped."""
    return np.frombuffer(mm, dtype=np.uint8)


def _window(data: np.ndarray, width: int) -> np.ndarray | None:
    """Every ``width``-byte run of ``data`` as one void item, one item per byte offset; None
    when ``data`` is not plain contiguous bytes. Indexing it copies each picked run with one
    memcpy: about twice as fast as picking rows of a two-dimensional byte window, which
    numpy copies byte by byte. (A record dtype with fields would be copied field by field.)"""
    if width <= 0 or data.dtype != np.uint8 or data.ndim != 1 or not data.flags.c_contiguous:
        return None
    return np.ndarray(shape=(max(len(data) - width + 1, 0),), dtype=np.dtype((np.void, width)),
                      buffer=data, strides=(1,))


def rows(data: np.ndarray, at: np.ndarray, width: int) -> np.ndarray:
    """``width`` bytes at each of the offsets ``at`` of ``data``, as an (n, width) array;
    every ``at + width`` must lie within ``data``."""
    window = _window(data, width)
    if window is not None:
        return window[at].view(np.uint8).reshape(-1, width)
    window = as_strided(data, shape=(max(len(data) - width + 1, 0), width),
                        strides=(1, 1), writeable=False)
    return window[at]


def headers(data: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The 88-byte headers of the records at ``at`` (each at least MIN_V1_RECORD bytes into
    ``data``), decoded as HEADER_V4 whatever their shape: check ``v1_ipv4_ok`` first."""
    return rows(data, at, HEADER_V4_BYTES).view(HEADER_V4).reshape(-1)


def v1_ipv4_ok(data: np.ndarray, at: np.ndarray, head: np.ndarray, sizes: np.ndarray,
               topic: bytes) -> np.ndarray:
    """Which records are well-formed V1/IPv4 records of ``topic`` exactly ``sizes`` long, whose
    lengths add up (body, topic, properties). Identity (offsets, queue) is the caller's."""
    body_len = head["body_len"].astype(np.int64)
    tlen = len(topic)
    tail_at = at + HEADER_V4_BYTES + body_len  # the topic-length byte
    ok = ((head["magic"] == MAGIC_V1) & ((head["sysflag"] & _HOST_BITS) == 0)
          & (head["total_size"] == sizes) & (body_len >= 0)
          & (HEADER_V4_BYTES + body_len + 3 + tlen <= sizes))
    if not ok.all():
        return ok
    tail = rows(data, tail_at, tlen + 3)
    expected = np.frombuffer(bytes([tlen]) + topic, dtype=np.uint8)
    ok &= (tail[:, :tlen + 1] == expected).all(axis=1)
    props_len = tail[:, tlen + 1].astype(np.int64) << 8 | tail[:, tlen + 2]
    ok &= HEADER_V4_BYTES + body_len + 3 + tlen + props_len == sizes
    return ok


def crc_ok(data: np.ndarray, body_at: list, body_len: list, crcs: list) -> bool:
    """True when every body's CRC-32 (sign bit dropped, as RocketMQ stores it) matches.

    The CRC takes one call per body (no batch CRC is at hand). Bodies of one length are first
    copied out with one gather: the CRC then reads them from cache rather than one scattered
    map page at a time, about a third less time for 256-byte bodies."""
    n = len(body_len)
    if (n > 1 and isinstance(body_len, list) and body_len[0] > 0
            and body_len.count(body_len[0]) == n):
        width = body_len[0]
        window = _window(data, width)
        at = np.asarray(body_at, dtype=np.int64)
        if window is not None and int(at.min()) >= 0 and int(at.max()) < len(window):
            return [zlib_crc32(b) & 0x7FFFFFFF for b in window[at].tolist()] == list(crcs)
    mv = memoryview(data)
    try:
        return all(zlib_crc32(mv[a:a + n]) & 0x7FFFFFFF == c
                   for a, n, c in zip(body_at, body_len, crcs))
    finally:
        mv.release()


def records_crc_ok(data: np.ndarray, at: np.ndarray, sizes: np.ndarray, head: np.ndarray,
                   topic_len: int, required: np.ndarray | None = None) -> bool:
    """True when every V1/IPv4 record at ``at`` (already shape-checked, ``head`` its headers)
    matches its CRC: the whole-record ``__CRC32#`` property where it carries one (where
    ``required`` is set, it must), else the body's."""
    ends = at + sizes
    props_at = at + (HEADER_V4_BYTES + 3 + topic_len) + head["body_len"].astype(np.int64)
    whole = record_crc.rows_carrying(data, ends, props_at)
    if whole is None or (required is not None and (required & ~whole).any()):
        return False
    if whole.any():
        stored = record_crc.rows_stored(data, ends[whole])
        if stored is None:
            return False
        covered = (sizes[whole] - record_crc.RESERVED).tolist()
        if not crc_ok(data, at[whole].tolist(), covered, stored.tolist()):
            return False
        if whole.all():
            return True
        at, head = at[~whole], head[~whole]
    return crc_ok(data, (at + HEADER_V4_BYTES).tolist(), head["body_len"].tolist(),
                  head["body_crc"].tolist())


def gather(data: np.ndarray, starts: np.ndarray,
           lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The byte ranges ``[starts, starts + lengths)`` of ``data`` packed into one uint8 array,
    and the n + 1 int32 offsets of each range in it (Arrow's binary layout)."""
    offsets = np.zeros(len(starts) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if len(starts) and (lengths == lengths[0]).all():
        # Equal lengths (fixed-size payloads are common): one strided row copy.
        width = int(lengths[0])
        if width == 0:
            return np.empty(0, dtype=np.uint8), offsets
        return rows(data, starts, width).reshape(-1), offsets
    mv = memoryview(data)
    try:
        packed = b"".join([mv[a:a + n] for a, n in zip(starts.tolist(), lengths.tolist())])
        return np.frombuffer(packed, dtype=np.uint8), offsets
    finally:
        mv.release()

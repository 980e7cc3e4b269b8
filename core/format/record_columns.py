"""Column-wise reading of many commit-log records at once (the dispatch hot path).

``walk`` follows TOTALSIZE from record to record (the only inherently sequential step); ``heads``
then validates every record's lengths and gathers the fixed fields for all of them with numpy
fancy indexing, so per-record Python work is two slices (topic, properties). ``heads`` accepts
exactly the records ``record.unpack_record`` accepts, and never reads outside a record it has
not yet found to fit the buffer, so damaged bytes end the valid prefix instead of raising.
"""

from __future__ import annotations

import struct

import numpy as np

from mqstore.format.record import (
    MAGIC_V1, MAGIC_V2, POS_PHYS_OFFSET, POS_QUEUE_ID, POS_QUEUE_OFFSET, POS_SYSFLAG,
    SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6,
)

_SIZE_MAGIC = struct.Struct(">ii")
MIN_RECORD_BYTES = 91
_R4 = np.arange(4)
_R8 = np.arange(8)


def walk(buf, begin: int, limit: int, soft_stop: int) -> tuple[list[int], int]:
    """Start positions of the records laid back to back from ``begin``.

    Stops at ``limit``, once a record ends at or past ``soft_stop``, at anything that is not a
    V1/V2 record header (a blank record, zeros, garbage) or at a size that overruns ``limit``;
    returns the positions and where it stopped.
    """
    if begin < 0:
        raise ValueError(f"walk cannot begin at {begin}, before the buffer")
    out = []
    append = out.append
    unpack = _SIZE_MAGIC.unpack_from
    limit = min(limit, len(buf))  # bytes past the buffer are not readable, whatever the caller says
    pos = begin
    while pos + 8 <= limit and pos < soft_stop:
        total, magic = unpack(buf, pos)
        if (magic != MAGIC_V1 and magic != MAGIC_V2) or total < MIN_RECORD_BYTES \
                or pos + total > limit:
            break
        append(pos)
        pos += total
    return out, pos


def _gather(u8: np.ndarray, at: np.ndarray, width: int, dtype: str) -> np.ndarray:
    idx = at[:, None] + (_R4 if width == 4 else _R8 if width == 8 else np.arange(width))
    return np.ascontiguousarray(u8[idx]).view(dtype).ravel()


def _prefix(ok: np.ndarray) -> int:
    """Length of the all-True prefix of ``ok``."""
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else len(ok)


def heads(u8: np.ndarray, positions: np.ndarray) -> tuple[dict, int]:
    """Fixed fields of the records at ``positions`` (segment-relative, from ``walk``).

    Returns ``(columns, n_valid)``: columns cover the first ``n_valid`` records, those with a
    known magic whose lengths add up to TOTALSIZE inside ``u8``; the record at ``n_valid`` (if
    any) is malformed. A position outside ``u8`` is a caller's error (ValueError).
    """
    pos = np.asarray(positions, dtype=np.int64)
    size = len(u8)
    if len(pos) and (int(pos.min()) < 0 or int(pos.max()) > size - MIN_RECORD_BYTES):
        bad = int(pos[(pos < 0) | (pos > size - MIN_RECORD_BYTES)][0])
        raise ValueError(f"record position {bad} leaves no room for a {MIN_RECORD_BYTES}-byte "
                         f"record in the {size}-byte buffer")
    # Stage 1 reads only the first 40 bytes, inside every position checked above. Records after
    # the first bad one are never returned, so later stages work on the valid prefix only.
    total = _gather(u8, pos, 4, ">i4").astype(np.int64)
    magic = _gather(u8, pos + 4, 4, ">i4")
    sysflag = _gather(u8, pos + POS_SYSFLAG, 4, ">i4")
    v2 = magic == MAGIC_V2
    born = np.where(sysflag & SYSFLAG_BORNHOST_V6, 20, 8)
    store = np.where(sysflag & SYSFLAG_STOREHOST_V6, 20, 8)
    ts_at = pos + 48 + born
    body_len_at = ts_at + 8 + store + 12
    end = pos + total
    # Header, then at least the topic and properties length fields (3 bytes in V1, 4 in V2).
    tail_min = np.where(v2, 4, 3)
    n = _prefix(((magic == MAGIC_V1) | v2) & (end <= size) & (body_len_at + 4 + tail_min <= end))
    pos, total, sysflag, v2, ts_at, body_len_at, end, tail_min = (
        a[:n] for a in (pos, total, sysflag, v2, ts_at, body_len_at, end, tail_min))
    body_len = _gather(u8, body_len_at, 4, ">i4").astype(np.int64)
    body_ok = (body_len >= 0) & (body_len <= end - body_len_at - 4 - tail_min)
    tlen_at = body_len_at + 4 + np.where(body_ok, body_len, 0)  # <= end - tail_min
    t_hi = u8[tlen_at].astype(np.int64)
    t_lo = u8[tlen_at + 1].astype(np.int64)  # V1: a byte of the properties length; unused
    topic_len = np.where(v2, (t_hi << 8 | t_lo) - ((t_hi & 0x80) << 9), t_hi - ((t_hi & 0x80) << 1))
    topic_at = tlen_at + np.where(v2, 2, 1)  # <= end - 2
    topic_ok = (topic_len >= 0) & (topic_at + topic_len + 2 <= end)
    plen_at = topic_at + np.where(topic_ok, topic_len, 0)
    props_len = (u8[plen_at].astype(np.int64) << 8 | u8[plen_at + 1]).astype(np.int64)
    props_len = props_len - ((props_len & 0x8000) << 1)
    props_at = plen_at + 2
    n = _prefix(body_ok & topic_ok & (props_len >= 0) & (props_at + props_len == end))
    cols = {
        "size": total[:n],
        "queue_id": _gather(u8, pos[:n] + POS_QUEUE_ID, 4, ">i4"),
        "queue_offset": _gather(u8, pos[:n] + POS_QUEUE_OFFSET, 8, ">i8"),
        "phys_offset": _gather(u8, pos[:n] + POS_PHYS_OFFSET, 8, ">i8"),
        "sysflag": sysflag[:n],
        "store_timestamp": _gather(u8, ts_at[:n], 8, ">i8"),
        "topic_at": topic_at[:n],
        "topic_len": topic_len[:n],
        "props_at": props_at[:n],
        "props_len": props_len[:n],
    }
    return cols, n

"""Column-wise reading of many commit-log records at once (the dispatch hot path).

``walk`` follows TOTALSIZE from record to record (the only inherently sequential step); ``heads``
then validates every record's lengths and gathers the fixed fields for all of them with numpy
fancy indexing, so per-record Python work is two slices (topic, properties).
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

    Stops at ``limit``, once a record ends at or past ``soft_stop``, at anything that is not a V1/V2 record header (a blank record, zeros,
    garbage) or at a size that overruns ``limit``; returns the positions and where it stopped.
    """
    out = []
    append = out.append
    unpack = _SIZE_MAGIC.unpack_from
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


def heads(u8: np.ndarray, positions: np.ndarray) -> tuple[dict, int]:
    """Fixed fields of the records at ``positions`` (segment-relative, from ``walk``).

    Returns ``(columns, n_valid)``: columns cover the first ``n_valid`` records, those whose
    lengths add up to TOTALSIZE; the record at ``n_valid`` (if any) is malformed.
    """
    pos = positions
    total = _gather(u8, pos, 4, ">i4").astype(np.int64)
    magic = _gather(u8, pos + 4, 4, ">i4")
    sysflag = _gather(u8, pos + POS_SYSFLAG, 4, ">i4")
    born = np.where(sysflag & SYSFLAG_BORNHOST_V6, 20, 8)
    store = np.where(sysflag & SYSFLAG_STOREHOST_V6, 20, 8)
    ts_at = pos + 48 + born
    body_len_at = ts_at + 8 + store + 12
    end = pos + total
    body_len = _gather(u8, body_len_at, 4, ">i4").astype(np.int64)
    tlen_at = np.minimum(body_len_at + 4 + np.maximum(body_len, 0), end - 1)
    v2 = magic == MAGIC_V2
    t_hi = u8[tlen_at].astype(np.int64)
    t_lo = u8[np.minimum(tlen_at + 1, end - 1)].astype(np.int64)
    topic_len = np.where(v2, (t_hi << 8 | t_lo) - ((t_hi & 0x80) << 9), t_hi - ((t_hi & 0x80) << 1))
    topic_at = tlen_at + np.where(v2, 2, 1)
    plen_at = np.minimum(topic_at + np.maximum(topic_len, 0), end - 2)
    props_len = (u8[plen_at].astype(np.int64) << 8 | u8[plen_at + 1]).astype(np.int64)
    props_len = props_len - ((props_len & 0x8000) << 1)
    props_at = plen_at + 2
    ok = (body_len >= 0) & (topic_len >= 0) & (props_len >= 0) & (props_at + props_len == end)
    bad = np.flatnonzero(~ok)
    n = int(bad[0]) if len(bad) else len(pos)
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

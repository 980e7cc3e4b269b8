"""What a slave checks of the bytes a master sends before they join its commit log.

Frames cut the master's log every 32 KiB, through records; the slave appends whole records
only, so its log always ends on a record boundary and every record it holds was checked as
recovery checks one: a known magic, lengths that add up, the CRC, and the record's own
PHYSICALOFFSET field equal to where it lands. That last check is what tells a slave whose log
diverged from the master's: the master sends from where the slave says its log ends, and when
that is not a record boundary of the master's log (the slave's last record differs), the bytes
found there name another offset or are no record at all. A blank record must span exactly to
its segment's end; the segment size is not on the wire, so a blank that does not fit says the
two stores were configured with different ``commit_log.segment_bytes``.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mqstore.format import record_crc
from mqstore.format.record import (
    BLANK_MAGIC, BLANK_RECORD, END_FILE_MIN_BLANK_BYTES, MAGIC_V1, MAGIC_V2, POS_BODY_CRC,
    SCAN_OK, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6, scan_record,
)
from mqstore.format.record_columns import MIN_RECORD_BYTES, heads, walk
from mqstore.hashing import crc32

_R4 = np.arange(4)


class Run(NamedTuple):
    whole: int
    """Bytes from the start that are whole, checked records."""
    blank: bool
    """A blank record's 8-byte header follows them: the segment ends with it."""
    last_store_ts: int
    """Store time of the last whole record (0: none)."""
    problem: str | None
    """Why the bytes after ``whole`` can never be a record of this log, or None."""


def check_run(buf, phys_offset: int, segment_bytes: int, max_record_bytes: int) -> Run:
    """Check the master's bytes ``buf``, which belong at commit-log offset ``phys_offset`` of
    a log of ``segment_bytes`` segments. Stops before a record not yet received whole."""
    room = segment_bytes - phys_offset % segment_bytes  # bytes to the segment's end
    end = min(len(buf), room)
    pos, last_ts = _checked_prefix(buf, phys_offset, end, room, max_record_bytes)
    while end - pos >= 8:  # what the prefix stopped at: one record, a blank, the cut
        here = phys_offset + pos
        total, magic = BLANK_RECORD.unpack_from(buf, pos)
        if magic == BLANK_MAGIC:
            if total != room - pos:
                return Run(pos, False, last_ts, (
                    f"the blank record at commit-log offset {here} spans {total} bytes, but "
                    f"this store's segment ends {room - pos} bytes later: the master's "
                    f"segments are not {segment_bytes} bytes (configure the slave's "
                    f"commit_log.segment_bytes as the master's)"))
            return Run(pos, True, last_ts, None)
        if magic != MAGIC_V1 and magic != MAGIC_V2:
            return Run(pos, False, last_ts, (
                f"no record starts at commit-log offset {here} (magic "
                f"{magic & 0xFFFFFFFF:#010x})"))
        if not MIN_RECORD_BYTES <= total <= room - pos - END_FILE_MIN_BLANK_BYTES:
            return Run(pos, False, last_ts, (
                f"the record at commit-log offset {here} claims {total} bytes; a record takes "
                f"{MIN_RECORD_BYTES} to {room - pos - END_FILE_MIN_BLANK_BYTES} bytes there "
                f"(its segment of {segment_bytes} bytes ends {room - pos} bytes later, with "
                f"room left for a blank record)"))
        if total > max_record_bytes:
            return Run(pos, False, last_ts, (
                f"the record at commit-log offset {here} is {total} bytes, more than the "
                f"{max_record_bytes} this store takes (configure the slave's "
                f"commit_log.max_message_bytes as the master's)"))
        if total > end - pos:
            break  # the rest comes in a later frame
        kind, why, head = scan_record(buf, pos, pos + total, True, expected_phys=here)
        if kind != SCAN_OK:
            return Run(pos, False, last_ts, f"the record at commit-log offset {here}: {why}")
        last_ts = head.store_timestamp
        pos += total
    if pos < room and room - pos < END_FILE_MIN_BLANK_BYTES and end == room:
        return Run(pos, False, last_ts, (
            f"the segment ends {room - pos} bytes after commit-log offset {phys_offset + pos}, "
            f"too few for the blank record that ends a segment"))
    return Run(pos, False, last_ts, None)


def _checked_prefix(buf, phys_offset: int, end: int, room: int, max_record_bytes: int
                    ) -> tuple[int, int]:
    """The bytes of the longest run of whole records from the start of ``buf`` that pass
    every check ``check_run`` makes, found with array passes (the hot path: a slave checks
    every record it takes), and the store time of its last record. What stops the run is
    looked at record by record by the caller, which names the problem."""
    positions, _stop = walk(buf, 0, end, end)
    if not positions:
        return 0, 0
    u8 = np.frombuffer(buf, dtype=np.uint8, count=end)
    pos = np.asarray(positions, dtype=np.int64)
    cols, n = heads(u8, pos)
    pos, sizes = pos[:n], cols["size"]
    fits = ((cols["phys_offset"] == phys_offset + pos) & (sizes <= max_record_bytes)
            & (pos + sizes <= room - END_FILE_MIN_BLANK_BYTES))
    bad = np.flatnonzero(~fits)
    n = int(bad[0]) if len(bad) else n
    n = _crc_prefix(buf, u8, pos[:n], sizes[:n], cols["sysflag"][:n], cols["props_at"][:n])
    if not n:
        return 0, 0
    return int(pos[n - 1] + sizes[n - 1]), int(cols["store_timestamp"][n - 1])


def _crc_prefix(buf, u8: np.ndarray, pos: np.ndarray, sizes: np.ndarray, sysflag: np.ndarray,
                props_at: np.ndarray) -> int:
    """How many of the records (laid out as ``heads`` found) have a matching CRC: the
    whole-record ``__CRC32#`` property where a record carries it, else the body's."""
    if not len(pos):
        return 0
    ends = pos + sizes
    carrying = record_crc.rows_carrying(u8, ends, props_at)
    if carrying is None:  # a property nearly there: record by record, by the caller
        return 0
    body_len_at = (pos + 68 + np.where(sysflag & SYSFLAG_BORNHOST_V6, 20, 8)
                   + np.where(sysflag & SYSFLAG_STOREHOST_V6, 20, 8))
    body_len = _int32(u8, body_len_at)
    body_at = body_len_at + 4
    stored = _int32(u8, pos + POS_BODY_CRC)
    view = memoryview(buf)
    try:
        crcs = np.fromiter(map(crc32, map(view.__getitem__, map(
            slice, body_at.tolist(), (body_at + body_len).tolist()))), dtype=np.int64,
            count=len(pos))
        ok = carrying | (crcs == stored)
        for row in np.flatnonzero(carrying).tolist():
            ok[row] = record_crc.intact(view, int(pos[row]), int(ends[row]))
    finally:
        view.release()
    bad = np.flatnonzero(~ok)
    return int(bad[0]) if len(bad) else len(pos)


def _int32(u8: np.ndarray, at: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(u8[at[:, None] + _R4]).view(">i4").ravel().astype(np.int64)


def max_record_bytes(max_message_bytes: int) -> int:
    """The largest record a store taking bodies of ``max_message_bytes`` holds: RocketMQ's
    limit, the body plus 64 KiB of headers, topic and properties."""
    return max_message_bytes + (64 << 10)


__all__ = ["Run", "check_run", "max_record_bytes"]

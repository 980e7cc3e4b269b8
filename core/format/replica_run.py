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

from mqstore.format.record import (
    BLANK_MAGIC, BLANK_RECORD, END_FILE_MIN_BLANK_BYTES, MAGIC_V1, MAGIC_V2, SCAN_OK,
    scan_record,
)
from mqstore.format.record_columns import MIN_RECORD_BYTES


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
    pos = last_ts = 0
    while end - pos >= 8:
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


def max_record_bytes(max_message_bytes: int) -> int:
    """The largest record a store taking bodies of ``max_message_bytes`` holds: RocketMQ's
    limit, the body plus 64 KiB of headers, topic and properties."""
    return max_message_bytes + (64 << 10)


__all__ = ["Run", "check_run", "max_record_bytes"]

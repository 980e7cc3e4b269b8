"""Quarantine records, and finding the next intact record after damaged commit-log bytes.

Recovery keeps every intact record after a damaged region (bit rot, a zeroed page, segments a
crash left uncommitted before later data) instead of cutting the log there. It rewrites the
damaged region so that every reader, RocketMQ's own included, walks over it:

- to the end of its segment: a blank record (``remaining | 0xCBD43194``), as any closed segment;
- elsewhere: one *quarantine record* of exactly the region's length, an ordinary V1 record that
  no consume queue or index refers to:

    +--------------------+---------------------------------------------------------------+
    | SYSFLAG            | TRANSACTION_PREPARED: dispatch gives it no consume-queue unit |
    | FLAG               | QUARANTINE_FLAG 0x51524E54 ("QRNT")                           |
    | QUEUEID / QOFFSET  | 0 / 0                                                         |
    | timestamps         | the store time of a neighbouring intact record                |
    | TOPIC              | a prefix of "%QUARANTINE%" (as long as the region allows)     |
    | BODY               | zeros, padding the record to the region's length              |
    +--------------------+---------------------------------------------------------------+
    a region of n >= 92 bytes holds one: 91 header bytes + topic (1..12) + body (the rest)

The original bytes are kept in ``quarantine/<20-digit offset>`` before the rewrite.

``find_record`` re-synchronises: the next position whose bytes form a complete, CRC-checked
record that names its own physical offset (or a blank that closes the segment exactly). A
record is only accepted with its own offset in it, so stale or foreign bytes never pass.
"""

from __future__ import annotations

import numpy as np

from mqstore.format.hosts import Host
from mqstore.format.record import (
    BLANK_MAGIC, BLANK_RECORD, QUARANTINE_FLAG, SCAN_BLANK, SCAN_OK, TX_PREPARED, encode_blank,
    encode_record, scan_record,
)

QUARANTINE_TOPIC = b"%QUARANTINE%"
MIN_QUARANTINE_BYTES = 92  # 91 header bytes (V1, IPv4 hosts, empty properties) + 1 topic byte
QUARANTINE_DIR = "quarantine"
SEARCH_CHUNK_BYTES = 4 << 20
_NO_HOST = Host(bytes(4), 0)
# Bytes 1-3 of every record magic (V1 0xDAA320A7, V2 0xDAA320AB) and of the blank's.
_MAGIC_HEAD = bytes.fromhex("DAA320")
_BLANK_HEAD = BLANK_MAGIC.to_bytes(4, "big", signed=True)[:3]


def encode_quarantine(length: int, store_timestamp: int, phys_offset: int) -> bytes:
    """A quarantine record of exactly ``length`` (>= MIN_QUARANTINE_BYTES) bytes, to be
    written at ``phys_offset``."""
    if length < MIN_QUARANTINE_BYTES:
        raise ValueError(f"a quarantine record needs {MIN_QUARANTINE_BYTES} bytes, not {length}")
    topic = QUARANTINE_TOPIC[:min(len(QUARANTINE_TOPIC), length - 91)]
    record = encode_record(
        queue_id=0, flag=QUARANTINE_FLAG, queue_offset=0, phys_offset=phys_offset,
        sysflag=TX_PREPARED, born_timestamp=store_timestamp, born_host=_NO_HOST,
        store_timestamp=store_timestamp, store_host=_NO_HOST, reconsume_times=0,
        prepared_tx_offset=0, body=bytes(length - 91 - len(topic)), topic=topic, properties=b"")
    assert len(record) == length
    return record


def is_quarantine(flag: int, sysflag: int, topic: str) -> bool:
    return (flag == QUARANTINE_FLAG and sysflag & 0xC == TX_PREPARED and topic != ""
            and QUARANTINE_TOPIC.decode().startswith(topic))


def filler_for(length: int, store_timestamp: int, phys_offset: int, to_segment_end: bool) -> bytes:
    """The bytes that replace a damaged region: a blank when it runs to its segment's end,
    else a quarantine record written at ``phys_offset``."""
    if to_segment_end:
        return encode_blank(length)
    return encode_quarantine(length, store_timestamp, phys_offset)


def find_record(buf, first: int, limit: int, base_phys: int, segment_size: int,
                crc_range: tuple[int, int] | None = None) -> int | None:
    """Position (relative to ``buf``) of the first intact record or closing blank starting
    in ``[first, limit)``, or None. ``buf`` maps one segment starting at ``base_phys``;
    ``crc_range`` as for ``scan_record``."""
    u8 = np.frombuffer(buf, dtype=np.uint8)
    at = first
    while at < limit - 8:
        stop = min(limit, at + SEARCH_CHUNK_BYTES + 8)
        for pos in _candidates(u8, at, stop):
            if _intact(buf, pos, base_phys, segment_size, crc_range):
                return pos
        at = stop - 8
    return None


def _candidates(u8: np.ndarray, begin: int, stop: int) -> list[int]:
    """Record starts in ``[begin, stop - 8)`` whose magic field looks like a record's or a
    blank's (checked in full by the caller)."""
    window = u8[begin + 4:stop]
    if len(window) < 4:
        return []
    b0, b1, b2, b3 = window[:-3], window[1:-2], window[2:-1], window[3:]
    record = (b0 == _MAGIC_HEAD[0]) & (b1 == _MAGIC_HEAD[1]) & (b2 == _MAGIC_HEAD[2]) & (
        (b3 == 0xA7) | (b3 == 0xAB))
    blank = (b0 == _BLANK_HEAD[0]) & (b1 == _BLANK_HEAD[1]) & (b2 == _BLANK_HEAD[2]) & (b3 == 0x94)
    return (np.flatnonzero(record | blank) + begin).tolist()


def _intact(buf, pos: int, base_phys: int, segment_size: int,
            crc_range: tuple[int, int] | None = None) -> bool:
    # The whole mapped segment bounds the record, not the search limit: a record may end in
    # zero bytes past the last non-zero one.
    limit = min(segment_size, len(buf))
    kind, size, _head = scan_record(buf, pos, limit, True, expected_phys=base_phys + pos,
                                    crc_range=crc_range)
    if kind == SCAN_OK:
        return True
    if kind == SCAN_BLANK:
        return size == segment_size - pos
    return False


def blank_closes(buf, pos: int, segment_size: int) -> bool:
    """True when a blank record at ``pos`` closes the segment exactly."""
    if segment_size - pos < BLANK_RECORD.size:
        return False
    size, magic = BLANK_RECORD.unpack_from(buf, pos)
    return magic == BLANK_MAGIC and size == segment_size - pos

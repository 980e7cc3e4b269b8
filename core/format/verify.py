"""Checking a record before it is served: is it intact, and is it the one that was asked for?

A consume-queue unit or a key-index entry names a commit-log offset; what lies there is served
only when it is a well-formed record (``unpack_record``) whose CRC matches (the whole-record
``__CRC32#`` property when the record carries one, else the body CRC), that names
that offset, and, for a queue, that names the queue's topic, queue id and queue offset. Bit
rot, a zeroed page, a unit copied from another queue or a stale entry then read as corrupt,
never as a wrong message.
"""

from __future__ import annotations

from mqstore.errors import CorruptRecordError
from mqstore.format import record_crc
from mqstore.format.record import (
    HEADER_STRUCTS, MAGIC_V1, POS_SYSFLAG, RecordLayout, crc_problem, needs_record_crc,
    unpack_record,
)
from mqstore.hashing import zlib_crc32 as crc32

_new_layout = tuple.__new__
_CRC_BYTES, _ABSENT, _CARRIED = record_crc.RESERVED, record_crc.ABSENT, record_crc.CARRIED
_FIRST, _SECOND, _THIRD = record_crc.THIRDS
_MIN_V1 = HEADER_STRUCTS[0].size + 3  # an IPv4 header, a topic length byte, a properties length


def verify_record(raw, phys_offset: int, size: int | None = None,
                  crc_range: tuple[int, int] | None = None) -> RecordLayout:
    """The layout of the intact record ``raw`` read at ``phys_offset``; CorruptRecordError
    naming what is wrong otherwise. In the commit-log ``crc_range`` [lo, hi), every record
    must carry the record CRC (``commit_log.record_crc``; see ``store_meta``)."""
    try:
        lay = unpack_record(raw)
    except ValueError as exc:  # its message places the problem within ``raw``; say where
        reason = str(exc).removeprefix("record at 0: ")
        raise CorruptRecordError(f"record at commit-log offset {phys_offset}: {reason}") from None
    f = lay.fields
    if size is not None and f[0] != size:
        raise CorruptRecordError(f"record at commit-log offset {phys_offset} is {f[0]} bytes, "
                                 f"not the {size} its reference says")
    if f[6] != phys_offset:
        raise CorruptRecordError(f"record at commit-log offset {phys_offset} names offset {f[6]}")
    why = crc_problem(raw, lay, 0, needs_record_crc(crc_range, phys_offset, f[4]))
    if why is not None:
        raise CorruptRecordError(f"record at commit-log offset {phys_offset}: {why}")
    return lay


def check_queue_identity(raw, lay: RecordLayout, topic: bytes, queue_id: int,
                         queue_offset: int, phys_offset: int) -> None:
    """A consume-queue unit must lead to a record of its own queue, at its own offset."""
    f = lay.fields
    if f[3] != queue_id or f[5] != queue_offset or \
            bytes(raw[lay.topic_at:lay.topic_at + lay.topic_len]) != topic:
        found = bytes(raw[lay.topic_at:lay.topic_at + lay.topic_len]).decode("utf-8", "replace")
        raise CorruptRecordError(
            f"consume-queue unit {queue_offset} of {topic.decode()}/{queue_id} points at commit-log "
            f"offset {phys_offset}, which holds {found}/{f[3]} offset {f[5]}")


def verify_queue_record(raw, phys_offset: int, size: int, topic: bytes, queue_id: int,
                        queue_offset: int, crc_range: tuple[int, int] | None = None
                        ) -> RecordLayout:
    """``verify_record`` and ``check_queue_identity`` in one pass over the header: the pull's
    per-message path, so it parses each field once. ``raw`` is exactly ``size`` bytes. On any
    mismatch the slow path names the problem."""
    # The host-family bits decide the header's width: a damaged sysflag may promise IPv6
    # hosts that a small record has no room for, which the slow path reports.
    hs = HEADER_STRUCTS[(raw[POS_SYSFLAG + 3] >> 4) & 3] if size >= _MIN_V1 else None
    if hs is not None and size >= hs.size + 3:
        f = hs.unpack_from(raw)
        body_at = hs.size
        body_len = f[16]
        topic_len = len(topic)
        topic_at = body_at + body_len + 1
        props_at = topic_at + topic_len + 2
        if (f[0] == size and f[1] == MAGIC_V1 and f[6] == phys_offset and f[3] == queue_id
                and f[5] == queue_offset and body_len >= 0 and props_at <= size
                and raw[topic_at - 1] == topic_len
                and raw[topic_at:topic_at + topic_len] == topic
                and props_at + (raw[props_at - 2] << 8 | raw[props_at - 1]) == size):
            crc_at = size - _CRC_BYTES
            # record_crc.state's first test inlined (this runs once per message): most records
            # hold nothing like the record CRC property, not even a damaged one.
            crc_state = _ABSENT if crc_at < props_at or (
                raw[crc_at:crc_at + 3] != _FIRST and raw[crc_at + 3:crc_at + 6] != _SECOND
                and raw[crc_at + 6:crc_at + 9] != _THIRD
            ) else record_crc.state(raw, props_at, size)
            if (record_crc.intact(raw, 0, size) if crc_state == _CARRIED
                    else crc_state == _ABSENT
                    and (crc_range is None or not crc_range[0] <= phys_offset < crc_range[1])
                    and crc32(raw[body_at:body_at + body_len]) & 0x7FFFFFFF == f[2]):
                # tuple.__new__ skips the NamedTuple constructor's Python frame (a third of
                # this function's time on a small record).
                return _new_layout(RecordLayout,
                                   (f, body_at, topic_at, topic_len, props_at, size - props_at))
    # V2 records (long topics) and anything that failed above: the full checks, with reasons.
    lay = verify_record(raw, phys_offset, size, crc_range)
    check_queue_identity(raw, lay, topic, queue_id, queue_offset, phys_offset)
    return lay

"""Checking a record before it is served: is it intact, and is it the one that was asked for?

A consume-queue unit or a key-index entry names a commit-log offset; what lies there is served
only when it is a well-formed record (``unpack_record``) whose body CRC matches, that names
that offset, and, for a queue, that names the queue's topic, queue id and queue offset. Bit
rot, a zeroed page, a unit copied from another queue or a stale entry then read as corrupt,
never as a wrong message.
"""

from __future__ import annotations

from mqstore.errors import CorruptRecordError
from mqstore.format.record import RecordLayout, unpack_record
from mqstore.hashing import crc32


def verify_record(raw, phys_offset: int, size: int | None = None) -> RecordLayout:
    """The layout of the intact record ``raw`` read at ``phys_offset``; CorruptRecordError
    naming what is wrong otherwise."""
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
    if crc32(raw[lay.body_at:lay.body_at + f[16]]) != f[2]:
        raise CorruptRecordError(f"record at commit-log offset {phys_offset}: body CRC mismatch")
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

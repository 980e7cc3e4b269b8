"""Reading one message by its commit-log offset, checked: never wrong bytes."""

from __future__ import annotations

import struct

from mqstore.errors import CorruptRecordError
from mqstore.format.quarantine import QUARANTINE_FLAG, is_quarantine
from mqstore.format.record import MAGIC_V1, MAGIC_V2
from mqstore.format.verify import verify_record
from mqstore.message import StoredMessage

_HEAD = struct.Struct(">ii20xq")  # TOTALSIZE, MAGICCODE, PHYSICALOFFSET
_MAGICS = (MAGIC_V1, MAGIC_V2)


def read_message(commit_log, phys_offset: int) -> StoredMessage | None:
    """The message whose record starts at ``phys_offset``; None when no record starts there
    (or a quarantine record does); CorruptRecordError when one does but is damaged."""
    head = commit_log.read(phys_offset, _HEAD.size)
    if head is None:
        return None
    size, magic, named = _HEAD.unpack(head)
    if magic not in _MAGICS or named != phys_offset or size <= 0:
        return None
    raw = commit_log.read(phys_offset, size)
    if raw is None:
        raise CorruptRecordError(f"record at commit-log offset {phys_offset}: size {size} "
                                 f"runs past the readable end {commit_log.max_offset}")
    raw = bytes(raw)
    lay = verify_record(raw, phys_offset, size, commit_log.crc_range)
    f = lay.fields
    if f[4] == QUARANTINE_FLAG and is_quarantine(
            f[4], f[7], raw[lay.topic_at:lay.topic_at + lay.topic_len].decode("ascii", "replace")):
        return None
    return StoredMessage(raw, lay)

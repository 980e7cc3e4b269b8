"""Commit-log record: one message, packed back to back in the commit log, big-endian.

    +---------------------------+-------+----------------------------------------------+
    | field                     | bytes | note                                         |
    +---------------------------+-------+----------------------------------------------+
    | TOTALSIZE        int      |   4   | whole record, this field included            |
    | MAGICCODE        int      |   4   | V1 0xDAA320A7, V2 0xDAA320AB                 |
    | BODYCRC          int      |   4   | crc32(body) & 0x7FFFFFFF                     |
    | QUEUEID          int      |   4   |                                              |
    | FLAG             int      |   4   | producer's flag                              |
    | QUEUEOFFSET      long     |   8   | @20; 0 for prepared/rollback transactions    |
    | PHYSICALOFFSET   long     |   8   | @28; absolute commit-log offset              |
    | SYSFLAG          int      |   4   | @36; bits below                              |
    | BORNTIMESTAMP    long     |   8   | @40                                          |
    | BORNHOST         4+4|16+4 | 8|20  | address + int port; 16 bytes if SYSFLAG 0x10 |
    | STORETIMESTAMP   long     |   8   | @56 with an IPv4 born host, @68 with IPv6    |
    | STOREHOST        4+4|16+4 | 8|20  | 16-byte address if SYSFLAG 0x20              |
    | RECONSUMETIMES   int      |   4   |                                              |
    | PREPARED TX OFF  long     |   8   |                                              |
    | BODYLENGTH + BODY| 4 + n  |       |                                              |
    | TOPICLEN + TOPIC | 1|2 + n|       | V1: signed byte; V2: short                   |
    | PROPSLEN + PROPS | 2 + n  |       | short; UTF-8 properties string               |
    +---------------------------+-------+----------------------------------------------+
    total = 91 + body + topic + props   (V1, two IPv4 hosts; +12 per IPv6 host; V2 +1)

A segment that cannot hold the next record (``size + 8 > remaining``) ends with a blank
record: ``int remaining | int 0xCBD43194``; readers jump to the next segment.

The offset message id is ``hex(store address + int port + long physical offset)``, upper case.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from functools import lru_cache
from typing import NamedTuple

import numpy as np

from mqstore.errors import CorruptRecordError
from mqstore.format import record_crc
from mqstore.format.hosts import Host
from mqstore.hashing import crc32

MAGIC_V1 = -626843481  # 0xDAA320A7
MAGIC_V2 = -626843477  # 0xDAA320AB
BLANK_MAGIC = -875286124  # 0xCBD43194
END_FILE_MIN_BLANK_BYTES = 8
MAX_V1_TOPIC_BYTES = 127
MAX_TOPIC_BYTES = 255
MAX_INFLATED_BYTES = 256 << 20  # a compressed body larger than this once inflated is refused

SYSFLAG_COMPRESSED = 0x1
SYSFLAG_MULTI_TAGS = 0x2
SYSFLAG_TX_MASK = 0xC
TX_NOT = 0x0
TX_PREPARED = 0x4
TX_COMMIT = 0x8
TX_ROLLBACK = 0xC
SYSFLAG_BORNHOST_V6 = 0x10
SYSFLAG_STOREHOST_V6 = 0x20
SYSFLAG_NEED_UNWRAP = 0x40
SYSFLAG_INNER_BATCH = 0x80
SYSFLAG_COMPRESSION_MASK = 0x700
#: Bits a producer may set; the store owns the host-family bits.
SYSFLAG_USER_BITS = (
    SYSFLAG_COMPRESSED | SYSFLAG_MULTI_TAGS | SYSFLAG_TX_MASK | SYSFLAG_NEED_UNWRAP
    | SYSFLAG_COMPRESSION_MASK
)

POS_TOTAL_SIZE = 0
POS_MAGIC = 4
POS_BODY_CRC = 8
POS_QUEUE_ID = 12
POS_FLAG = 16
POS_QUEUE_OFFSET = 20
POS_PHYS_OFFSET = 28
POS_SYSFLAG = 36
POS_BORN_TIMESTAMP = 40
POS_BORN_HOST = 48

BLANK_RECORD = struct.Struct(">ii")
_SHORT = struct.Struct(">h")


def host_width(v6: bool) -> int:
    return 20 if v6 else 8


def store_timestamp_pos(sysflag: int) -> int:
    return POS_BORN_HOST + host_width(bool(sysflag & SYSFLAG_BORNHOST_V6))


def record_size(body_len: int, topic_len: int, props_len: int, *, v2: bool = False,
                born_v6: bool = False, store_v6: bool = False) -> int:
    return (
        91 + body_len + topic_len + props_len
        + (12 if born_v6 else 0) + (12 if store_v6 else 0) + (1 if v2 else 0)
    )


@lru_cache(maxsize=None)
def header_struct(born_v6: bool, store_v6: bool) -> struct.Struct:
    """TOTALSIZE .. BODYLENGTH for one pair of host families."""
    born = "16si" if born_v6 else "4si"
    store = "16si" if store_v6 else "4si"
    return struct.Struct(f">iiiiiqqiq{born}q{store}iqi")


@lru_cache(maxsize=None)
def header_dtype(born_v6: bool, store_v6: bool) -> np.dtype:
    """The same header as a packed numpy record, for encoding a batch column by column."""
    born = 16 if born_v6 else 4
    store = 16 if store_v6 else 4
    fields = [
        ("total_size", ">i4"), ("magic", ">i4"), ("body_crc", ">i4"), ("queue_id", ">i4"),
        ("flag", ">i4"), ("queue_offset", ">i8"), ("phys_offset", ">i8"), ("sysflag", ">i4"),
        ("born_timestamp", ">i8"), ("born_addr", f"V{born}"), ("born_port", ">i4"),
        ("store_timestamp", ">i8"), ("store_addr", f"V{store}"), ("store_port", ">i4"),
        ("reconsume_times", ">i4"), ("prepared_tx_offset", ">i8"), ("body_len", ">i4"),
    ]
    dt = np.dtype(fields)  # numpy packs fields without padding by default
    assert dt.itemsize == header_struct(born_v6, store_v6).size
    return dt


@lru_cache(maxsize=64)
def record_dtype(born_v6: bool, store_v6: bool, body_len: int, tail_len: int) -> np.dtype:
    """A whole record with a body of ``body_len`` bytes and a tail (TOPICLENGTH .. PROPERTIES)
    of ``tail_len``, as a packed numpy record: a batch of records alike is one array of them."""
    fields = header_dtype(born_v6, store_v6).descr
    if body_len:
        fields = fields + [("body", f"S{body_len}")]  # stored as given; NULs are never cut
    dt = np.dtype(fields + [("tail", f"V{tail_len}")])
    assert dt.itemsize == header_struct(born_v6, store_v6).size + body_len + tail_len
    return dt


def topic_field(topic: bytes, v2: bool) -> bytes:
    """TOPICLENGTH + TOPIC for the chosen version."""
    return (_SHORT.pack(len(topic)) if v2 else bytes((len(topic),))) + topic


def properties_field(props: bytes) -> bytes:
    return _SHORT.pack(len(props)) + props


def encode_blank(remaining: int) -> bytes:
    return BLANK_RECORD.pack(remaining, BLANK_MAGIC)


def offset_msg_id(store: Host, phys_offset: int) -> str:
    return (store.address + struct.pack(">iq", store.port, phys_offset)).hex().upper()


def parse_offset_msg_id(msg_id: str) -> tuple[Host, int]:
    """Inverse of :func:`offset_msg_id`; raises ValueError naming the id."""
    try:
        raw = bytes.fromhex(msg_id)
    except (TypeError, ValueError):
        raise ValueError(f"msg id {msg_id!r} is not a hex string") from None
    if len(raw) not in (16, 28):
        raise ValueError(
            f"msg id {msg_id!r} must be 32 (IPv4) or 56 (IPv6) hex characters, got {len(msg_id)}"
        )
    port, offset = struct.unpack_from(">iq", raw, len(raw) - 12)
    return Host(raw[:-12], port), offset


class RecordHead(NamedTuple):
    """What dispatch and recovery need from a record, without decoding the body."""

    phys_offset: int
    size: int
    queue_id: int
    queue_offset: int
    sysflag: int
    store_timestamp: int
    topic: str
    properties: bytes


# Scan outcomes: (kind, size, head)
SCAN_OK = 0
SCAN_BLANK = 1
SCAN_BAD = 2


# The FLAG of the quarantine records recovery writes over damaged bytes
# (``format.quarantine``): they carry no properties, so no record CRC either.
QUARANTINE_FLAG = 0x51524E54


def needs_record_crc(crc_range: tuple[int, int] | None, phys_offset: int | None,
                     flag: int) -> bool:
    """Whether the record at ``phys_offset`` must carry the record CRC: in ``crc_range``
    (where the store wrote it into every record) and not a quarantine record."""
    return (crc_range is not None and phys_offset is not None
            and crc_range[0] <= phys_offset < crc_range[1] and flag != QUARANTINE_FLAG)


def crc_problem(buf, lay: RecordLayout, start: int = 0, required: bool = False) -> str | None:
    """What is wrong with the CRC of the record ``lay`` (starting at ``start`` of ``buf``), or
    None: the whole-record CRC when the record carries one (it must when ``required``), else
    the body's."""
    end = start + lay.fields[0]
    crc_state = record_crc.state(buf, lay.props_at, end)
    if crc_state == record_crc.DAMAGED:
        return "record CRC property damaged"
    if crc_state == record_crc.CARRIED:
        return None if record_crc.intact(buf, start, end) else "record CRC mismatch"
    if required:
        return "record CRC property missing"
    if crc32(buf[lay.body_at:lay.body_at + lay.fields[16]]) != lay.fields[2]:
        return "body CRC mismatch"
    return None


def scan_record(buf, pos: int, limit: int, check_crc: bool, expected_phys: int | None = None,
                crc_range: tuple[int, int] | None = None):
    """Validate the record at ``buf[pos:]`` (``limit`` = end of readable data).

    Returns ``(SCAN_OK, size, RecordHead)``, ``(SCAN_BLANK, size, None)`` or
    ``(SCAN_BAD, reason, None)``; never raises on damaged bytes. A record is bad when it is cut
    off, has an unknown magic, its lengths do not add up to TOTALSIZE, its CRC is wrong
    (``check_crc``: the whole-record ``__CRC32#`` property when it carries one, else the
    body's; in ``crc_range`` every record must carry the property), or its stored physical
    offset is not where it lies (``expected_phys``): stale bytes past a torn tail.
    """
    if pos < 0:
        return SCAN_BAD, f"position {pos} is before the start of the data", None
    remaining = min(limit, len(buf)) - pos
    if remaining <= 4:
        return SCAN_BAD, "cut off before the size field", None
    if remaining < 8:
        return SCAN_BAD, "cut off before the magic field", None
    total, magic = BLANK_RECORD.unpack_from(buf, pos)
    if magic == BLANK_MAGIC:
        return SCAN_BLANK, total, None
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        return SCAN_BAD, f"unknown magic {magic & 0xFFFFFFFF:#010x}", None
    if total > remaining:
        return SCAN_BAD, f"size {total} does not fit the {remaining} readable bytes", None
    try:
        lay = unpack_record(buf, pos, pos + total)
    except ValueError as exc:
        return SCAN_BAD, str(exc), None
    f = lay.fields
    if expected_phys is not None and f[6] != expected_phys:
        return SCAN_BAD, f"physical offset field {f[6]} != position {expected_phys}", None
    if check_crc:
        why = crc_problem(buf, lay, pos, needs_record_crc(crc_range, expected_phys, f[4]))
        if why is not None:
            return SCAN_BAD, why, None
    try:
        topic = bytes(buf[lay.topic_at:lay.topic_at + lay.topic_len]).decode("utf-8")
    except UnicodeDecodeError:
        return SCAN_BAD, "topic is not UTF-8", None
    return SCAN_OK, total, RecordHead(
        f[6], total, f[3], f[5], f[7], f[11], topic,
        bytes(buf[lay.props_at:lay.props_at + lay.props_len]),
    )


#: Header structs indexed by ``(sysflag >> 4) & 3`` (bit 0x10 born v6, bit 0x20 store v6).
HEADER_STRUCTS = tuple(header_struct(bool(i & 1), bool(i & 2)) for i in range(4))
_SYSFLAG_AT = struct.Struct(">i")


class RecordLayout(NamedTuple):
    """A validated record: its header fields and where its variable parts lie."""

    fields: tuple  # TOTALSIZE .. BODYLENGTH, as header_struct unpacks them
    body_at: int
    topic_at: int
    topic_len: int
    props_at: int
    props_len: int


def checked_layout(raw) -> RecordLayout:
    """The layout of ``raw``, a whole V1 record that has passed ``verify_queue_record``'s
    checks (or a pull's own, to the same effect): read, not checked again."""
    hs = HEADER_STRUCTS[(raw[POS_SYSFLAG + 3] >> 4) & 3]
    f = hs.unpack_from(raw)
    body_at = hs.size
    topic_at = body_at + f[16] + 1
    topic_len = raw[topic_at - 1]
    props_at = topic_at + topic_len + 2
    return tuple.__new__(RecordLayout,  # no NamedTuple constructor frame
                         (f, body_at, topic_at, topic_len, props_at, f[0] - props_at))


def unpack_record(buf, pos: int = 0, limit: int | None = None) -> RecordLayout:
    """Parse and check the record at ``pos``: known magic, lengths that add up to TOTALSIZE.

    ``limit`` (the end of readable data) is capped at the buffer's end. The body CRC is not
    checked (recovery does that). Raises CorruptRecordError (a ValueError) naming the problem
    and the record's position; ValueError for a ``pos`` outside the buffer.
    """
    size = len(buf)
    limit = size if limit is None else min(limit, size)
    if not 0 <= pos <= size:
        raise ValueError(f"record position {pos} is outside the {size}-byte buffer")
    if limit - pos < 91:
        raise CorruptRecordError(f"record at {pos}: only {limit - pos} bytes readable, "
                                 f"a record needs at least 91")
    sysflag = _SYSFLAG_AT.unpack_from(buf, pos + POS_SYSFLAG)[0]
    hs = HEADER_STRUCTS[(sysflag >> 4) & 3]
    if limit - pos < hs.size + 3:
        raise CorruptRecordError(f"record at {pos}: only {limit - pos} bytes readable, the "
                                 f"header alone needs {hs.size + 3} (sysflag {sysflag:#x})")
    f = hs.unpack_from(buf, pos)
    total, magic = f[0], f[1]
    if magic != MAGIC_V1 and magic != MAGIC_V2:
        raise CorruptRecordError(f"record at {pos}: unknown magic {magic & 0xFFFFFFFF:#010x}")
    end = pos + total
    if total < hs.size + 3 or end > limit:
        raise CorruptRecordError(f"record at {pos}: size {total} does not fit {limit - pos} "
                                 f"bytes")
    body_at = pos + hs.size
    at = body_at + f[16]
    v1 = magic == MAGIC_V1
    if f[16] < 0 or at + (3 if v1 else 4) > end:
        raise CorruptRecordError(f"record at {pos}: body length {f[16]} overruns the record")
    if v1:
        topic_len = buf[at]
        topic_at = at + 1
    else:
        topic_len = _SHORT.unpack_from(buf, at)[0]
        topic_at = at + 2
    props_at = topic_at + topic_len + 2
    top = 127 if v1 else 32767
    if not 0 <= topic_len <= top or props_at > end:
        raise CorruptRecordError(f"record at {pos}: topic length {topic_len} at {at} is outside "
                                 f"[0, {top}] or overruns the record")
    props_len = _SHORT.unpack_from(buf, props_at - 2)[0]
    if props_len < 0 or props_at + props_len != end:
        raise CorruptRecordError(f"record at {pos}: properties length {props_len} at "
                                 f"{props_at - 2}: lengths do not add up to TOTALSIZE {total}")
    return RecordLayout(f, body_at, topic_at, topic_len, props_at, props_len)


@dataclass(frozen=True, slots=True)
class DecodedRecord:
    """Every field of one record, as stored."""

    size: int
    magic: int
    body_crc: int
    queue_id: int
    flag: int
    queue_offset: int
    phys_offset: int
    sysflag: int
    born_timestamp: int
    born_host: Host
    store_timestamp: int
    store_host: Host
    reconsume_times: int
    prepared_tx_offset: int
    body: bytes
    topic: str
    properties_text: str


def decode_record(buf, pos: int = 0) -> DecodedRecord:
    """Decode the record at ``pos``; raises CorruptRecordError (a ValueError) when it is not a
    well-formed record."""
    lay = unpack_record(buf, pos)
    f = lay.fields
    raw_topic = bytes(buf[lay.topic_at:lay.topic_at + lay.topic_len])
    try:
        topic = raw_topic.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CorruptRecordError(f"record at {pos}: topic {raw_topic[:80]!r} at {lay.topic_at} "
                                 f"is not UTF-8 ({exc.reason} at byte {exc.start})") from None
    return DecodedRecord(
        size=f[0], magic=f[1], body_crc=f[2], queue_id=f[3], flag=f[4], queue_offset=f[5],
        phys_offset=f[6], sysflag=f[7], born_timestamp=f[8], born_host=Host(f[9], f[10]),
        store_timestamp=f[11], store_host=Host(f[12], f[13]), reconsume_times=f[14],
        prepared_tx_offset=f[15], body=bytes(buf[lay.body_at:lay.body_at + f[16]]),
        topic=topic,
        properties_text=bytes(buf[lay.props_at:lay.props_at + lay.props_len]).decode(
            "utf-8", errors="replace"),
    )


def encode_record(
    *, queue_id: int, flag: int, queue_offset: int, phys_offset: int, sysflag: int,
    born_timestamp: int, born_host: Host, store_timestamp: int, store_host: Host,
    reconsume_times: int, prepared_tx_offset: int, body: bytes, topic: bytes,
    properties: bytes, v2: bool = False, body_crc: int | None = None,
) -> bytes:
    """Encode one complete record. The store's append path uses the same layout in batches."""
    born_v6 = born_host.is_v6
    store_v6 = store_host.is_v6
    sysflag = (sysflag & ~(SYSFLAG_BORNHOST_V6 | SYSFLAG_STOREHOST_V6)) | (
        SYSFLAG_BORNHOST_V6 if born_v6 else 0) | (SYSFLAG_STOREHOST_V6 if store_v6 else 0)
    tail = topic_field(topic, v2) + properties_field(properties)
    total = header_struct(born_v6, store_v6).size + len(body) + len(tail)
    header = header_struct(born_v6, store_v6).pack(
        total, MAGIC_V2 if v2 else MAGIC_V1, crc32(body) if body_crc is None else body_crc,
        queue_id, flag, queue_offset, phys_offset, sysflag, born_timestamp,
        born_host.address, born_host.port, store_timestamp, store_host.address, store_host.port,
        reconsume_times, prepared_tx_offset, len(body),
    )
    return b"".join((header, body, tail))


def decompress_body(body: bytes, sysflag: int, offset: int | None = None) -> bytes:
    """Uncompressed body of a COMPRESSED record (zlib is RocketMQ's default and 0x300).

    Raises ValueError for an unsupported compression type and CorruptRecordError (a
    ValueError) for a body that does not inflate; ``offset``, the record's commit-log offset
    when the caller knows it, is named in the message.
    """
    if not sysflag & SYSFLAG_COMPRESSED:
        return body
    where = f"record at {offset}: " if offset is not None else ""
    kind = sysflag & SYSFLAG_COMPRESSION_MASK
    if kind not in (0, 0x300):
        raise ValueError(f"{where}compression type {kind:#x} (sysflag {sysflag:#x}) is not "
                         f"supported")
    inflater = zlib.decompressobj()
    try:
        out = inflater.decompress(body, MAX_INFLATED_BYTES)
    except zlib.error as exc:
        raise CorruptRecordError(f"{where}compressed body of {len(body)} bytes (sysflag "
                                 f"{sysflag:#x}) is not a zlib stream: {exc}") from None
    if inflater.unconsumed_tail:  # a deflate bomb, or damage that reads as one
        raise CorruptRecordError(f"{where}compressed body of {len(body)} bytes inflates past "
                                 f"{MAX_INFLATED_BYTES} bytes")
    return out

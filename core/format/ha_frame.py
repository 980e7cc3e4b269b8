"""RocketMQ's HA (master/slave replication) wire format, as RocketMQ 4.9.8 speaks it.

Master to slave, one frame per run of commit-log bytes (big-endian):

    +---------------------------+------------------+--------------------------------+
    | phys offset  long (8)     | size  int (4)    | size bytes of the commit log   |
    +---------------------------+------------------+--------------------------------+
      = 12 + size bytes; size 0 is a heartbeat (phys offset = the next byte to send)

Slave to master, one report per acknowledgement:

    +---------------------------+
    | max offset  long (8)      |   the end of the slave's commit log
    +---------------------------+

mqstore's status frames, to an mqstore slave that sent node fields in mqstore's handshake
(``format.ha_hello``, NOTE [ Node fields ]) and to no other: a frame at offset -1 whose bytes
are node fields (the master's role, log end and confirm offset; its client endpoint), sent
when they change. A RocketMQ slave is never sent one.

Rules the bytes carry: a frame holds at most ``TRANSFER_BATCH_BYTES`` (``haTransferBatchSize``)
and never crosses a segment end; the master reads reports in multiples of 8 and keeps the last
complete one; the first report says where the master starts (0: an empty slave, which starts at
the master's last segment). Nothing here does I/O: the decoders take bytes as they arrive, in
chunks of any size, and bound what a peer can make them hold.
"""

from __future__ import annotations

import struct
from typing import NamedTuple

FRAME_HEADER = struct.Struct(">qi")
FRAME_HEADER_BYTES = FRAME_HEADER.size  # 12
REPORT = struct.Struct(">q")
REPORT_BYTES = REPORT.size  # 8
TRANSFER_BATCH_BYTES = 32 * 1024  # RocketMQ's haTransferBatchSize
# RocketMQ's slave reads into a 4 MiB buffer: a longer frame can never arrive whole there, so
# none is accepted here either (and a garbage size field cannot make a slave hold more).
FRAME_MAX_BYTES = 4 << 20
OFFSET_MAX = (1 << 63) - 1
STATUS_OFFSET = -1  # mqstore's status frame
STATUS_MAX_BYTES = 4096


class FrameError(ValueError):
    """Bytes that are not RocketMQ's HA protocol: the connection is dropped."""


class Frame(NamedTuple):
    phys_offset: int
    body: bytes  # empty for a heartbeat


def encode_header(phys_offset: int, size: int) -> bytes:
    """The 12-byte header of a frame of ``size`` bytes copied from ``phys_offset``."""
    if phys_offset < 0 or not 0 <= size <= FRAME_MAX_BYTES:
        raise ValueError(f"frame at offset {phys_offset} of {size} bytes: the offset must be "
                         f">= 0 and the size 0..{FRAME_MAX_BYTES}")
    return FRAME_HEADER.pack(phys_offset, size)


def encode_status(fields: bytes) -> bytes:
    """An mqstore status frame carrying ``fields`` (``ha_hello.encode_fields``)."""
    if len(fields) > STATUS_MAX_BYTES:
        raise ValueError(f"a status frame carries at most {STATUS_MAX_BYTES} bytes")
    return FRAME_HEADER.pack(STATUS_OFFSET, len(fields)) + fields


def encode_report(max_offset: int) -> bytes:
    """A slave's 8-byte offset report."""
    if not 0 <= max_offset <= OFFSET_MAX:
        raise ValueError(f"offset report {max_offset} must be 0..2**63-1")
    return REPORT.pack(max_offset)


class FrameDecoder:
    """The master's stream as frames, whatever chunks it arrives in. Holds at most one
    header and one body (``max_body_bytes``); a header outside the rules raises FrameError.
    ``status_frames``: frames at ``STATUS_OFFSET`` (of at most ``STATUS_MAX_BYTES``) are
    mqstore's status frames, returned with that offset (only a slave that asked for them)."""

    def __init__(self, max_body_bytes: int = FRAME_MAX_BYTES, *,
                 status_frames: bool = False) -> None:
        self.max_body_bytes = max_body_bytes
        self.status_frames = status_frames
        self._buf = bytearray()
        self._need: tuple[int, int] | None = None  # header read: (offset, size)

    @property
    def buffered(self) -> int:
        """Bytes held that do not make a whole frame yet."""
        return len(self._buf)

    def feed(self, data) -> list[Frame]:
        buf = self._buf
        buf += data
        frames = []
        at = 0
        while True:
            if self._need is None:
                if len(buf) - at < FRAME_HEADER_BYTES:
                    break
                offset, size = FRAME_HEADER.unpack_from(buf, at)
                status = (self.status_frames and offset == STATUS_OFFSET
                          and 0 <= size <= STATUS_MAX_BYTES)
                if not status and (offset < 0 or size < 0 or size > self.max_body_bytes):
                    raise FrameError(
                        f"frame header (offset {offset}, size {size}) breaks the HA protocol: "
                        f"offsets are >= 0 and a frame carries 0..{self.max_body_bytes} bytes")
                at += FRAME_HEADER_BYTES
                self._need = (offset, size)
            offset, size = self._need
            if len(buf) - at < size:
                break
            frames.append(Frame(offset, bytes(buf[at:at + size])))
            at += size
            self._need = None
        del buf[:at]
        return frames


class ReportDecoder:
    """A slave's reports, read as RocketMQ's master reads them: in whole 8-byte longs, the
    last complete one wins. Holds at most 7 bytes between calls."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data) -> int | None:
        """The last complete report in the stream so far, or None when no new one ended;
        FrameError for a negative one (no commit log has a negative end)."""
        buf = self._buf
        buf += data
        whole = len(buf) - len(buf) % REPORT_BYTES
        if not whole:
            return None
        (offset,) = REPORT.unpack_from(buf, whole - REPORT_BYTES)
        del buf[:whole]
        if offset < 0:
            raise FrameError(f"offset report {offset} breaks the HA protocol: a commit-log "
                             f"offset is >= 0")
        return offset


def first_transfer_offset(requested: int, max_offset: int, min_offset: int,
                          segment_bytes: int, from_first_segment: bool = False) -> int:
    """Where a master starts sending to a slave whose first report is ``requested``: there,
    unless the slave is empty (0): then at the start of the master's last segment, as
    RocketMQ does (``maxOffset - maxOffset % segmentSize``), or with ``from_first_segment`` at
    the first byte it still stores."""
    if requested:
        return requested
    if from_first_segment:
        return max(min_offset, 0)
    return max(0, max_offset - max_offset % segment_bytes)


__all__ = ["FRAME_HEADER", "FRAME_HEADER_BYTES", "REPORT", "REPORT_BYTES", "TRANSFER_BATCH_BYTES",
           "FRAME_MAX_BYTES", "STATUS_OFFSET", "STATUS_MAX_BYTES", "FrameError", "Frame",
           "encode_header", "encode_status", "encode_report",
           "FrameDecoder", "ReportDecoder", "first_transfer_offset"]

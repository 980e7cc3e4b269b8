"""Consume-queue extension files: ``consumequeue_ext/<topic>/<queueId>/<20-digit offset>``.

Append-only units (layout in ``format.cq_ext``) that consume-queue units point to when they
carry more than a tag hash (here: the bloom bitmap of registered SQL92 subscriptions). A unit
never straddles files: when one does not fit, ``short -1`` ends the file and the unit starts
the next one. Written by dispatch only; readers resolve addresses column-wise.
"""

from __future__ import annotations

import os
import struct

import numpy as np

from mqstore.format.cq_ext import BLOOM_BYTES, END_OF_FILE, EXT_HEAD_SIZE, from_address, to_address
from mqstore.storage.segment_queue import SegmentQueue

CONSUME_QUEUE_EXT_DIR = "consumequeue_ext"
_SHORT = struct.Struct(">h")
UNIT_BYTES = EXT_HEAD_SIZE + BLOOM_BYTES
_UNIT_RANGE = np.arange(UNIT_BYTES)


class ConsumeQueueExt:
    def __init__(self, root: str, topic: str, queue_id: int, file_bytes: int | None, *,
                 read_only: bool = False) -> None:
        self.directory = os.path.join(root, CONSUME_QUEUE_EXT_DIR, topic, str(queue_id))
        self.segments = SegmentQueue(self.directory, file_bytes, read_only=read_only,
                                     growing=False)
        self._u8: dict[int, np.ndarray] = {}

    def load(self) -> None:
        """Map the files; each file's end is after its last unit (size <= 0 ends a file)."""
        self.segments.load()
        for seg in self.segments.segments:
            pos = 0
            readable = seg.data_end()  # a sparse file's holes are not read (MappedFile.data_end)
            while pos + 2 <= readable:
                size = _SHORT.unpack_from(seg.mm, pos)[0]
                if size == END_OF_FILE:
                    pos = seg.size
                    break
                if size < EXT_HEAD_SIZE or pos + size > seg.size:
                    break
                pos += size
            seg.wrote = seg.flushed = pos

    def append(self, unit: bytes) -> int:
        """Write one unit; returns its address for the consume-queue unit."""
        seg = self.segments.last()
        if seg is None or seg.size - seg.wrote - 4 < len(unit):
            if seg is not None:
                if seg.size - seg.wrote >= 2:
                    seg.write(_SHORT.pack(END_OF_FILE))
                seg.wrote = seg.size
            seg = self.segments.create_next()
            if seg.size - 4 < len(unit):
                raise ValueError(f"extension unit of {len(unit)} bytes exceeds file size {seg.size}")
        pos = seg.write(unit)
        return to_address(seg.start + pos)

    def _bytes(self, seg) -> np.ndarray:
        arr = self._u8.get(seg.start)
        if arr is None:
            arr = self._u8[seg.start] = np.frombuffer(seg.mm, dtype=np.uint8)
        return arr

    def resolve(self, addresses: np.ndarray):
        """``(present, tags_codes, store_times, bitmaps)`` for extension addresses.

        ``present`` is False where the unit cannot be read (then RocketMQ lets the message
        through to the exact check); bitmaps are ``n x BLOOM_BYTES`` uint8 rows.
        """
        offsets = from_address(addresses)
        n = len(offsets)
        present = np.zeros(n, dtype=bool)
        tags = np.zeros(n, dtype=np.int64)
        times = np.zeros(n, dtype=np.int64)
        bitmaps = np.zeros((n, BLOOM_BYTES), dtype=np.uint8)
        size = self.segments.segment_bytes
        if size is None or not n:
            return present, tags, times, bitmaps
        if offsets.max() >= self.segments.max_offset and self.segments.refresh():
            self._u8.clear()
        starts = offsets - offsets % size
        first, last = int(starts.min()), int(starts.max())
        for start in (first,) if first == last else np.unique(starts).tolist():
            seg = self.segments.find(start)
            if seg is None:
                continue
            rows = (np.arange(n) if first == last
                    else np.flatnonzero((offsets >= start) & (offsets < start + size)))
            at = offsets[rows] - start
            ok = at + UNIT_BYTES <= seg.size
            rows, at = rows[ok], at[ok]
            span = int(at[-1] - at[0]) if len(at) else -1
            if span == (len(at) - 1) * UNIT_BYTES and (np.diff(at) == UNIT_BYTES).all():
                # Units of one queue are appended back to back: the window is one slice.
                base = int(at[0])
                units = self._bytes(seg)[base:base + len(at) * UNIT_BYTES].reshape(-1, UNIT_BYTES)
            else:  # one gather of whole units, then typed views of its columns
                units = self._bytes(seg)[at[:, None] + _UNIT_RANGE]
            unit_size = units[:, 0:2].copy().view(">i2").ravel()
            blen = units[:, 18:20].copy().view(">i2").ravel()
            good = (unit_size >= EXT_HEAD_SIZE) & (blen == BLOOM_BYTES)
            rows, units = rows[good], units[good]
            present[rows] = True
            tags[rows] = units[:, 2:10].copy().view(">i8").ravel()
            times[rows] = units[:, 10:18].copy().view(">i8").ravel()
            bitmaps[rows] = units[:, EXT_HEAD_SIZE:UNIT_BYTES]
        return present, tags, times, bitmaps

    def flush(self) -> None:
        self.segments.flush()

    def close(self) -> None:
        self._u8.clear()
        self.segments.close()


def open_ext(root: str, topic: str, queue_id: int, file_bytes: int, *, read_only: bool,
             create: bool) -> ConsumeQueueExt | None:
    """A queue's extension, or None when it has none and ``create`` is False."""
    ext = ConsumeQueueExt(root, topic, queue_id, None if read_only else file_bytes,
                          read_only=read_only)
    if not os.path.isdir(ext.directory) and not create:
        return None
    ext.load()
    if ext.segments.segment_bytes is None:
        ext.segments.segment_bytes = file_bytes
    return ext

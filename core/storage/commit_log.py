"""The commit log: every message of every topic, appended to one segmented byte stream.

Records are laid out by :mod:`mqstore.format.record`. A record (or a batch written as one
block) never straddles segments: when ``size + 8 > remaining`` the segment is closed with a
blank record and the block starts at offset 0 of the next segment.

Appends happen under the store's put lock (single writer); reads only touch ``[min, max)``.
"""

from __future__ import annotations

from mqstore.format.record import (
    END_FILE_MIN_BLANK_BYTES, SCAN_BLANK, SCAN_OK, encode_blank, scan_record,
)
from mqstore.storage.mapped_file import MappedFile
from mqstore.storage.segment_queue import SegmentQueue


class BlockTooLargeError(ValueError):
    pass


def _before_roll(writer) -> None:
    if writer is not None:
        writer.before_roll()


class CommitLog:
    def __init__(self, directory: str, segment_bytes: int | None, *, read_only: bool = False,
                 on_warning=None, known_bytes: int | None = None) -> None:
        self.segments = SegmentQueue(directory, segment_bytes, read_only=read_only,
                                     on_warning=on_warning, known_bytes=known_bytes)
        self._followed: int | None = None  # a follower's checked end (see follow_tail)
        # [lo, hi): every record there carries the record CRC (store_meta), so one without it
        # had it destroyed. A writer's range is open-ended; a reader's ends where the log ended
        # when it read mqstore.json, since a later writer may have turned the setting off.
        self.crc_range: tuple[int, int] | None = None

    @property
    def segment_bytes(self) -> int:
        return self.segments.segment_bytes

    @property
    def min_offset(self) -> int:
        return self.segments.min_offset

    @property
    def max_offset(self) -> int:
        return self.segments.max_offset

    def load(self) -> list[str]:
        return self.segments.load()

    # -- writing (caller holds the put lock) -----------------------------------------------
    def reserve_locked(self, nbytes: int, writer=None) -> MappedFile:
        """Segment whose write position can take ``nbytes`` now, rolling if needed, with the
        blocks for them and for the blank that may close the segment after them reserved.

        ``writer`` (a commit-log writer plugin) writes the blank record and is asked first
        whether it can take a new segment, so a refused roll changes nothing. A reservation
        the file system refuses raises DiskFullError before anything is written.
        """
        limit = self.segments.segment_bytes - END_FILE_MIN_BLANK_BYTES
        if nbytes > limit:
            raise BlockTooLargeError(
                f"{nbytes} bytes cannot fit in one commit-log segment of "
                f"{self.segments.segment_bytes} bytes (at most {limit} per block)"
            )
        seg = self.segments.last()
        roll = seg is None or seg.is_full() or nbytes + END_FILE_MIN_BLANK_BYTES > seg.remaining
        if not roll:
            # Whatever copies the block (the map, or the transient pool's commit in the flush
            # worker) writes only into blocks that exist by now.
            seg.reserve_span(seg.wrote, seg.wrote + nbytes + END_FILE_MIN_BLANK_BYTES)
            return seg
        _before_roll(writer)
        if seg is not None and not seg.is_full():
            self.close_segment_locked(seg, writer)
        return self.segments.create_next(reserve=nbytes + END_FILE_MIN_BLANK_BYTES)

    def reserve_blocks_locked(self, sizes: list[int], writer=None) -> list[MappedFile]:
        """Segments for consecutive blocks, each of which fills at most one fresh segment: the
        first block where ``reserve_locked`` puts it, every later one at the start of a segment
        created now. Nothing is written into them yet (the caller writes each block, then
        closes its segment with ``close_segment_locked`` before the next), but the blocks of
        every block and blank are reserved. If a segment cannot be created, those created
        here are closed again and the error is raised, so a refused batch leaves a log every
        reader can walk."""
        segs = [self.reserve_locked(sizes[0], writer)]
        try:
            for size in sizes[1:]:
                _before_roll(writer)
                segs.append(self.segments.create_next(reserve=size + END_FILE_MIN_BLANK_BYTES))
        except BaseException:
            self.abandon_locked(segs, writer)
            raise
        return segs

    def abandon_locked(self, segs: list[MappedFile], writer=None) -> None:
        """Close every segment of ``segs`` that holds nothing and is not the log's last with a
        blank at its start: readers then step over it as over any closed segment."""
        last = self.segments.last()
        for seg in segs:
            if seg.wrote == 0 and seg is not last:
                self.close_segment_locked(seg, writer)

    def close_segment_locked(self, seg: MappedFile, writer=None) -> None:
        """End ``seg`` with a blank record over its remaining bytes. Only the blank's header
        is written (its blocks reserved with the block before it): the rest stays a hole."""
        blank = encode_blank(seg.remaining)
        seg.reserve_span(seg.wrote, seg.wrote + len(blank))
        if writer is None:
            seg.write(blank)
        else:
            writer.write_blank(seg, blank)
        seg.wrote = seg.size

    # -- copying another log's bytes (a replication slave; caller holds the put lock) --------
    def append_at_locked(self, phys_offset: int, data, writer=None) -> int:
        """Append bytes already encoded elsewhere (a master's records, checked by the
        caller) at ``phys_offset``, which must be where this log ends; an empty log starts
        its first segment there. The bytes must fit the segment holding ``phys_offset``.
        Returns the new end. ValueError, with nothing written, when they do not belong there;
        OSError when a segment cannot be created."""
        seg = self._segment_at_locked(phys_offset, len(data), writer)
        if writer is None:
            seg.write(data)
        else:
            writer.write(seg, data)
        return seg.start + seg.wrote

    def close_at_locked(self, phys_offset: int, writer=None) -> int:
        """End the segment holding ``phys_offset`` (where this log ends, as for
        ``append_at_locked``) with a blank record there, as a master's log ends it; returns
        the new end (the segment's)."""
        seg = self._segment_at_locked(phys_offset, 0, writer)
        self.close_segment_locked(seg, writer)
        return seg.end

    def _segment_at_locked(self, phys_offset: int, nbytes: int, writer):
        """The segment whose write position is ``phys_offset``, created when the log is
        empty or its last segment full; ValueError when ``nbytes`` from ``phys_offset`` do
        not continue the log within one segment."""
        segq = self.segments
        size = segq.segment_bytes
        end = segq.write_end
        if end == 0:
            if phys_offset % size:
                raise ValueError(f"an empty commit log starts at a segment boundary (a "
                                 f"multiple of {size}), not at {phys_offset}")
        elif phys_offset != end:
            raise ValueError(f"bytes for commit-log offset {phys_offset} cannot be appended: "
                             f"the log ends at {end}")
        if phys_offset % size + nbytes > size:
            raise ValueError(f"{nbytes} bytes at commit-log offset {phys_offset} cross the "
                             f"end of its {size}-byte segment")
        if end == 0:
            while segq.segments:  # segments with nothing written (an interrupted first put)
                segq.drop_last()
        seg = segq.last()
        if seg is None or seg.is_full():
            _before_roll(writer)
            return segq.create_next(phys_offset, reserve=nbytes)
        # The bytes to come get their blocks first (DiskFullError, nothing written).
        seg.reserve_span(seg.wrote, seg.wrote + nbytes)
        return seg

    def fill_closed(self, phys_offset: int, data) -> None:
        """Copy bytes into the span a blank record closed (after its 8-byte header), where a
        master's log holds something else than zeros."""
        seg = self.segments.find(phys_offset)
        if seg is None or not seg.is_full() or phys_offset + len(data) > seg.end:
            raise ValueError(f"commit-log offset {phys_offset} is in no closed segment")
        seg.overwrite(phys_offset - seg.start, data)

    # -- reading ---------------------------------------------------------------------------
    def read_span(self, phys_offset: int, max_bytes: int) -> bytes | None:
        """Up to ``max_bytes`` readable bytes from ``phys_offset`` to the end of what its
        segment holds (never past the readable end of the log), copied; None when none are
        readable there now (past the end, or in no segment)."""
        end = self.segments.max_offset
        seg = self.segments.find(phys_offset)
        if seg is None or phys_offset >= end:
            return None
        stop = min(seg.start + seg.committed, end, phys_offset + max_bytes)
        if stop <= phys_offset:
            return None
        try:
            return bytes(seg.view[phys_offset - seg.start:stop - seg.start])
        except ValueError:  # cleanup closed the segment since the lookup: it is gone
            return None

    def read(self, phys_offset: int, size: int) -> memoryview | None:
        """Bytes ``[phys_offset, +size)`` if they lie within one segment's readable data."""
        seg = self.segments.find(phys_offset)
        if seg is None:
            return None
        at = phys_offset - seg.start
        if at + size > seg.committed or size <= 0:
            return None
        try:
            return seg.view[at:at + size]
        except ValueError:  # cleanup closed the segment since the lookup: it is gone
            return None

    # Records a follower checks per look: one far behind catches up over several looks.
    _FOLLOW_RECORDS = 1 << 15

    def follow_tail(self) -> int:
        """A reader's view of a log another process appends to: move the readable end over
        the records that now check out, CRC included (a record still being copied fails and
        is picked up next time). The end only moves contiguously: a segment counts once every
        record before its start has, so a reader never trusts a later segment while the tail
        of an earlier one is unchecked. At most _FOLLOW_RECORDS records per call, so a reader
        far behind catches up over several calls. Returns the readable end."""
        pos = self._followed
        if pos is None:
            pos = max(self.segments.min_offset, 0)
        budget = self._FOLLOW_RECORDS
        while budget:
            seg = self.segments.find(pos)
            if seg is None:
                seg = self._segment_after(pos)
                if seg is None:
                    break
                pos = seg.start  # the bytes before it are gone (cleanup) or were never there
            at = pos - seg.start
            if at < seg.wrote:  # checked already (recovery at open)
                pos = seg.start + seg.wrote
                continue
            kind, size, _head = scan_record(seg.mm, at, seg.size, True, expected_phys=pos)
            if kind == SCAN_OK:
                pos += size
            elif kind == SCAN_BLANK and size == seg.size - at:
                pos = seg.end
            else:
                break
            seg.wrote = pos - seg.start
            budget -= 1
        self._followed = pos
        return pos

    def _segment_after(self, pos: int) -> MappedFile | None:
        """The first segment holding bytes past ``pos``; files are looked for (and deleted ones
        forgotten) only once the mapped segments run out."""
        segs = self.segments.segments
        if not segs or segs[-1].end <= pos:
            self.segments.refresh(prune=True, most=1)
            segs = self.segments.segments
        return next((seg for seg in segs if seg.end > pos), None)

    def close(self) -> None:
        self.segments.close()

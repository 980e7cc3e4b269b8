"""An ordered run of equal-size segment files forming one logical byte stream.

Used by the commit log (``commitlog/``) and by every consume queue. Files are named by their
start offset (20 digits) so ``ls`` sorts them; each next segment starts where the previous one
ends. Loading follows RocketMQ (sub-directories and non-numeric names are skipped, an empty
*last* file is deleted) but repairs what RocketMQ refuses: see ``load``.

Single writer; readers may look up segments concurrently (the list is replaced, never mutated
in place, so a reader always sees a consistent snapshot).
"""

from __future__ import annotations

import os
from collections import Counter
from typing import Callable

from mqstore.storage.mapped_file import MappedFile, segment_name
from mqstore.storage.durable_file import sync_dir


def _infer_size(starts: list[int], sizes: list[int], known: int | None) -> int:
    if known:
        return known
    gaps = [b - a for a, b in zip(starts, starts[1:]) if b > a]
    if gaps:
        return min(gaps)
    counts = Counter(sizes)
    return max(counts, key=lambda n: (counts[n], n))


def _extend(path: str, size: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


class SegmentQueue:
    def __init__(self, directory: str, segment_bytes: int | None, *, read_only: bool = False,
                 on_warning: Callable[[str], None] | None = None,
                 known_bytes: int | None = None, growing: bool = True) -> None:
        """``segment_bytes``: the size of new files when the directory has none yet (None: take
        it from the first file that appears). ``known_bytes``: the size this stream is known
        to have been written with (recorded by the store); it wins over what the files say.
        ``growing``: files reserve their blocks in growing steps, else a fixed distance ahead
        of their appends (see ``MappedFile``)."""
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.known_bytes = known_bytes
        self.growing = growing
        self.repaired: list[int] = []  # starts of files ``load`` found short and extended
        self.read_only = read_only
        self.segments: list[MappedFile] = []
        self._warn = on_warning or (lambda _msg: None)
        self._unsynced_dirs: set[str] = set()

    # -- loading ---------------------------------------------------------------------------
    def load(self) -> list[str]:
        """Map the existing segments; returns notes about what it found wrong and did.

        The segment size is the recorded one, else the distance between consecutive file
        names, else the size most files have; a configured size never overrides it. A file
        shorter than that is extended with zeros (read-only: mapped as it is, the rest counts
        as missing), a longer one is mapped to the segment size. Files whose start is not a
        multiple of the size are left alone and reported.
        """
        notes: list[str] = []
        # A store whose directory is not made yet (``init`` makes none) has its size recorded
        # all the same: its first segment takes that size, not the configured one.
        names, sizes = self._segment_files(notes) if os.path.isdir(self.directory) else ([], [])
        if not names:
            if self.known_bytes:
                self.segment_bytes = self.known_bytes
            return notes
        size = _infer_size([int(n) for n in names], sizes, self.known_bytes)
        if self.segment_bytes is not None and self.segment_bytes != size:
            notes.append(f"{self.directory} was written with {size}-byte segments; they keep "
                         f"that size (the configured {self.segment_bytes} applies to new stores)")
        self.segment_bytes = size
        segments: list[MappedFile] = []
        try:
            for name, file_size in zip(names, sizes):
                path = os.path.join(self.directory, name)
                start = int(name)
                if start % size:
                    notes.append(f"segment {path} starts at {start}, not a multiple of the "
                                 f"segment size {size}: left out")
                    continue
                mapped = self._fit(path, start, file_size, size, notes)
                if segments and start < segments[-1].end:
                    notes.append(f"segment {path} overlaps the one before: left out")
                    continue
                if mapped == 0:
                    continue
                if segments and start != segments[-1].end:
                    self._warn(f"gap before segment {path}: previous ends at {segments[-1].end}")
                segments.append(MappedFile(path, start, mapped, read_only=self.read_only,
                                           growing=self.growing))
        except BaseException:
            for seg in segments:
                seg.close()
            raise
        self.segments = segments
        return notes

    def _segment_files(self, notes: list[str]) -> tuple[list[str], list[int]]:
        """The segment files' names, in offset order, and their sizes; an empty last one (a
        crash while it was created) is deleted and left out."""
        names = sorted(
            n for n in os.listdir(self.directory)
            if n.isdigit() and os.path.isfile(os.path.join(self.directory, n))
        )
        sizes = [os.path.getsize(os.path.join(self.directory, n)) for n in names]
        if names and sizes[-1] == 0:
            path = os.path.join(self.directory, names[-1])
            if not self.read_only:
                os.unlink(path)
                notes.append(f"deleted empty last segment {path}")
            names.pop()
            sizes.pop()
        return names, sizes

    def _fit(self, path: str, start: int, file_size: int, size: int, notes: list[str]) -> int:
        """How many bytes of a segment file of ``file_size`` bytes to map, for segments of
        ``size``: a short file is extended with zeros (read-only: mapped as it is), a long
        one mapped to the segment size."""
        if file_size < size:
            if self.read_only:
                notes.append(f"segment {path} is {file_size} bytes, not {size}: the "
                             f"rest is missing")
                return file_size
            _extend(path, size)
            self.repaired.append(start)
            notes.append(f"segment {path} was {file_size} bytes, not {size}: "
                         f"extended with zeros (the missing bytes are lost)")
        elif file_size > size:
            notes.append(f"segment {path} is {file_size} bytes, longer than the "
                         f"segment size {size}: its first {size} bytes are used")
        return size

    def refresh(self, *, prune: bool = False, most: int | None = None) -> int:
        """Map segments another process created after the last one known; returns how many.

        A follower's view: new files are taken as they are (nothing in them trusted yet),
        positions are the caller's business. Until one is mapped the size comes from the
        files, as a configured size need not be the writer's. ``prune``: also forget leading
        segments whose files are gone (the writer's cleanup), so a follower maps no more files
        than the writer keeps. ``most``: map at most that many (a follower that maps one file
        at a time keeps ``max_offset`` at the end of what it has checked). A file still being
        created or deleted under us is looked at again next time.
        """
        try:
            with os.scandir(self.directory) as entries:
                names = {e.name: int(e.name) for e in entries if e.name.isdigit() and e.is_file()}
        except (FileNotFoundError, NotADirectoryError):
            return 0
        if prune:
            self._forget_removed(names)
        last = self.segments[-1].start if self.segments else -1
        fresh = sorted((start, name) for name, start in names.items() if start > last)
        if not self.segments and not self._take_size(fresh):
            return 0
        added = []
        for start, name in fresh[:most]:
            seg = self._map_new(os.path.join(self.directory, name), start)
            if seg is None:
                break
            added.append(seg)
        if added:
            self.segments = self.segments + added
        return len(added)

    def _forget_removed(self, names: dict[str, int]) -> None:
        """Close the leading segments whose files are gone; cleanup deletes oldest first and
        never the newest, so neither does this."""
        segs = self.segments
        gone = 0
        while gone < len(segs) - 1 and os.path.basename(segs[gone].path) not in names:
            gone += 1
        if gone:
            self.segments = segs[gone:]
            for seg in segs[:gone]:
                seg.close()

    def _take_size(self, fresh: list[tuple[int, str]]) -> bool:
        """The writer's segment size, before any of its files is mapped: the recorded one, else
        the distance between two file names, else the size of the only file once it has one
        (it is created empty, then given its full size). False while nothing tells."""
        if self.known_bytes:
            self.segment_bytes = self.known_bytes
            return True
        gaps = [b - a for (a, _n), (b, _m) in zip(fresh, fresh[1:])]
        if gaps:
            self.segment_bytes = min(gaps)
            return True
        if not fresh:
            return False
        try:
            size = os.path.getsize(os.path.join(self.directory, fresh[0][1]))
        except FileNotFoundError:
            return False
        if size > 0:
            self.segment_bytes = size
        return size > 0

    def _map_new(self, path: str, start: int) -> MappedFile | None:
        """The file at ``path`` mapped with nothing in it trusted yet; None while it is still
        short (being created) or when it has gone."""
        try:
            if os.path.getsize(path) < self.segment_bytes:
                return None
            seg = MappedFile(path, start, self.segment_bytes, read_only=self.read_only,
                             growing=self.growing)
        except (FileNotFoundError, ValueError):
            return None
        seg.wrote = seg.flushed = 0
        return seg

    # -- positions -------------------------------------------------------------------------
    @property
    def min_offset(self) -> int:
        return self.segments[0].start if self.segments else -1

    @property
    def max_offset(self) -> int:
        """End of readable data: last segment's start plus its committed position (0 if empty)."""
        segs = self.segments
        if not segs:
            return 0
        end = segs[-1].start + segs[-1].committed
        i = len(segs) - 2
        while i >= 0 and segs[i].staged:  # commits go in order: an earlier gap ends the data
            end = segs[i].start + segs[i].committed
            i -= 1
        return end

    @property
    def write_end(self) -> int:
        """End of appended data, committed or still staged in the transient pool."""
        segs = self.segments
        return segs[-1].start + segs[-1].wrote if segs else 0

    def contiguous_end(self) -> int:
        """End of the appended bytes with no unwritten gap before them (a batch may create
        several segments before it writes into the first of them)."""
        for seg in self.segments:
            if seg.wrote < seg.size:
                return seg.start + seg.wrote
        return self.segments[-1].end if self.segments else 0

    @property
    def flushed_offset(self) -> int:
        segs = self.segments
        if not segs:
            return 0
        for seg in segs:
            if seg.flushed < seg.wrote:
                return seg.start + seg.flushed
        return segs[-1].start + segs[-1].wrote

    def last(self) -> MappedFile | None:
        return self.segments[-1] if self.segments else None

    def find(self, offset: int) -> MappedFile | None:
        """The segment holding ``offset``, or None."""
        segs = self.segments
        if not segs or offset < segs[0].start:
            return None
        idx = (offset - segs[0].start) // self.segment_bytes
        if idx < len(segs):
            seg = segs[idx]
            if seg.start <= offset < seg.start + seg.size:  # ``end``, without its frame
                return seg
        for seg in segs:  # after a gap the arithmetic index is off; fall back to a walk
            if seg.start <= offset < seg.end:
                return seg
        return None

    # -- changes ---------------------------------------------------------------------------
    def insert_closed(self, start: int, filler) -> MappedFile:
        """Recreate the missing segment at ``start`` (between existing ones) holding only
        ``filler(size)`` at offset 0 (a blank record), so readers step over it."""
        size = self.segment_bytes
        seg = MappedFile(os.path.join(self.directory, segment_name(start)), start, size,
                         create=True, growing=self.growing)
        seg.write(filler(size))
        seg.wrote = seg.flushed = size
        seg.flush()
        self.segments = sorted(self.segments + [seg], key=lambda m: m.start)
        return seg

    def create_next(self, start: int | None = None, reserve: int = 0) -> MappedFile:
        """Create the segment after the last one (or the one containing ``start``), with the
        blocks of its first ``reserve`` bytes reserved (DiskFullError, and no file, when they
        cannot be)."""
        size = self.segment_bytes
        if self.segments:
            begin = self.segments[-1].end
        else:
            begin = (start or 0) - (start or 0) % size
        self._make_directory()
        seg = MappedFile(os.path.join(self.directory, segment_name(begin)), begin, size,
                         create=True, growing=self.growing, reserve=reserve)
        self.segments = self.segments + [seg]
        self._unsynced_dirs.add(self.directory)
        return seg

    def _make_directory(self) -> None:
        """Create the directory and its missing parents; their entries are forced with the
        next ``flush``."""
        missing, d = [], self.directory
        while not os.path.isdir(d):
            missing.append(d)
            d = os.path.dirname(d)
        os.makedirs(self.directory, exist_ok=True)
        self._unsynced_dirs.update(os.path.dirname(m) for m in missing)

    def truncate_to(self, offset: int) -> list[str]:
        """Make ``offset`` the end of the stream: delete later segments, move positions back."""
        removed: list[str] = []
        keep: list[MappedFile] = []
        for seg in self.segments:
            if seg.start > offset:
                removed.append(seg.path)
                if self.read_only:
                    seg.close()
                else:
                    seg.destroy()
                continue
            if seg.end > offset:
                seg.wrote = seg.flushed = offset - seg.start
            keep.append(seg)
        self.segments = keep
        return removed

    def drop_last(self) -> str:
        seg = self.segments[-1]
        self.segments = self.segments[:-1]
        if self.read_only:  # a reader forgets the file; only the writer's may remove it
            seg.close()
        else:
            seg.destroy()
        return seg.path

    def drop_first(self, count: int) -> list[str]:
        """Delete the ``count`` oldest segments (cleanup)."""
        gone = self.segments[:count]
        self.segments = self.segments[count:]
        for seg in gone:
            seg.destroy()
        return [seg.path for seg in gone]

    def flush(self) -> int:
        """Force the unflushed bytes, then the names of files and directories created since
        the last flush: a file forced under a name that is not is lost with the power."""
        for seg in self.segments:
            if seg.flushed < seg.wrote:
                seg.flush()
        while self._unsynced_dirs:
            d = self._unsynced_dirs.pop()
            try:
                sync_dir(d)
            except FileNotFoundError:  # removed since (a destroyed queue)
                pass
        return self.flushed_offset

    def close(self) -> None:
        for seg in self.segments:
            seg.close()

    def destroy(self) -> None:
        for seg in self.segments:
            seg.destroy()
        self.segments = []

"""One index file (layout in ``index_layout``), mapped whole, as RocketMQ's ``IndexFile``.

    put_key(hash, phys, ts)                     select(hash, max_num, begin, end)
        |                                           |
        v                                           v
    slot[hash % slots] --> entry n --prev--> entry m --prev--> ... --> 0 (end of chain)
                           (newest)                   (older)

Files live in ``index/`` and are named by creation time (``yyyyMMddHHmmssSSS``); naming, when to
roll over and which keys to put are the caller's business. A file is created at full size
(sparse zeros): the default 420,000,040-byte file touches three pages for its first entry.

Header fields are written through to the map as they change, as RocketMQ does, except that
``indexCount`` of a new file stays 0 on disk until the first put or ``flush()`` (which rewrites
the whole header). Nothing is forced to disk before ``flush()``/``close()``.

Follows RocketMQ 5.x ``IndexFile`` (unchanged since 4.9.8) with two deliberate additions:
``select`` only follows a chain to strictly earlier entries, never past the header's
``indexCount`` or the file's capacity, so a corrupt file (a cycle, a forward link, a huge count)
costs at most one step per entry; it logs a warning naming the file and returns what it found
(a cycle would loop forever in Java). And ``verify()`` checks a loaded file without raising.

Quirk kept on purpose: the first entry after a rollover is timed from the previous file's end,
so it can read later than the entries after it; a walk stops at the first entry older than
``begin``, so a window query may then miss that first entry although its time is inside.

Single writer; not thread-safe.
"""

from __future__ import annotations

import logging
import os

import numpy as np

from mqstore.errors import MQStoreError
from mqstore.format import index_layout as L
from mqstore.storage.mapped_file import MappedFile

INDEX_DIR = "index"

log = logging.getLogger(__name__)

_ROLL_BACK_CHUNK = 1 << 20  # entries read at once when slots are set back (20 MiB)
_VERIFY_CHUNK = 1 << 20  # entries checked at once by verify()


class IndexFile:
    """``stored_header`` is the header as found on disk when the file was opened."""

    __slots__ = ("path", "slots", "entries", "read_only", "_mf", "_mm", "_begin_ts", "_end_ts",
                 "_begin_phys", "_end_phys", "_hash_slot_count", "_index_count", "stored_header",
                 "_reported")

    def __init__(self, mapped: MappedFile, slots: int, entries: int) -> None:
        self.path = mapped.path
        self.slots = slots
        self.entries = entries
        self.read_only = mapped.read_only
        self._mf = mapped
        self._mm = mapped.mm
        self._reported = False
        self.stored_header = L.unpack_header(self._mm)
        (self._begin_ts, self._end_ts, self._begin_phys, self._end_phys,
         self._hash_slot_count, self._index_count) = self.stored_header
        if self._index_count <= 0:
            self._index_count = L.FIRST_INDEX

    # -- open ------------------------------------------------------------------------------
    @classmethod
    def create(cls, path: str, slots: int = L.DEFAULT_SLOTS, entries: int = L.DEFAULT_ENTRIES, *,
               prev_end_phys_offset: int = 0, prev_end_timestamp: int = 0) -> "IndexFile":
        """A new zero-filled file. The previous file's end offset and time, when > 0, become
        this file's begin and end values (RocketMQ measures the first put from them)."""
        L.counts_for_size(L.file_size(slots, entries), slots, entries)
        f = cls(MappedFile(path, 0, L.file_size(slots, entries), create=True, growing=False),
                slots, entries)
        if prev_end_phys_offset > 0:
            f._put_long(L.BEGIN_PHYS_OFFSET_AT, prev_end_phys_offset)
            f._put_long(L.END_PHYS_OFFSET_AT, prev_end_phys_offset)
            f._begin_phys = f._end_phys = prev_end_phys_offset
        if prev_end_timestamp > 0:
            f._put_long(L.BEGIN_TIMESTAMP_AT, prev_end_timestamp)
            f._put_long(L.END_TIMESTAMP_AT, prev_end_timestamp)
            f._begin_ts = f._end_ts = prev_end_timestamp
        return f

    @classmethod
    def load(cls, path: str, slots: int | None = None, entries: int | None = None, *,
             read_only: bool = False) -> "IndexFile":
        """Map an existing file; missing counts come from its size (``counts_for_size``)."""
        size = os.path.getsize(path)
        slots, entries = L.counts_for_size(size, slots, entries)
        return cls(MappedFile(path, 0, size, read_only=read_only, growing=False), slots, entries)

    def reload_header(self) -> None:
        """Re-read the header another process keeps writing (a follower's view)."""
        (self._begin_ts, self._end_ts, self._begin_phys, self._end_phys,
         self._hash_slot_count, self._index_count) = L.unpack_header(self._mm)
        if self._index_count <= 0:
            self._index_count = L.FIRST_INDEX

    # -- header ----------------------------------------------------------------------------
    @property
    def begin_timestamp(self) -> int:
        return self._begin_ts

    @property
    def end_timestamp(self) -> int:
        return self._end_ts

    @property
    def begin_phys_offset(self) -> int:
        return self._begin_phys

    @property
    def end_phys_offset(self) -> int:
        return self._end_phys

    @property
    def hash_slot_count(self) -> int:
        return self._hash_slot_count

    @property
    def index_count(self) -> int:
        return self._index_count

    @property
    def header(self) -> L.IndexHeader:
        return L.IndexHeader(self._begin_ts, self._end_ts, self._begin_phys, self._end_phys,
                             self._hash_slot_count, self._index_count)

    @property
    def closed(self) -> bool:
        return self._mf._fd < 0

    def is_full(self) -> bool:
        return self._index_count >= self.entries

    def overlaps(self, begin_ms: int, end_ms: int) -> bool:
        """RocketMQ ``isTimeMatched``: ``[begin, end]`` covers or touches this file's range."""
        b, e = self._begin_ts, self._end_ts
        return (begin_ms < b and end_ms > e) or b <= begin_ms <= e or b <= end_ms <= e

    # -- raw access ------------------------------------------------------------------------
    def slot_value(self, slot: int) -> int:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside [0, {self.slots}) of {self.path}")
        # A slot page may never have been written (a sparse file): read it with a system call.
        return L.INT_STRUCT.unpack(self._mf.pread(L.slot_position(slot), L.SLOT_SIZE))[0]

    def read_entry(self, index: int) -> tuple[int, int, int, int]:
        """``(key_hash, phys_offset, time_diff_seconds, prev_index)`` of entry ``index``."""
        if not 0 <= index < self.entries:
            raise ValueError(f"entry {index} is outside [0, {self.entries}) of {self.path}")
        return L.ENTRY_STRUCT.unpack_from(self._mm, L.entry_position(self.slots, index))

    def _put_long(self, at: int, value: int) -> None:
        L.LONG_STRUCT.pack_into(self._mm, at, value)

    def _put_int(self, at: int, value: int) -> None:
        L.INT_STRUCT.pack_into(self._mm, at, value)

    # -- write -----------------------------------------------------------------------------
    def put_key(self, key_hash: int, phys_offset: int, store_ts: int) -> bool:
        """Append one entry (RocketMQ ``putKey``); False when the file is full."""
        if self.read_only:
            raise MQStoreError(f"index file {self.path} is open read-only; put_key needs a writer")
        if not 0 <= key_hash <= L.INT32_MAX:
            raise ValueError(f"key_hash {key_hash} must be an index hash in [0, 2^31-1]")
        if self.is_full():
            return False
        count = self._index_count
        slot = L.slot_of(key_hash, self.slots)
        at = L.entry_position(self.slots, count)
        # Blocks first (sparse file): a full disk raises here, before anything changed.
        self._mf.reserve_span(at, at + L.ENTRY_SIZE)
        self._mf.reserve_span(L.slot_position(slot), L.slot_position(slot) + L.SLOT_SIZE)
        self._mf.reserve_span(0, L.HEADER_SIZE)
        slot_value = self.slot_value(slot)
        if slot_value <= L.INVALID_INDEX or slot_value > count:
            slot_value = L.INVALID_INDEX
        time_diff = L.time_diff_seconds(store_ts, self._begin_ts)
        L.ENTRY_STRUCT.pack_into(self._mm, at, key_hash, phys_offset, time_diff, slot_value)
        self._put_int(L.slot_position(slot), count)
        if count <= L.FIRST_INDEX:
            self._begin_phys = phys_offset
            self._put_long(L.BEGIN_PHYS_OFFSET_AT, phys_offset)
            self._begin_ts = store_ts
            self._put_long(L.BEGIN_TIMESTAMP_AT, store_ts)
        if slot_value == L.INVALID_INDEX:
            self._hash_slot_count += 1
            self._put_int(L.HASH_SLOT_COUNT_AT, self._hash_slot_count)
        self._index_count = count + 1
        self._put_int(L.INDEX_COUNT_AT, self._index_count)
        self._end_phys = phys_offset
        self._put_long(L.END_PHYS_OFFSET_AT, phys_offset)
        self._end_ts = store_ts
        self._put_long(L.END_TIMESTAMP_AT, store_ts)
        return True

    def put_keys(self, key_hashes: np.ndarray, phys_offsets: np.ndarray,
                 store_timestamps: np.ndarray) -> int:
        """``put_key`` for many keys at once, with identical results; returns how many fit.

        Entries are numbered consecutively, so they are written with one copy; each entry's
        prevIndex is the previous entry of the same slot in the batch, or the slot's old value.
        """
        if self.read_only:
            raise MQStoreError(f"index file {self.path} is open read-only; put_keys needs a writer")
        count = self._index_count
        k = min(len(key_hashes), self.entries - count)
        if k <= 0:
            return 0
        hashes = np.asarray(key_hashes[:k], dtype=np.int64)
        if hashes.min() < 0 or hashes.max() > L.INT32_MAX:
            raise ValueError("key hashes must be index hashes in [0, 2^31-1]")
        phys = np.asarray(phys_offsets[:k], dtype=np.int64)
        ts = np.asarray(store_timestamps[:k], dtype=np.int64)
        numbers = np.arange(count, count + k, dtype=np.int64)
        slots = hashes % self.slots
        at = L.entry_position(self.slots, count)
        # Blocks first (sparse file): a full disk raises here, before anything changed, and
        # the slots read below are no holes any more.
        self._mf.reserve_span(at, at + k * L.ENTRY_SIZE)
        self._mf.reserve_pages(L.HEADER_SIZE + slots * L.SLOT_SIZE)
        self._mf.reserve_span(0, L.HEADER_SIZE)
        table = np.frombuffer(self._mm, dtype=L.SLOT_DTYPE, count=self.slots, offset=L.HEADER_SIZE)
        old = table[slots].astype(np.int64)
        old[(old <= L.INVALID_INDEX) | (old > count)] = L.INVALID_INDEX
        order = np.argsort(slots, kind="stable")
        ss = slots[order]
        first = np.ones(k, dtype=bool)
        first[1:] = ss[1:] != ss[:-1]
        prev_sorted = np.where(first, old[order], np.concatenate(([0], numbers[order][:-1])))
        prev = np.empty(k, dtype=np.int64)
        prev[order] = prev_sorted
        entries = np.empty(k, dtype=L.ENTRY_DTYPE)
        entries["key_hash"] = hashes
        entries["phys_offset"] = phys
        entries["time_diff"] = self._time_diffs(ts, count)
        entries["prev_index"] = prev
        self._mm[at:at + k * L.ENTRY_SIZE] = entries.tobytes()
        last = np.ones(k, dtype=bool)
        last[:-1] = ss[1:] != ss[:-1]
        table[ss[last]] = numbers[order][last]
        del table
        self._header_after_put(count, k, phys, ts,
                               int(np.count_nonzero(first & (old[order] == L.INVALID_INDEX))))
        return k

    def _time_diffs(self, ts: np.ndarray, count: int) -> np.ndarray:
        """Each new entry's timeDiff (seconds from the file's begin timestamp, Java's int
        division, 0 when the file has no begin yet) for entries from number ``count``."""
        # The first entry of a file is timed from the old begin; every later one from its time.
        begins = np.full(len(ts), ts[0] if count <= L.FIRST_INDEX else self._begin_ts,
                         dtype=np.int64)
        begins[0] = self._begin_ts
        delta = ts - begins
        diff = np.where(delta >= 0, delta // 1000, -((-delta) // 1000))
        return np.where(begins <= 0, 0, np.clip(diff, 0, L.INT32_MAX))

    def _header_after_put(self, count: int, k: int, phys: np.ndarray, ts: np.ndarray,
                          new_slots: int) -> None:
        """The header after ``k`` entries from number ``count`` went in, ``new_slots`` of
        them into slots that were empty."""
        if count <= L.FIRST_INDEX:
            self._begin_phys, self._begin_ts = int(phys[0]), int(ts[0])
            self._put_long(L.BEGIN_PHYS_OFFSET_AT, self._begin_phys)
            self._put_long(L.BEGIN_TIMESTAMP_AT, self._begin_ts)
        self._hash_slot_count += new_slots
        self._put_int(L.HASH_SLOT_COUNT_AT, self._hash_slot_count)
        self._index_count = count + k
        self._put_int(L.INDEX_COUNT_AT, self._index_count)
        self._end_phys, self._end_ts = int(phys[-1]), int(ts[-1])
        self._put_long(L.END_PHYS_OFFSET_AT, self._end_phys)
        self._put_long(L.END_TIMESTAMP_AT, self._end_ts)

    def roll_back(self, header: L.IndexHeader) -> None:
        """Return the file to a state it was forced to disk in, ``header`` then: entries from
        ``header.index_count`` on are dropped (left as they are, past the count, where
        nothing reads them and the next puts overwrite them), and a slot naming one of them
        is set back to the newest earlier entry of its slot (or none). Entries below the
        count and the slots naming them were on disk with that header and never change."""
        count = max(header.index_count, L.FIRST_INDEX)
        if self.read_only or not L.FIRST_INDEX <= count <= self.entries:
            raise ValueError(f"cannot roll {self.path} back to indexCount {header.index_count}")
        table = np.frombuffer(self._mm, dtype=L.SLOT_DTYPE, count=self.slots,
                              offset=L.HEADER_SIZE)
        stale = np.flatnonzero((table < 0) | (table >= count))
        if len(stale):
            pending = np.zeros(self.slots, dtype=bool)
            pending[stale] = True
            table[stale] = L.INVALID_INDEX
            left, hi = len(stale), count
            while left and hi > L.FIRST_INDEX:
                lo = max(L.FIRST_INDEX, hi - _ROLL_BACK_CHUNK)
                hashes = np.frombuffer(self._mm, dtype=L.ENTRY_DTYPE, count=hi - lo,
                                       offset=L.entry_position(self.slots, lo))["key_hash"]
                slots = hashes.astype(np.int64) % self.slots
                hit = np.flatnonzero(pending[slots])[::-1]  # newest first
                if len(hit):
                    found, first = np.unique(slots[hit], return_index=True)
                    table[found] = lo + hit[first]
                    pending[found] = False
                    left -= len(found)
                hi = lo
            del table
        self._mm[0:L.HEADER_SIZE] = L.pack_header(header)
        (self._begin_ts, self._end_ts, self._begin_phys, self._end_phys,
         self._hash_slot_count, self._index_count) = header
        self._index_count = count
        self._mm.flush()

    # -- read ------------------------------------------------------------------------------
    def select(self, key_hash: int, max_num: int, begin_ms: int,
               end_ms: int) -> list[tuple[int, int]]:
        """``(phys_offset, time_ms)`` of entries with ``key_hash`` stored in ``[begin, end]``,
        newest first, at most ``max_num`` (RocketMQ ``selectPhyOffset``)."""
        found: list[tuple[int, int]] = []
        count = self._index_count
        if key_hash < 0 or max_num <= 0 or count <= L.FIRST_INDEX:
            return found
        # RocketMQ accepts a slot up to indexCount itself (a follower's header may lag the
        # entry it points to); a count past the capacity is corrupt and must not steer reads.
        index = self.slot_value(L.slot_of(key_hash, self.slots))
        if index <= L.INVALID_INDEX or index > min(count, self.entries - 1):
            return found
        while len(found) < max_num:
            hash_read, phys, time_diff, prev = self.read_entry(index)
            if time_diff < 0:
                self._report_chain(index, f"time diff {time_diff} is negative")
                break
            time_read = L.entry_time_ms(self._begin_ts, time_diff)
            if hash_read == key_hash and begin_ms <= time_read <= end_ms:
                found.append((phys, time_read))
            if prev < L.INVALID_INDEX or prev >= index:
                # Entries only ever link to earlier ones; anything else (a cycle, a forward or
                # negative link) is damage, and stopping here bounds the walk by ``index``.
                self._report_chain(index, f"prevIndex {prev} is not in [0, {index})")
                break
            if prev == L.INVALID_INDEX or time_read < begin_ms:
                break
            index = prev
        return found

    def _report_chain(self, index: int, problem: str) -> None:
        """Warn once per file: every lookup that meets the damage would repeat it."""
        if not self._reported:
            self._reported = True
            log.warning("index file %s is corrupt: entry %d: %s; lookups stop there and may "
                        "miss older entries of that slot (verify() reports the damage)",
                        self.path, index, problem)

    # -- checks ----------------------------------------------------------------------------
    def check_header(self) -> str | None:
        """Cheap consistency check for every open: header counts and slot values in range."""
        try:
            h = L.unpack_header(self._mm)
            if not 0 <= h.index_count <= self.entries:
                return f"{self.path}: indexCount {h.index_count} outside [0, {self.entries}]"
            count = max(h.index_count, L.FIRST_INDEX)
            slots = np.frombuffer(self._mm, dtype=L.SLOT_DTYPE, count=self.slots,
                                  offset=L.HEADER_SIZE)
            bad = np.flatnonzero((slots < 0) | (slots >= count))
            if len(bad):
                s = int(bad[0])
                return f"{self.path}: slot {s} holds {int(slots[s])}, outside [0, {count - 1}]"
            return None
        except Exception as exc:  # a damaged file can make any read fail
            return f"{self.path}: unreadable ({exc!r})"

    def verify(self) -> str | None:
        """None for a consistent file, else what is wrong with it. Never raises.

        Stricter than RocketMQ's own read checks: a slot or prevIndex equal to indexCount (or
        to the entry's own number) is reported, since entries run from 1 to indexCount - 1.
        """
        try:
            return self._verify()
        except Exception as exc:  # a damaged header can make any read fail
            return f"{self.path}: unreadable ({exc!r})"

    def _verify(self) -> str | None:
        h = L.unpack_header(self._mm)
        where = self.path
        if not 0 <= h.index_count <= self.entries:
            return f"{where}: indexCount {h.index_count} outside [0, {self.entries}]"
        count = max(h.index_count, L.FIRST_INDEX)
        if not 0 <= h.hash_slot_count <= min(self.slots, count - 1):
            return (f"{where}: hashSlotCount {h.hash_slot_count} outside "
                    f"[0, {min(self.slots, count - 1)}]")
        slots = np.frombuffer(self._mm, dtype=L.SLOT_DTYPE, count=self.slots,
                              offset=L.HEADER_SIZE)
        bad = np.flatnonzero((slots < 0) | (slots >= count))
        if len(bad):
            s = int(bad[0])
            return f"{where}: slot {s} holds {int(slots[s])}, outside [0, {count - 1}]"
        every = np.frombuffer(self._mm, dtype=L.ENTRY_DTYPE, count=count,
                              offset=L.entry_position(self.slots, 0))
        newest = np.zeros(self.slots, dtype=np.int64)
        # In chunks: a full default file holds 20M entries, and whole-file temporaries would
        # take gigabytes (this runs at an open after a crash, see the key index).
        for lo in range(L.FIRST_INDEX, count, _VERIFY_CHUNK):
            problem = self._verify_entries(every, lo, min(count, lo + _VERIFY_CHUNK), newest)
            if problem is not None:
                return f"{where}: {problem}"
        wrong = np.flatnonzero(newest != slots)
        if len(wrong):
            s = int(wrong[0])
            return f"{where}: slot {s} holds {int(slots[s])}, newest entry there is {newest[s]}"
        used = int(np.count_nonzero(newest))
        if used != h.hash_slot_count:
            return f"{where}: hashSlotCount {h.hash_slot_count} but {used} slots are in use"
        if count > L.FIRST_INDEX:
            first = int(every["phys_offset"][L.FIRST_INDEX])
            last = int(every["phys_offset"][count - 1])
            if (h.begin_phys_offset, h.end_phys_offset) != (first, last):
                return (f"{where}: header phys range [{h.begin_phys_offset}, "
                        f"{h.end_phys_offset}] but entries run from {first} to {last}")
        return None

    def _verify_entries(self, every: np.ndarray, lo: int, hi: int,
                        newest: np.ndarray) -> str | None:
        """Check entries ``[lo, hi)`` of ``every`` (all entries below the count, a view of
        the map) and raise ``newest`` (per slot, its newest entry) to them."""
        ents = every[lo:hi]
        numbers = np.arange(lo, hi)
        prev = ents["prev_index"].astype(np.int64)
        checks = [
            ((prev < 0) | (prev >= numbers), "prevIndex {v} is not in [0, own number)", prev),
            (ents["phys_offset"] < 0, "phys offset {v} is negative", ents["phys_offset"]),
            (ents["key_hash"] < 0, "key hash {v} is negative", ents["key_hash"]),
            (ents["time_diff"] < 0, "time diff {v} is negative", ents["time_diff"]),
        ]
        for mask, msg, values in checks:
            bad = np.flatnonzero(mask)
            if len(bad):
                i = int(bad[0])
                return f"entry {lo + i}: " + msg.format(v=int(values[i]))
        entry_slot = ents["key_hash"].astype(np.int64) % self.slots
        chained = np.flatnonzero(prev > 0)
        # prev < own number (checked above): the entry chained to is this chunk's or earlier.
        prev_slot = every["key_hash"][prev[chained]].astype(np.int64) % self.slots
        off = chained[prev_slot != entry_slot[chained]]
        if len(off):
            i = int(off[0])
            return f"entry {lo + i} chains to entry {int(prev[i])} in another slot"
        np.maximum.at(newest, entry_slot, numbers)
        return None

    # -- lifecycle -------------------------------------------------------------------------
    def flush(self) -> None:
        """Rewrite the whole header (``indexCount`` at least 1) and force the map to disk."""
        if self.read_only or self.closed:
            return
        self._mm[0:L.HEADER_SIZE] = L.pack_header(self.header)
        self._mm.flush()

    def close(self) -> None:
        """Flush (a writer) and unmap, as RocketMQ's ``IndexFile.shutdown``."""
        if self.closed:
            return
        self.flush()
        self._mf.close()

    def destroy(self) -> None:
        """Unmap without flushing and delete the file."""
        self._mf.destroy()

    def __repr__(self) -> str:
        return (f"IndexFile({self.path!r}, slots={self.slots}, entries={self.entries}, "
                f"index_count={self._index_count})")

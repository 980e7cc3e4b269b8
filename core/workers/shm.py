"""Store positions shared between the store process and its workers.

One small numpy ``int64`` array on ``multiprocessing.shared_memory``. Each slot has exactly one
writer process (named below), so plain aligned 8-byte stores suffice; readers treat values as
hints that only grow. Only the segment's *name* crosses the process boundary (pickling sends
the name), and only the creating store unlinks it.

    slot            writer          meaning
    WRITTEN         store           end of appended commit-log bytes
    FLUSHED         flush           end of bytes forced to disk
    CONFIRMED       store           end of bytes consumers may see (dispatch stops here)
    DISPATCHED      dispatch        end of dispatched bytes: every record below has its units
    DISPATCH_IDLE   dispatch        1 while the worker sleeps waiting for work
    LOGICS_TS       dispatch        store time of the last consume-queue write (checkpoint)
    INDEX_TS        dispatch        end time of the last full index file (checkpoint)
    STOP            store           1: finish the current batch and exit (NOTE [ Shutdown ])
    MIN_PHYS        store           first stored commit-log byte (after cleanup)
    ABNORMAL        store           1 when the store opened after an unclean exit
    COMMITTED       flush           end of bytes in the segment files (transient pool: copied
                                    from the pool; mmap writer: equal to WRITTEN)
    FLUSH_REQUEST   store           highest end offset a sync-flush put waits for
    FLUSH_ASK       store           sequence number of an explicit flush pass asked for
    FLUSH_ASK_LEAST store           least pages of that pass (0: everything; -1: commit only)
    FLUSH_DONE      flush           sequence number of the last explicit pass served
    FLUSH_STOP      store           1: final commit and flush, then exit; 2: exit at once
    FLUSH_IDLE      flush           1 while the flush loop sleeps
    FLUSH_COUNT     flush           number of forced writes (fdatasync calls) so far
    FLUSH_ERROR     flush           1 once forcing or committing failed with an OS error
    CLEAN_ASK       flush           sequence number of the last cleanup decision to delete
    CLEAN_AT_ONCE   flush           1: that deletion takes the oldest segments whatever their age
    CLEAN_DONE      store           sequence number of the last deletion carried out
    DISK_FULL_FLAG  flush           1 while the disk is too full to take puts (DISK_FULL)
    DISPATCH_FAILS  dispatch        consecutive failed attempts at the current batch (0: fine)

After the SLOTS position slots come WAITER_SLOTS cells of sync-flush puts waiting for a flush
(written by the store, read by the flush loop; see ``workers.sync_waiters``), then NOTE_BYTES
of UTF-8 text per writer process saying why its loop fails (read only to explain a refusal, so
a torn read costs nothing but a garbled message).
"""

from __future__ import annotations

import numpy as np

from mqstore.storage.shared_segment import close_segment, open_segment

WRITTEN, FLUSHED, CONFIRMED, DISPATCHED, DISPATCH_IDLE, LOGICS_TS, INDEX_TS, STOP, MIN_PHYS, \
    ABNORMAL, COMMITTED, FLUSH_REQUEST, FLUSH_ASK, FLUSH_ASK_LEAST, FLUSH_DONE, FLUSH_STOP, \
    FLUSH_IDLE, FLUSH_COUNT, FLUSH_ERROR, CLEAN_ASK, CLEAN_AT_ONCE, CLEAN_DONE, \
    DISK_FULL_FLAG, DISPATCH_FAILS = range(24)
POSITIONS_SEGMENT = "positions"  # the kind in ``store_segment_name``
SLOTS = 32
WAITER_SLOTS = 32
NOTE_BYTES = 512
DISPATCH_NOTE, FLUSH_NOTE = range(2)
_NOTES = 2


class SharedPositions:
    def __init__(self, name: str | None = None, *, create: bool = False,
                 tracked: bool | None = None) -> None:
        """An anonymous segment when ``name`` is None; else the named store segment, created
        with ``create`` or attached. Named ones are untracked (see ``shared_segment``)."""
        self._tracked = (name is None) if tracked is None else tracked
        cells_bytes = (SLOTS + WAITER_SLOTS) * 8
        self.shm, self.owner = open_segment(name, cells_bytes + _NOTES * NOTE_BYTES,
                                            create=create or name is None,
                                            tracked=self._tracked)
        cells = np.ndarray((SLOTS + WAITER_SLOTS,), dtype=np.int64, buffer=self.shm.buf)
        if self.owner:
            cells[:] = 0
        self.values = cells[:SLOTS]
        self.waiters = cells[SLOTS:]
        self._notes = self.shm.buf[cells_bytes:cells_bytes + _NOTES * NOTE_BYTES]

    @property
    def name(self) -> str:
        return self.shm.name

    def __getitem__(self, slot: int) -> int:
        return int(self.values[slot])

    def __setitem__(self, slot: int, value: int) -> None:
        self.values[slot] = value

    def set_note(self, which: int, text: str) -> None:
        raw = text.encode("utf-8", errors="replace")[:NOTE_BYTES - 1]
        at = which * NOTE_BYTES
        self._notes[at:at + len(raw) + 1] = raw + b"\0"

    def note(self, which: int) -> str:
        at = which * NOTE_BYTES
        raw = bytes(self._notes[at:at + NOTE_BYTES])
        return raw.split(b"\0", 1)[0].decode("utf-8", errors="replace")

    def close(self) -> None:
        """Detach; the owner also unlinks, so the segment is gone once every view closes."""
        if self.values is None:
            return
        self._notes.release()
        self.values = self.waiters = None
        close_segment(self.shm, self.owner, self._tracked)

    def __reduce__(self):
        # Another process attaches by name, tracked or not as the creator made it.
        return (_attach, (self.shm.name, self._tracked))


def _attach(name: str, tracked: bool) -> SharedPositions:
    return SharedPositions(name, tracked=tracked)

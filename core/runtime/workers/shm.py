"""Store positions shared between the store process and its workers, as typed channels.

One small numpy ``int64`` array on ``multiprocessing.shared_memory``. Each slot has exactly one
writer process, so plain aligned 8-byte stores suffice; readers treat values as hints that only
grow. Only the segment's *name* crosses the process boundary (pickling sends the name), and
only the creating store unlinks it. Code reads and writes slots through the channel of the job
they belong to (``Channels``), never by index:

    channel   slot            writer     meaning
    append    written         store      end of appended commit-log bytes
              confirmed       store      end of bytes consumers may see (dispatch stops here)
              abnormal        store      1 when the store opened after an unclean exit
              trusted_end     store      the end a trusted clean-shutdown marker vouched for
                                         at open (-1: none); the first worker's dispatchers
                                         take their unchanged files as complete up to it
    flush     committed       flush      end of bytes in the segment files (transient pool:
                                         copied from the pool; mmap writer: equal to written)
              flushed         flush      end of bytes forced to disk
              request         store      highest end offset a sync-flush put waits for
              ask             store      sequence number of an explicit flush pass asked for
              ask_least       store      least pages of that pass (0: everything; -1: commit only)
              done            flush      sequence number of the last explicit pass served
              stop            store      1: final commit and flush, then exit; 2: exit at once
              idle            flush      1 while the flush loop sleeps
              fsyncs          flush      number of forced writes (fdatasync calls) so far
              fsync_ns        flush      nanoseconds spent in those calls, in total
              error           flush      1 once forcing or committing failed with an OS error
              note            flush      why the loop fails (text)
    dispatch  dispatched      dispatch   end of dispatched bytes: every record below has units
              idle            dispatch   1 while the worker sleeps waiting for work
              logics_ts       dispatch   store time of the last consume-queue write (checkpoint)
              index_ts        dispatch   end time of the last full index file (checkpoint)
              stop            store      1: finish the current batch and exit (NOTE [ Shutdown ])
              fails           dispatch   consecutive failed attempts at the current batch
              started         dispatch   1 once the first worker dispatched what the log held
                                         when it started (what an open waits for)
              note            dispatch   why the loop fails (text)
    cleanup   min_phys        store      first stored commit-log byte (after cleanup deleted
                                         the segments below it)
              dropped         dispatch   the min_phys whose consume-queue and dispatcher files
                                         the dispatch loop has dropped (after_cleanup has run)

After the SLOTS position slots come WAITER_SLOTS cells of sync-flush puts waiting for a flush
(written by the store, read by the flush loop; see ``workers.sync_waiters``), then NOTE_BYTES
of UTF-8 text per writer process saying why its loop fails (read only to explain a refusal, so
a torn read costs nothing but a garbled message).
"""

from __future__ import annotations

import numpy as np

from mqstore.storage.shared_segment import close_segment, open_segment

(WRITTEN, CONFIRMED, ABNORMAL, COMMITTED, FLUSHED, FLUSH_REQUEST, FLUSH_ASK, FLUSH_ASK_LEAST,
 FLUSH_DONE, FLUSH_STOP, FLUSH_IDLE, FLUSH_COUNT, FLUSH_ERROR, DISPATCHED, DISPATCH_IDLE,
 LOGICS_TS, INDEX_TS, DISPATCH_STOP, DISPATCH_FAILS, DISPATCH_STARTED, MIN_PHYS,
 DROPPED, TRUSTED_END, FSYNC_NS) = range(24)
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
        # The slots as a typed memoryview: every pull reads one, and an item of a memoryview
        # is a plain int at a fifth of a numpy element's cost.
        self.values = self.shm.buf[:SLOTS * 8].cast("q")
        self.waiters = cells[SLOTS:]
        self._notes = self.shm.buf[cells_bytes:cells_bytes + _NOTES * NOTE_BYTES]

    @classmethod
    def gone(cls, name: str) -> "SharedPositions":
        """A closed view of the segment ``name`` that no longer exists."""
        view = cls.__new__(cls)
        view.shm, view.owner, view._tracked, view._name = None, False, False, name
        view.values = view.waiters = view._notes = None
        return view

    @property
    def name(self) -> str:
        return self.shm.name if self.shm is not None else self._name

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
        self.values.release()
        self.values = self.waiters = None
        close_segment(self.shm, self.owner, self._tracked)

    def __reduce__(self):
        # Another process attaches by name, tracked or not as the creator made it.
        return (_attach, (self.shm.name, self._tracked))


def _attach(name: str, tracked: bool) -> SharedPositions:
    try:
        return SharedPositions(name, tracked=tracked)
    except FileNotFoundError:
        # The store closed (an open interrupted while it started its workers) before this
        # process attached: a closed view, which tells the worker to exit.
        return SharedPositions.gone(name)


# -- typed channels ------------------------------------------------------------------------
class _Slot:
    """One int64 slot of a channel, read and written as a plain attribute."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    # Through the positions every time: once they are closed their array is gone (None), and
    # a late write (an exit handler's) raises instead of writing into unmapped memory.
    def __get__(self, channel, owner=None) -> int:
        return channel._positions.values[self.index]

    def __set__(self, channel, value: int) -> None:
        channel._positions.values[self.index] = value


class _Channel:
    __slots__ = ("_positions",)

    def __init__(self, positions: SharedPositions) -> None:
        self._positions = positions


class AppendChannel(_Channel):
    written = _Slot(WRITTEN)
    confirmed = _Slot(CONFIRMED)
    abnormal = _Slot(ABNORMAL)
    trusted_end = _Slot(TRUSTED_END)

    def publish_written(self, end: int) -> bool:
        """Move ``written`` forward (it never goes back); True if it moved."""
        values = self._positions.values
        if end > values[WRITTEN]:
            values[WRITTEN] = end
            return True
        return False

    def publish(self, written: int, confirmed: int) -> bool:
        """Both ends at once (the put path); True if ``written`` moved."""
        values = self._positions.values
        moved = written > values[WRITTEN]
        if moved:
            values[WRITTEN] = written
        if confirmed > values[CONFIRMED]:
            values[CONFIRMED] = confirmed
        return moved

    def publish_confirmed(self, end: int) -> None:
        values = self._positions.values
        if end > values[CONFIRMED]:
            values[CONFIRMED] = end


class _NotedChannel(_Channel):
    _note_slot = 0

    @property
    def note(self) -> str:
        return self._positions.note(self._note_slot)

    @note.setter
    def note(self, text: str) -> None:
        self._positions.set_note(self._note_slot, text)


class FlushChannel(_NotedChannel):
    _note_slot = FLUSH_NOTE
    committed = _Slot(COMMITTED)
    flushed = _Slot(FLUSHED)
    request = _Slot(FLUSH_REQUEST)
    ask = _Slot(FLUSH_ASK)
    ask_least = _Slot(FLUSH_ASK_LEAST)
    done = _Slot(FLUSH_DONE)
    stop = _Slot(FLUSH_STOP)
    idle = _Slot(FLUSH_IDLE)
    fsyncs = _Slot(FLUSH_COUNT)
    fsync_ns = _Slot(FSYNC_NS)
    error = _Slot(FLUSH_ERROR)


class DispatchChannel(_NotedChannel):
    _note_slot = DISPATCH_NOTE
    dispatched = _Slot(DISPATCHED)
    idle = _Slot(DISPATCH_IDLE)
    logics_ts = _Slot(LOGICS_TS)
    index_ts = _Slot(INDEX_TS)
    stop = _Slot(DISPATCH_STOP)
    fails = _Slot(DISPATCH_FAILS)
    started = _Slot(DISPATCH_STARTED)


class CleanupChannel(_Channel):
    min_phys = _Slot(MIN_PHYS)
    dropped = _Slot(DROPPED)


class Channels:
    """The store's shared positions, one typed channel per job. Pickles as the segment name
    (the other process attaches)."""

    def __init__(self, positions: SharedPositions) -> None:
        self.positions = positions
        self.append = AppendChannel(positions)
        self.flush = FlushChannel(positions)
        self.dispatch = DispatchChannel(positions)
        self.cleanup = CleanupChannel(positions)

    @classmethod
    def create(cls, name: str | None = None) -> "Channels":
        return cls(SharedPositions(name, create=True))

    @property
    def name(self) -> str:
        return self.positions.name

    @property
    def waiters(self):
        return self.positions.waiters

    @property
    def closed(self) -> bool:
        return self.positions.values is None

    def close(self) -> None:
        self.positions.close()

    def __reduce__(self):
        return (Channels, (self.positions,))

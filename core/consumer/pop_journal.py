"""The files of one topic and group's pop state, shared by every process that pops it.

NOTE [ Pop journal ]
    consumer/pop/<topic>@<group>.json       checkpoint: the state as of its generation g
                                            (``pop_state``), replaced whole by a rename
    consumer/pop/<topic>@<group>.journal    header naming generation g, then one record per
                                            pop, ack batch and change since (``format.pop_record``)
    consumer/pop/<topic>@<group>.json.lock  flock: exclusive around every change, shared
                                            around a read
    consumer/pop/<topic>@<group>.journal.damaged   bytes cut from the journal, kept for study

A change (pop, ack, change of invisible time) takes the exclusive flock, brings the process's
copy of the state up to date (the records other processes appended since it last looked: a
``stat`` of the journal's path, and a read only when the file grew), decides, appends ONE
record in one ``write``, applies it to its copy and lets go. A journal at that path with
another inode than the one the process holds open was replaced (compaction, a cut of damage,
a forgotten group): the process reloads. The comparison cannot be fooled by a recycled inode
number: the descriptor it holds keeps its inode alive. So changes from any number of processes (the writer and read-only
stores) are serialized: none is lost, and no message is handed out twice while in flight. A
record reaches the page cache before the call returns, so it survives the process being
killed; ``consumer.commit_fsync`` also forces it to disk (``fdatasync``) before the call
returns, for power loss.

Compaction (under the exclusive flock, when the journal passes ``COMPACT_BYTES`` and twice the
checkpoint, and when the store closes): write checkpoint g+1 (``.tmp``, fsync, rename, fsync
the directory), then a fresh journal naming g+1 (``.tmp``, rename). Killed in between, the old
journal names g < g+1: its records are in the checkpoint already, and it is replaced. A
journal naming a generation above the checkpoint's means the checkpoint was lost or replaced
by an older one: refused (``CorruptStateError``), never a silent reset. Another process sees
the new journal as a different inode than the one it holds open, and reloads.

Damage (a record cut short by a crash or a full disk, bytes garbled): only the valid prefix
of the journal counts. The state of a prefix is an earlier state, so a cut can deliver
messages again, never lose one (a message is done only once its ack record is read). Under the
exclusive flock the damaged tail is moved to ``.journal.damaged`` and the prefix rewritten as a
new journal (so processes holding records past the cut reload), with a warning naming the
file, the byte and the reason; readers (shared flock) use the prefix and warn. A journal whose
header is unreadable counts for nothing; the group still counts as under way (``has_history``),
so its queues start at their first message, not past what it had not received.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
from typing import Iterator

from mqstore.consumer.pop_state import PopState, journal_path, parse_checkpoint, pop_state_path
from mqstore.errors import CorruptStateError
from mqstore.format import pop_record
from mqstore.storage import state_feed
from mqstore.storage.durable_file import read_all, replace_file, sync_dir

log = logging.getLogger(__name__)

COMPACT_BYTES = 1 << 20
LOCK_SUFFIX = ".lock"
DAMAGED_SUFFIX = ".damaged"


class PopJournal:
    """One topic and group's pop state files, as one process sees them. Thread-safe: a
    mutex serializes this process's threads, the flock other processes."""

    def __init__(self, root: str, topic: str, group: str, *, fsync: bool = False) -> None:
        self.path = pop_state_path(root, topic, group)
        self.journal = journal_path(root, topic, group)
        self._fsync = fsync
        self._mutex = threading.Lock()
        self._lock_fd = -1
        self._fd = -1          # the journal file we hold open (O_APPEND), -1 when none
        self._ino = None       # its (device, inode)
        self._pos = 0          # the end of what our state holds of it
        self._state: PopState | None = None
        self._generation = 0
        self._checkpoint_bytes = 0
        self._writable = False  # the journal descriptor may be written
        self._dirty = False    # records appended since our last compaction
        self._warned: set = set()

    def exists(self) -> bool:
        return os.path.exists(self.journal) or os.path.exists(self.path)

    def has_history(self) -> bool:
        """Whether the state came from files (inside ``changing``): the group popped before,
        even when damage cost the state its queues (they then start at their first message,
        never past what the group had not consumed)."""
        return self._fd >= 0 or self._checkpoint_bytes > 0

    # -- holding the state ----------------------------------------------------------------
    @contextlib.contextmanager
    def changing(self) -> Iterator[PopState]:
        """The state, up to date, under the exclusive flock; change it only with
        ``append``."""
        with self._mutex:
            fd = self._lock()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                yield self._catch_up(repair=True)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def snapshot(self) -> PopState:
        """The state as it is now (shared flock; nothing is written). Do not change it."""
        with self._mutex:
            if not self.exists():
                return PopState()
            fd = self._lock()
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                return self._catch_up(repair=False)
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def append(self, rows: list, rotate: int, delivery: int) -> None:
        """Write one record of ``rows`` (``format.pop_record.ENTRY`` tuples) and apply it
        (inside ``changing``). Raises OSError, with nothing changed, when it cannot be
        written whole."""
        if self._fd < 0:
            self._replace_journal(b"")
        data = pop_record.encode_record(rows, rotate, delivery)
        try:
            written = os.write(self._fd, data)
            if written != len(data):
                raise OSError(f"append to {self.journal} cut short ({written} of {len(data)} "
                              f"bytes)")
            if self._fsync:
                os.fdatasync(self._fd)
        except OSError:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, self._pos)  # no torn record left behind
            raise
        self._pos += len(data)
        self._dirty = True
        self._state.apply(rows, rotate, delivery)
        state_feed.changed(self.journal)
        if self._pos - pop_record.HEADER_SIZE > max(COMPACT_BYTES, 2 * self._checkpoint_bytes):
            try:
                self._compact()
            except OSError as exc:  # the record is written: compaction can wait
                log.warning("compacting %s failed (%s); the journal goes on", self.journal, exc)

    # -- reading the files (flock held) ---------------------------------------------------
    def _lock(self) -> int:
        if self._lock_fd < 0:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                self._lock_fd = os.open(self.path + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
            except PermissionError:  # a reader that may not write here: flock needs no write
                self._lock_fd = os.open(self.path + LOCK_SUFFIX, os.O_RDONLY)
        return self._lock_fd

    def _catch_up(self, repair: bool) -> PopState:
        try:
            st = os.stat(self.journal)
        except FileNotFoundError:
            st = None
        if (self._state is not None and st is not None and self._fd >= 0
                and (st.st_dev, st.st_ino) == self._ino and st.st_size >= self._pos
                and (self._writable or not repair)):
            if st.st_size > self._pos:
                self._read_records(os.pread(self._fd, st.st_size - self._pos, self._pos),
                                   self._pos, repair)
            return self._state
        return self._reload(repair)

    def _reload(self, repair: bool) -> PopState:
        """Checkpoint, then the journal continuing it (our copy was missing or stale)."""
        self._close_journal()
        try:
            with open(self.path, "rb") as f:
                data = f.read()
            state, generation = parse_checkpoint(self.path, data)
            self._checkpoint_bytes = len(data)
        except FileNotFoundError:
            state, generation, self._checkpoint_bytes = PopState(), 0, 0
        self._state, self._generation, self._pos = state, generation, 0
        try:
            fd = self._open_journal(repair)
        except FileNotFoundError:
            return state
        data = read_all(fd)
        try:
            named = pop_record.decode_header(data)
        except ValueError as exc:
            os.close(fd)
            self._damaged(data, 0, f"its header is unreadable ({exc})", repair)
            return state
        if named > generation:
            os.close(fd)
            held = (f"holds generation {generation}" if self._checkpoint_bytes else
                    "is missing")
            raise CorruptStateError(
                f"{self.journal} continues checkpoint generation {named}, but {self.path} "
                f"{held}: the checkpoint was lost or replaced; both are left as they are "
                f"(forget the group with delete_consumer_group to start it afresh)")
        st = os.fstat(fd)
        self._fd, self._ino = fd, (st.st_dev, st.st_ino)
        if named < generation:  # a compaction was cut short: these records are checkpointed
            if repair:
                self._replace_journal(b"")
            else:
                self._pos = len(data)
            return state
        self._pos = pop_record.HEADER_SIZE
        self._read_records(memoryview(data)[pop_record.HEADER_SIZE:], self._pos, repair)
        return state

    def _open_journal(self, repair: bool) -> int:
        try:
            fd = os.open(self.journal, os.O_RDWR | os.O_APPEND)
            self._writable = True
        except PermissionError:
            if repair:
                raise
            fd = os.open(self.journal, os.O_RDONLY)  # a reader that may not write here
            self._writable = False
        return fd

    def _read_records(self, data, at: int, repair: bool) -> None:
        found = pop_record.scan(data)
        for rows, rotate, delivery in found.records:
            self._state.apply(rows.tolist(), rotate, delivery)
        self._pos = at + found.end
        if found.damage is not None:
            self._damaged(data[found.end:], self._pos, found.damage, repair)

    def _damaged(self, tail, at: int, why: str, repair: bool) -> None:
        """Report a damaged journal tail (``tail`` starts at byte ``at``; 0: the header) and,
        when we may write, move it aside and cut it off."""
        key = (self._ino, at, len(tail))
        if not repair:
            if key not in self._warned:
                self._warned.add(key)
                log.warning("%s: %s; the %d bytes from byte %d on are passed over (the state "
                            "before them counts)", self.journal, why, len(tail), at)
            return
        with open(self.journal + DAMAGED_SUFFIX, "ab") as f:
            f.write(bytes(tail))
        log.warning("%s: %s; cut the %d bytes from byte %d on (kept in %s): their pops, acks "
                    "and changes are undone, so those messages are delivered again",
                    self.journal, why, len(tail), at, self.journal + DAMAGED_SUFFIX)
        # A new file, not a truncation in place: another process that holds records past
        # the cut sees a new inode and reloads, rather than reading on from its old position
        # into records appended after the cut.
        kept = b"" if at < pop_record.HEADER_SIZE else os.pread(
            self._fd, at - pop_record.HEADER_SIZE, pop_record.HEADER_SIZE)
        self._replace_journal(kept)

    # -- writing the files (exclusive flock held) -----------------------------------------
    def _replace_journal(self, records: bytes) -> None:
        """Put a journal naming our generation, holding ``records``, in place of the old."""
        tmp = self.journal + ".tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = os.open(tmp, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            data = pop_record.encode_header(self._generation) + records
            if os.write(fd, data) != len(data):
                raise OSError(f"writing {tmp} cut short")
            if self._fsync:
                os.fdatasync(fd)
            os.replace(tmp, self.journal)
        except BaseException:
            os.close(fd)
            raise
        state_feed.changed(self.journal)
        if self._fsync:
            sync_dir(os.path.dirname(self.journal))
        self._close_journal()
        st = os.fstat(fd)
        self._fd, self._ino, self._pos = fd, (st.st_dev, st.st_ino), len(data)
        self._writable = True

    def _compact(self) -> None:
        generation = self._generation + 1
        data = _json_bytes(self._state.to_doc(generation))
        # Forced always: the new journal must never land before it.
        replace_file(self.path, data, fsync=True)
        try:
            sync_dir(os.path.dirname(self.path))
            self._checkpoint_bytes = len(data)
            self._generation = generation
            self._replace_journal(b"")
        except BaseException:
            # The checkpoint is g+1 and the journal we hold names g: reload next time (which
            # replaces that journal) rather than append where no reader will look.
            self._close_journal()
            self._state = None
            raise
        self._dirty = False

    def remove(self) -> None:
        """Forget the state: checkpoint and journal go (the lock file stays: others may hold
        it)."""
        with self._mutex:
            fd = self._lock()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                for path in (self.path, self.journal, self.journal + DAMAGED_SUFFIX):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                state_feed.changed(self.journal)
                self._close_journal()
                self._state, self._dirty = None, False
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)

    def _close_journal(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd, self._ino = -1, None

    def release(self) -> None:
        """Let the descriptors go (journal and lock) and forget the state, compacting nothing:
        the next change or snapshot reopens the files and reloads, checking the journal's inode
        against the descriptor it then holds, as any reload does (an inode number remembered
        without its descriptor could be recycled). What this process appended stays in the
        journal, which a later compaction folds into the checkpoint."""
        with self._mutex:
            self._close_journal()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            self._state = None

    def close(self) -> None:
        """Compact what this process appended, then let the files go."""
        with self._mutex:
            if self._dirty and self._lock_fd >= 0:
                try:
                    fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
                    try:
                        self._catch_up(repair=True)
                        if self._pos > pop_record.HEADER_SIZE:
                            self._compact()
                    finally:
                        fcntl.flock(self._lock_fd, fcntl.LOCK_UN)
                except (OSError, CorruptStateError) as exc:
                    log.warning("compacting %s at close failed (%s); its journal keeps the "
                                "state", self.journal, exc)
            self._close_journal()
            if self._lock_fd >= 0:
                os.close(self._lock_fd)
                self._lock_fd = -1
            self._state = None


def state_exists(root: str, topic: str, group: str) -> bool:
    """Whether ``group`` has pop state for ``topic`` in the store at ``root`` (a checkpoint or
    a journal; the lock file alone is not state), without opening anything."""
    return (os.path.exists(journal_path(root, topic, group))
            or os.path.exists(pop_state_path(root, topic, group)))


def _json_bytes(doc: dict) -> bytes:
    import json
    return json.dumps(doc, separators=(",", ":")).encode()


"""Committed consumer offsets in RocketMQ's ``config/consumerOffset.json``, and their journal.

The document is the broker's ``ConsumerOffsetManager`` file, in the same shape, so RocketMQ's
tools read what mqstore commits and mqstore reads what a broker left::

    {"offsetTable": {"<topic>@<group>": {"<queue id>": <next queue offset to consume>, ...}, ...}}

An offset is the queue offset of the first message the group has *not* consumed (RocketMQ's
meaning: a group that consumed offsets 0..11 of queue 0 commits 12). Other top-level keys a
broker wrote (``dataVersion``, ``pullOffsetTable`` ...) are kept. RocketMQ writes the file with
fastjson, whose integer map keys carry no quotes (``{0:12}``); such a file is read as well,
and written back as standard JSON (fastjson reads both).

NOTE [ Offset journal ]
A rename over an existing file makes the file system write the new one out first (ext4's
replace-via-rename), which costs a millisecond or more while the disk is busy: too much for a
commit every thousand messages. So, as a RocketMQ broker commits to memory and persists the
table every ``flushConsumerOffsetInterval``, a commit appends to a journal and the document is
rewritten every ``consumer.persist_interval_ms``:

    consumerOffset.json            the document, rewritten whole (NOTE [ Locked JSON files ])
    consumerOffset.json.lock       shared by commits and reads, exclusive for a rewrite
    consumerOffset.json.journal    commits since the last rewrite, one line each:

    +-------------------+---+---------+---+----------+---+------------------+----+
    | <topic>@<group>   | ␠ | queue   | ␠ | offset   | ␠ | crc32, 8 hex     | \\n |
    +-------------------+---+---------+---+----------+---+------------------+----+
    total = one line; the crc covers the text before it

A commit appends its lines in one write under the shared lock; a rewrite (exclusive lock)
applies the journal to the document, renames the new document into place, then empties the
journal, so no commit lands between the two and none is lost; a read holds the shared lock and
applies the journal to the document. A commit survives its process being killed (the journal
is in the page cache); with ``consumer.commit_fsync`` also power loss (each append is forced).
A line cut short or damaged is skipped. Until the next rewrite the document alone lags the
journal by up to ``persist_interval_ms``, as a broker's file lags its memory; a consumer that
closes rewrites it, so after a clean close the document is complete.
"""

from __future__ import annotations

import json
import logging
import os
import re
import zlib
from typing import Iterable, Mapping

from mqstore.consumer import offset_marks
from mqstore.consumer.locked_json import LockedJson
from mqstore.consumer.offset_schema import TABLE, check_offsets, is_entry
from mqstore.errors import CorruptStateError
from mqstore.scheduler import Scheduler, system_scheduler
from mqstore.storage import state_feed

log = logging.getLogger(__name__)

CONFIG_DIR = "config"
OFFSET_FILE = "consumerOffset.json"
JOURNAL_SUFFIX = ".journal"
JOURNAL_REL = f"{CONFIG_DIR}/{OFFSET_FILE}{JOURNAL_SUFFIX}"  # as the change feed names it
JOURNAL_FOLD_BYTES = 64 << 10  # rewrite sooner when the journal grows past this
_BARE_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def decode_offsets(text: str) -> dict:
    """Standard JSON, or fastjson's with unquoted integer keys, of the shape
    ``offset_schema`` describes (ValueError saying what is wrong otherwise)."""
    try:
        doc = json.loads(text)
    except ValueError:
        doc = json.loads(_BARE_INT_KEY.sub(r'\1"\2"\3', text))
    return check_offsets(doc)


def table_key(topic: str, group: str) -> str:
    return f"{topic}@{group}"


def journal_lines(key: str, offsets: Mapping[int, int]) -> bytes:
    out = []
    for q, off in offsets.items():
        text = f"{key} {int(q)} {int(off)}"
        out.append(f"{text} {zlib.crc32(text.encode()):08x}\n")
    return "".join(out).encode()


def read_journal(data: bytes) -> tuple[list[tuple[str, int, int]], int]:
    """The entries of a journal, in order, and how many lines were skipped as damaged."""
    entries, bad = [], 0
    for line in data.split(b"\n"):
        if not line:
            continue
        text, _, crc = line.rpartition(b" ")
        parts = text.split(b" ")
        try:
            if len(parts) != 3 or int(crc, 16) != zlib.crc32(text):
                raise ValueError
            entry = (parts[0].decode(), int(parts[1]), int(parts[2]))
            if not is_entry(*entry):  # a line the journal never holds, however its CRC reads
                raise ValueError
            entries.append(entry)
        except ValueError:
            bad += 1
    return entries, bad


def _table(doc: dict) -> dict:
    return doc[TABLE]  # there, and of the right shape: decode_offsets checked it


class ConsumerOffsets:
    """The offset table of one store directory (document + journal). Thread-safe."""

    def __init__(self, root: str, *, fsync: bool = False, persist_interval_ms: int = 5_000,
                 scheduler: Scheduler = system_scheduler) -> None:
        self.root = root
        self.path = os.path.join(root, CONFIG_DIR, OFFSET_FILE)
        self.journal_path = self.path + JOURNAL_SUFFIX
        self._file = LockedJson(self.path, empty=lambda: {TABLE: {}}, decode=decode_offsets,
                                fsync=fsync)
        self._fsync = fsync
        self._persist_s = persist_interval_ms / 1000.0
        self._scheduler = scheduler
        self._journal_fd = -1
        self._last_persist = scheduler.monotonic()
        self._marked: set[str] = set()  # keys this instance saw marked (offset_marks)

    # -- reading --------------------------------------------------------------------------
    def _snapshot(self, key: str | None = None) -> dict[str, dict[int, int]]:
        """``topic@group`` -> offsets: the document with the journal applied. A group marked
        as having offsets (``offset_marks``) that has none (of every group, or the one of
        ``key``) is refused, not read as new."""
        if not os.path.exists(self.journal_path):
            # No commit was ever journaled here: the document alone is the state, and reading
            # it takes no lock (so reading a broker's directory creates nothing in it).
            out = self._read(journal=False)
        else:
            with self._file.locked(shared=True):
                out = self._read(journal=True)
        if self._lost(out, key):
            # Looked at again while no rewrite or deletion can be under way.
            with self._file.locked(shared=True):
                out = self._read(journal=True)
                lost = self._lost(out, key)
            if lost:
                topic, group = lost[0]
                state = "holds none" if os.path.exists(self.path) else "is missing"
                raise CorruptStateError(
                    f"{self.path} has no offsets for group {group!r} on topic {topic!r} (the "
                    f"file {state}), but {offset_marks.mark_path(self.root, group, topic)} says "
                    f"the group recorded some: the file was replaced or damaged, and reading it "
                    f"would start the group over at its consume_from. It is left as it is: "
                    f"restore it, or forget the group with store.delete_consumer_group"
                    f"({group!r}, {topic!r}) to start it afresh")
        return out

    def _read(self, journal: bool) -> dict[str, dict[int, int]]:
        doc = self._file.read()
        entries = self._journal_entries()[0] if journal else []
        out = {key: {int(q): off for q, off in entry.items()}
               for key, entry in doc[TABLE].items()}
        for key, q, off in entries:
            out.setdefault(key, {})[q] = off
        return out

    def _lost(self, out: dict, key: str | None) -> list[tuple[str, str]]:
        """Marked ``(topic, group)`` pairs (all, or ``key``'s) that ``out`` has no offsets
        for."""
        return [(t, g) for t, g in offset_marks.marked(self.root)
                if table_key(t, g) not in out and key in (None, table_key(t, g))]

    def table(self) -> dict[tuple[str, str], dict[int, int]]:
        """Every ``(topic, group)`` with its offsets by queue."""
        out = {}
        for key, offsets in self._snapshot().items():
            topic, sep, group = key.rpartition("@")
            if sep:
                out[(topic, group)] = offsets
        return out

    def offsets(self, topic: str, group: str) -> dict[int, int]:
        key = table_key(topic, group)
        return self._snapshot(key).get(key, {})

    # -- committing -----------------------------------------------------------------------
    def commit(self, topic: str, group: str, offsets: Mapping[int, int]) -> None:
        """Set the given queues' offsets (others of the group, and other groups, stay)."""
        if not offsets:
            return
        if self._persist_s <= 0:  # every commit rewrites the document
            key = table_key(topic, group)

            def change(doc: dict):
                self._fold(doc)
                entry = _table(doc).setdefault(key, {})
                for q, off in offsets.items():
                    entry[str(q)] = int(off)
                return True, None
            self._file.update(change, after=lambda: self._after_rewrite(mark=(topic, group)))
            return
        data = journal_lines(table_key(topic, group), offsets)
        with self._file.locked(shared=True):
            fd = self._journal()
            written = os.write(fd, data)
            if written != len(data):  # a full disk: what was written is one damaged line
                raise OSError(f"commit to {self.journal_path} cut short ({written} of "
                              f"{len(data)} bytes)")
            if self._fsync:
                os.fdatasync(fd)
            size = os.lseek(fd, 0, os.SEEK_CUR)
            self._mark(topic, group)
            state_feed.changed_in(self.root, JOURNAL_REL)
        if size >= JOURNAL_FOLD_BYTES \
                or self._scheduler.monotonic() - self._last_persist >= self._persist_s:
            self.persist()

    def persist(self) -> None:
        """Rewrite the document with the journal applied, and empty the journal."""
        self._last_persist = self._scheduler.monotonic()
        try:
            if os.stat(self.journal_path).st_size == 0:
                return
        except FileNotFoundError:
            return

        def change(doc: dict):
            return self._fold(doc) > 0, None
        self._file.update(change, after=self._empty_journal)

    def start_where_absent(self, topic: str, group: str,
                           offsets: Mapping[int, int]) -> dict[int, int]:
        """Record each queue's offset unless the group has one there already; returns the
        offsets now recorded for those queues (another process may have been first)."""
        key = table_key(topic, group)

        def change(doc: dict):
            folded = self._fold(doc)
            entry = _table(doc).setdefault(key, {})
            missing = {q: off for q, off in offsets.items() if str(q) not in entry}
            for q, off in missing.items():
                entry[str(q)] = int(off)
            return bool(missing or folded), {q: int(entry[str(q)]) for q in offsets}
        return self._file.update(change, after=lambda: self._after_rewrite(mark=(topic, group)))

    def delete(self, group: str, topics: Iterable[str] | None = None) -> list[tuple[str, str]]:
        """Remove the group's entries (of ``topics``, or all); returns what was removed."""
        wanted = None if topics is None else set(topics)

        def change(doc: dict):
            folded = self._fold(doc)
            table = _table(doc)
            gone = []
            for key in list(table):
                topic, sep, g = key.rpartition("@")
                if sep and g == group and (wanted is None or topic in wanted):
                    del table[key]
                    gone.append((topic, g))
            return bool(gone or folded), gone

        def forget() -> None:
            self._empty_journal()
            offset_marks.remove(self.root, group, wanted)  # with the offsets, under the lock
            self._marked.clear()  # the next commit of every group looks again
        if not os.path.exists(self.path) and not os.path.exists(self.journal_path):
            with self._file.locked(shared=False):
                forget()  # the offsets were lost already: only the marks are left to go
            return []
        return self._file.update(change, after=forget)

    # -- marks and the journal (callers hold the lock) ------------------------------------
    def _mark(self, topic: str, group: str) -> None:
        key = table_key(topic, group)
        if key not in self._marked:
            offset_marks.make(self.root, group, topic)
            self._marked.add(key)

    def _after_rewrite(self, mark: tuple[str, str]) -> None:
        self._empty_journal()
        self._mark(*mark)

    def _journal(self) -> int:
        if self._journal_fd < 0:
            try:
                self._journal_fd = os.open(self.journal_path,
                                           os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
            except IsADirectoryError:
                raise self._not_a_journal() from None
        return self._journal_fd

    def _not_a_journal(self) -> CorruptStateError:
        return CorruptStateError(f"{self.journal_path} is a directory, not the offset journal; "
                                 f"it is left as it is: remove it")

    def _journal_entries(self) -> tuple[list[tuple[str, int, int]], int]:
        try:
            with open(self.journal_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return [], 0
        except IsADirectoryError:
            raise self._not_a_journal() from None
        entries, bad = read_journal(data)
        if bad:
            log.warning("%s: %d damaged line(s) skipped (a commit cut short by a crash)",
                        self.journal_path, bad)
        return entries, bad

    def _fold(self, doc: dict) -> int:
        """Apply the journal to ``doc`` (exclusive lock held); returns the lines it had
        (damaged ones too: the rewrite that follows lets them go)."""
        entries, bad = self._journal_entries()
        table = _table(doc)
        for key, q, off in entries:
            table.setdefault(key, {})[str(q)] = off
        return len(entries) + bad

    def _empty_journal(self) -> None:
        """After the document holding the journal's entries replaced the old one."""
        if os.path.exists(self.journal_path):
            os.truncate(self.journal_path, 0)
            state_feed.changed_in(self.root, JOURNAL_REL)

    def close(self) -> None:
        if self._journal_fd >= 0:
            try:
                self.persist()
            except Exception:
                log.exception("rewriting %s at close failed; its journal keeps the commits",
                              self.path)
            os.close(self._journal_fd)
            self._journal_fd = -1
        self._file.close()

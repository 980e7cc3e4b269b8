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
import time
import zlib
from typing import Iterable, Mapping

from mqstore.consumer.locked_json import LockedJson

log = logging.getLogger("mqstore.consumer")

CONFIG_DIR = "config"
OFFSET_FILE = "consumerOffset.json"
JOURNAL_SUFFIX = ".journal"
TABLE = "offsetTable"
JOURNAL_FOLD_BYTES = 64 << 10  # rewrite sooner when the journal grows past this
_BARE_INT_KEY = re.compile(r'([{,]\s*)(-?\d+)(\s*:)')


def decode_offsets(text: str) -> dict:
    """Standard JSON, or fastjson's with unquoted integer keys."""
    try:
        return json.loads(text)
    except ValueError:
        return json.loads(_BARE_INT_KEY.sub(r'\1"\2"\3', text))


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
            entries.append((parts[0].decode(), int(parts[1]), int(parts[2])))
        except ValueError:
            bad += 1
    return entries, bad


def _queue_offsets(entry) -> dict[int, int]:
    if not isinstance(entry, dict):
        return {}
    out = {}
    for q, off in entry.items():
        try:
            out[int(q)] = int(off)
        except (TypeError, ValueError):
            continue  # not something a RocketMQ broker writes; not ours to interpret
    return out


def _table(doc: dict) -> dict:
    table = doc.get(TABLE)
    if not isinstance(table, dict):
        table = doc[TABLE] = {}
    return table


class ConsumerOffsets:
    """The offset table of one store directory (document + journal). Thread-safe."""

    def __init__(self, root: str, *, fsync: bool = False, persist_interval_ms: int = 5_000
                 ) -> None:
        self.path = os.path.join(root, CONFIG_DIR, OFFSET_FILE)
        self.journal_path = self.path + JOURNAL_SUFFIX
        self._file = LockedJson(self.path, empty=lambda: {TABLE: {}}, decode=decode_offsets,
                                fsync=fsync)
        self._fsync = fsync
        self._persist_s = persist_interval_ms / 1000.0
        self._journal_fd = -1
        self._last_persist = time.monotonic()

    # -- reading --------------------------------------------------------------------------
    def _snapshot(self) -> dict[str, dict[int, int]]:
        """``topic@group`` -> offsets: the document with the journal applied."""
        if not os.path.exists(self.journal_path):
            # No commit was ever journaled here: the document alone is the state, and reading
            # it takes no lock (so reading a broker's directory creates nothing in it).
            doc, entries = self._file.read(), []
        else:
            with self._file.locked(shared=True):
                doc = self._file.read()
                entries = self._journal_entries()[0]
        out = {key: _queue_offsets(entry) for key, entry in (doc.get(TABLE) or {}).items()}
        for key, q, off in entries:
            out.setdefault(key, {})[q] = off
        return out

    def table(self) -> dict[tuple[str, str], dict[int, int]]:
        """Every ``(topic, group)`` with its offsets by queue."""
        out = {}
        for key, offsets in self._snapshot().items():
            topic, sep, group = key.rpartition("@")
            if sep:
                out[(topic, group)] = offsets
        return out

    def offsets(self, topic: str, group: str) -> dict[int, int]:
        return self._snapshot().get(table_key(topic, group), {})

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
            self._file.update(change, after=self._empty_journal)
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
        if size >= JOURNAL_FOLD_BYTES or time.monotonic() - self._last_persist >= self._persist_s:
            self.persist()

    def persist(self) -> None:
        """Rewrite the document with the journal applied, and empty the journal."""
        self._last_persist = time.monotonic()
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
        return self._file.update(change, after=self._empty_journal)

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
        if not os.path.exists(self.path) and not os.path.exists(self.journal_path):
            return []
        return self._file.update(change, after=self._empty_journal)

    # -- the journal (callers hold the lock) ----------------------------------------------
    def _journal(self) -> int:
        if self._journal_fd < 0:
            self._journal_fd = os.open(self.journal_path,
                                       os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o644)
        return self._journal_fd

    def _journal_entries(self) -> tuple[list[tuple[str, int, int]], int]:
        try:
            with open(self.journal_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return [], 0
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
            entry = table.get(key)
            if not isinstance(entry, dict):
                entry = table[key] = {}
            entry[str(q)] = off
        return len(entries) + bad

    def _empty_journal(self) -> None:
        """After the document holding the journal's entries replaced the old one."""
        if os.path.exists(self.journal_path):
            os.truncate(self.journal_path, 0)

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

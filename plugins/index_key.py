"""Key index: RocketMQ index files over every message's KEYS tokens and UNIQ_KEY (spec 5).

A dispatcher: for each record (rolled-back transactions excepted) it puts ``topic#UNIQ_KEY``
then ``topic#key`` for each KEYS token into the newest file in ``index/``, rolling to a new file
(named by the store clock's local time, ``yyyyMMddHHmmssSSS``) when it is full.

On open it loads the files (slot and entry counts from the config, or from the file size with
RocketMQ's 4 entries per slot when they differ), drops files a crash may have left half written
(after an abnormal exit: those newer than the checkpoint's index time) and files that fail their
consistency check, and asks dispatch to resume from the end of what is left, so every message in
the commit log is indexed again; after a trusted clean-shutdown marker, with no file dropped,
from the end it vouches for (see ``_indexed_until``). ``candidates`` answers lookups newest
first; the store then reads each message and keeps only real key matches.
"""

from __future__ import annotations

import logging
import os
import threading
import time

import numpy as np

from mqstore.plugin_api import (
    CHECKPOINTS, DROPS_OLD_FILES, LOOKS_UP_KEYS, PERSISTS, READER, RESUMES, WRITER, hookimpl,
)
from mqstore.plugin_api.index import (
    HASH_MMH3, INDEX_DIR, PROGRESS_FILE, PROPERTY_KEYS, PROPERTY_UNIQ_KEY, SYSFLAG_TX_MASK,
    TX_ROLLBACK, IndexFile, IndexProgress, bytes_hasher, hash_ranges, key_ranges, read_progress,
    record_keys, write_progress,
)
from mqstore.plugin_api.index import layout as L

log = logging.getLogger(__name__)

INT64_MAX = (1 << 63) - 1
# Passes of at most this many records (a trickle of single puts) find and hash their keys
# record by record, and at most FEW_KEYS keys go in entry by entry: below these sizes the
# array passes' fixed costs outweigh what they save per key.
FEW_RECORDS = 128
FEW_KEYS = 8


def index_file_name(ms: int) -> str:
    return time.strftime("%Y%m%d%H%M%S", time.localtime(ms / 1000)) + f"{ms % 1000:03d}"


class KeyIndex:
    capabilities = frozenset({RESUMES, LOOKS_UP_KEYS, DROPS_OLD_FILES, PERSISTS, CHECKPOINTS})

    def __init__(self, store, role: str = WRITER) -> None:
        cfg = store.config.index
        self.store = store
        self.directory = os.path.join(store.root, INDEX_DIR)
        # A follower (the store process while a worker writes) or a reader (a read-only
        # store) maps the files read-only and picks up what the writer adds.
        self.read_only = role != WRITER
        self._role = role
        self.slots, self.entries = cfg.max_hash_slots, cfg.max_index_entries
        self._hash = store.string_hash
        self._hash_bytes = bytes_hasher(store.hash_kind)
        self._vector_hash = store.hash_kind == HASH_MMH3  # Java's hash needs decoded strings
        self._topic_prefixes: dict[str, bytes] = {}
        self._lock = threading.Lock()  # guards the file list against concurrent lookups
        # ``persist`` (another thread in thread mode) sees the files between two batches.
        self._write_lock = threading.Lock()
        self.files: list[IndexFile] = []
        self._persisted: IndexProgress | None = None
        self._resume_at: int | None = None  # set when the recorded progress was taken up
        self._forced_until_ts = 0  # newest store time a full, forced file covers (CHECKPOINTS)
        kept_all = self._load(store.recovery_report)
        self._next_phys = self._indexed_until(store, kept_all)
        if not self.read_only:
            # Never past the end recovery left: what the files indexed beyond it is gone (a
            # lost newest segment), and the next puts take those offsets with other messages.
            self._next_phys = min(self._next_phys, store.recovery_report.commit_log_end)

    # -- open ------------------------------------------------------------------------------
    def _open_file(self, path: str) -> IndexFile:
        size = os.path.getsize(path)
        if size == L.file_size(self.slots, self.entries):
            return IndexFile.load(path, self.slots, self.entries, read_only=self.read_only)
        return IndexFile.load(path, read_only=self.read_only)

    def _load(self, report) -> bool:
        """Load the files; False when one was dropped (it and what follows are rebuilt)."""
        names = (sorted(n for n in os.listdir(self.directory) if n.isdigit())
                 if os.path.isdir(self.directory) else [])
        progress = self._recorded_progress(report, names)
        keep_until = self.store.checkpoint.index_msg_timestamp
        for i, name in enumerate(names):
            path = os.path.join(self.directory, name)
            if progress is not None and (progress.file is None or int(name) > int(progress.file)):
                # Begun after the progress was recorded: its records are indexed again.
                if not self.read_only:
                    report.notes.append(f"index: dropped {path}, begun after the recorded "
                                        f"progress; re-indexed from {progress.indexed_until}")
                    os.unlink(path)
                continue
            problem: str | None
            try:
                f = self._open_file(path)
            except (ValueError, OSError) as exc:
                problem = f"{path}: {exc}"
            else:
                if progress is None or name != progress.file:
                    problem = f.check_header()
                elif not self.read_only:
                    # Written since its last trusted close, and kept: every entry is checked
                    # (a damaged one would steer lookups away from messages it indexes).
                    problem = self._roll_back(f, progress.header, report) or f.verify()
                else:  # the follower of a writer that is rolling this file back
                    problem = None
                # With a recorded progress the older files were full, so forced to disk,
                # before the newer ones began.
                if (problem is None and report.abnormal and progress is None
                        and f.end_timestamp > keep_until):
                    problem = (f"{path} may be half written (abnormal exit; ends at "
                               f"{f.end_timestamp} > checkpoint {keep_until})")
                if problem is None:
                    self.files.append(f)
                    continue
                f.close() if self.read_only else f.destroy()
            # Everything from the first bad file on is rebuilt from the commit log.
            self._resume_at = None
            report.notes.append(f"index: dropped {problem}; rebuilt from the commit log")
            for later in names[i + 1:]:
                later_path = os.path.join(self.directory, later)
                if os.path.exists(later_path):
                    report.notes.append(f"index: dropped {later_path} after it; rebuilt")
                    if not self.read_only:
                        os.unlink(later_path)
            if not self.read_only and os.path.exists(path):
                os.unlink(path)
            return False
        return True

    def _recorded_progress(self, report, names: list[str]) -> IndexProgress | None:
        """The progress recorded by ``persist`` when recovery may use it (a writer after a
        crash, the recorded file still there; or no file recorded and none found)."""
        # A reader may run beside a live writer, whose files are all current.
        if self._role == READER or report.trusted_end >= 0:
            return None
        progress, problem = read_progress(self.store.root)
        if problem is not None:
            report.notes.append(f"index: progress record ignored: {problem}")
            return None
        if progress is None:
            return None
        if progress.file is None and names and not report.abnormal:
            return None  # files begun since were closed cleanly: they are whole
        if progress.file is not None and (progress.file not in names or not report.abnormal):
            return None
        self._resume_at = progress.indexed_until
        report.notes.append(f"index: resumes at {progress.indexed_until}, where its recorded "
                            f"progress ends ({PROGRESS_FILE})")
        return progress

    def _roll_back(self, f: IndexFile, header, report) -> str | None:
        """Roll ``f`` back to its recorded header; what is wrong when it cannot be."""
        stored = f.stored_header
        if header.index_count > L.FIRST_INDEX and stored.index_count > L.FIRST_INDEX and (
                stored.begin_phys_offset, stored.begin_timestamp) != (
                header.begin_phys_offset, header.begin_timestamp):
            return (f"{f.path} does not begin where the recorded progress says "
                    f"(phys {stored.begin_phys_offset}, not {header.begin_phys_offset})")
        try:
            f.roll_back(header)
        except (ValueError, OSError) as exc:
            return f"{f.path}: cannot roll back to the recorded progress ({exc})"
        report.notes.append(f"index: {f.path} rolled back to its {header.index_count - 1} "
                            f"entries on disk; re-indexed from {self._resume_at}")
        return None

    def _indexed_until(self, store, kept_all: bool) -> int:
        """End of the indexed part of the log.

        After a trusted clean-shutdown marker (``trusted_end``), with every file kept: the
        files are those the index had at the close, when every record below that end had
        been indexed, whether or not it had keys; so nothing is indexed again, even when
        no message ever had a key (no file to say so) or the last keys are long past.

        Otherwise from the files: the header only names the last indexed record's start;
        after a clean exit that record is complete, after a crash its keys may be cut (they
        can straddle two files), so it is indexed again. No file with an entry: everything
        is indexed again (the directory may have been deleted)."""
        trusted = store.recovery_report.trusted_end
        if trusted >= 0 and kept_all:
            return trusted
        if self._resume_at is not None and kept_all:
            return self._resume_at
        if not self.files or self.files[-1].index_count <= L.FIRST_INDEX:
            return -1
        last = self.files[-1].end_phys_offset
        if store.recovery_report.abnormal:
            return last
        msg = store.message_at(last) if last < store.commit_log.max_offset else None
        return last + msg.size if msg is not None else last

    def checkpoint_time(self) -> int:
        return self._forced_until_ts

    def resume_offset(self) -> int:
        """Commit-log offset from which records must be indexed again."""
        return max(self._next_phys, 0)

    # -- dispatch --------------------------------------------------------------------------
    def dispatch(self, batch) -> None:
        todo = (batch.phys_offsets >= self._next_phys) & (
            (batch.sysflags & SYSFLAG_TX_MASK) != TX_ROLLBACK)
        rows = np.flatnonzero(todo)
        with self._write_lock:
            if len(rows) and _may_hold_keys(batch.properties):
                self._index_rows(batch, rows)
            self._next_phys = max(self._next_phys, batch.end)

    def persist(self) -> None:
        """Force the newest file to disk, then record how far the index is on disk
        (``index_progress``): a recovery after a crash rolls back to there."""
        if self.read_only:
            return
        with self._write_lock:
            f = self.files[-1] if self.files else None
            progress = IndexProgress(None if f is None else os.path.basename(f.path),
                                     None if f is None else f.header, self._next_phys)
            if progress == self._persisted or progress.indexed_until <= 0:
                return
            try:
                if f is not None:
                    f.flush()
                write_progress(self.store.root, progress)
            except OSError as exc:  # a full disk among others: recovery re-indexes more
                log.warning("index progress not recorded: %s", exc)
                return
            self._persisted = progress

    def _index_rows(self, batch, rows: np.ndarray) -> None:
        """Entries for the keys of ``rows``: per record its UNIQ_KEY, then each KEYS token."""
        if len(rows) <= FEW_RECORDS and self._vector_hash:
            self._index_few(batch, rows.tolist())
            return
        props, topics = batch.properties, batch.topics
        every = len(rows) == len(props)  # the usual case: no rollback, nothing indexed twice
        picked = rows.tolist()
        keys = key_ranges(props if every else [props[i] for i in picked])
        if not len(keys.message):
            return
        row_topics = topics if every else [topics[i] for i in picked]
        hashes = self._hash_keys(keys, row_topics)
        hashes = np.where(hashes == L.INT32_MIN, 0, np.abs(hashes))
        src = rows[keys.message]
        self._put_many(hashes, batch.phys_offsets[src], batch.store_timestamps[src])

    def _index_few(self, batch, rows: list[int]) -> None:
        """``_index_rows`` record by record (mmh3 stores): the same keys in the same order,
        the same hashes (``_hash_ranges``'s), the same entries."""
        props, topics = batch.properties, batch.topics
        hashes: list[int] = []
        src: list[int] = []
        for i in rows:
            keys = record_keys(props[i])
            if not keys:
                continue
            topic = topics[i]
            prefix = self._prefix(topic)
            for key in keys:
                h = self._hash_bytes(prefix + key) if key.isascii() else (
                    self._hash_not_ascii(topic, prefix, key))
                hashes.append(0 if h == L.INT32_MIN else abs(h))
                src.append(i)
        if len(hashes) <= FEW_KEYS:
            phys, times = batch.phys_offsets.tolist(), batch.store_timestamps.tolist()
            for h, i in zip(hashes, src):
                self._put_one(h, phys[i], times[i])
        elif hashes:
            picked = np.array(src, dtype=np.int64)
            self._put_many(np.array(hashes, dtype=np.int64), batch.phys_offsets[picked],
                           batch.store_timestamps[picked])

    def _hash_not_ascii(self, topic: str, prefix: bytes, key: bytes) -> int:
        try:
            key.decode("utf-8")
        except UnicodeDecodeError:  # keyed as a read decodes it, as ``_hash_ranges`` does
            return self._hash(f"{topic}#{key.decode('utf-8', errors='replace')}")
        return self._hash_bytes(prefix + key)

    def _hash_keys(self, keys, row_topics: list[str]) -> np.ndarray:
        """The store hash of ``topic#key`` for every key found, topic by topic."""
        names = set(row_topics)
        if len(names) == 1:
            return self._hash_ranges(keys, names.pop(), np.arange(len(keys.message)))
        ids = {name: i for i, name in enumerate(dict.fromkeys(row_topics))}
        topic_of_row = np.fromiter(map(ids.__getitem__, row_topics), dtype=np.int64,
                                   count=len(row_topics))
        topic_of_key = topic_of_row[keys.message]
        hashes = np.empty(len(keys.message), dtype=np.int64)
        for name, tid in ids.items():
            sel = np.flatnonzero(topic_of_key == tid)
            hashes[sel] = self._hash_ranges(keys, name, sel)
        return hashes

    def _hash_ranges(self, keys, topic: str, sel: np.ndarray) -> np.ndarray:
        """Hashes of keys ``sel`` (all of ``topic``), with array passes over all of them;
        with Java's hash only ASCII keys are (one code unit per byte), the rest key by key."""
        starts, lengths = keys.start[sel], keys.length[sel]
        if self._vector_hash:
            hashes = hash_ranges(keys.data, starts, lengths, self._prefix(topic))
            for i, key in not_utf8(keys.data, starts, lengths):
                # Keyed as every read decodes it (bad bytes as U+FFFD), as Java's hash keys
                # it: a lookup by the key a read shows finds it, and check agrees.
                hashes[i] = self._hash(f"{topic}#{key}")
            return hashes
        hashes, ascii_ = java_hash_ranges(keys.data, starts, lengths,
                                          self._hash(topic + "#") & 0xFFFFFFFF)
        if not ascii_.all():
            prefix = self._prefix(topic)
            for i in np.flatnonzero(~ascii_).tolist():
                at = int(starts[i])
                hashes[i] = self._hash_bytes(prefix + keys.data[at:at + int(lengths[i])].tobytes())
        return hashes

    def _prefix(self, topic: str) -> bytes:
        prefix = self._topic_prefixes.get(topic)
        if prefix is None:
            prefix = self._topic_prefixes[topic] = topic.encode("utf-8") + b"#"
        return prefix

    def _put_many(self, hashes: np.ndarray, phys: np.ndarray, times: np.ndarray) -> None:
        done = 0
        while done < len(hashes):
            f = self.files[-1] if self.files else None
            if f is not None:
                done += f.put_keys(hashes[done:], phys[done:], times[done:])
                if done == len(hashes):
                    return
                # full: persist it and start the next file from its end values
                f.flush()
                self._forced_until_ts = f.end_timestamp
            self._new_file(f)

    def _put_one(self, key_hash: int, phys: int, store_ts: int) -> None:
        """``_put_many`` of one entry."""
        f = self.files[-1] if self.files else None
        if f is not None and f.put_key(key_hash, phys, store_ts):
            return
        if f is not None:  # full: persist it and start the next file from its end values
            f.flush()
            self._forced_until_ts = f.end_timestamp
        self._new_file(f).put_key(key_hash, phys, store_ts)

    def _new_file(self, prev: IndexFile | None) -> IndexFile:
        os.makedirs(self.directory, exist_ok=True)
        name = index_file_name(self.store.clock())
        if self.files and name <= os.path.basename(self.files[-1].path):
            name = str(int(os.path.basename(self.files[-1].path)) + 1)
        f = IndexFile.create(
            os.path.join(self.directory, name), self.slots, self.entries,
            prev_end_phys_offset=prev.end_phys_offset if prev else 0,
            prev_end_timestamp=prev.end_timestamp if prev else 0)
        with self._lock:
            self.files = self.files + [f]
        return f

    # -- lookups ---------------------------------------------------------------------------
    def candidates(self, topic: str, key: str, begin_ms: int, end_ms: int) -> list[int]:
        """Commit-log offsets indexed under ``topic#key`` in files overlapping the window,
        newest first. Hash matches only: the caller confirms each message."""
        key_hash = L.index_hash(L.key_string(topic, key), self._hash)
        if self.read_only:
            self._follow()
        with self._lock:
            files = list(self.files)
        out: list[int] = []
        for f in reversed(files):
            if not f.overlaps(begin_ms, end_ms):
                continue
            # Entry times are whole seconds after the file's begin time, never later than the
            # store time (except RocketMQ's rolled-file first entry, which reads later), so the
            # walk starts a second early and never cuts at the window's end.
            out.extend(p for p, _t in f.select(key_hash, 1 << 31, max(0, begin_ms - 1000),
                                               INT64_MAX))
        return out

    def _follow(self) -> None:
        with self._lock:
            files = [f for f in self.files if os.path.exists(f.path)]
            for f in self.files:
                if f not in files:
                    f.close()
            last = os.path.basename(files[-1].path) if files else ""
            if os.path.isdir(self.directory):
                for name in sorted(n for n in os.listdir(self.directory) if n.isdigit()):
                    if name > last:
                        try:
                            files.append(self._open_file(os.path.join(self.directory, name)))
                        except (ValueError, OSError):
                            break  # being created; seen next time
            for f in files[-2:]:
                f.reload_header()
            self.files = files

    def drop_below(self, min_phys_offset: int) -> list[str]:
        """Delete the oldest files (never the newest) that only index removed messages."""
        removed = []
        with self._lock:
            while len(self.files) > 1 and self.files[0].end_phys_offset < min_phys_offset:
                f = self.files.pop(0)
                if self.read_only:  # the writer deletes; a follower lets go
                    f.close()
                    continue
                removed.append(f.path)
                f.destroy()
        return removed

    def flush(self) -> None:
        for f in list(self.files):
            f.flush()

    def close(self) -> None:
        self.persist()
        for f in self.files:
            f.close()


def java_hash_ranges(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray, state: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Java ``String.hashCode`` of a prefix (its hash ``state``, unsigned) followed by each
    range ``data[start:start + length]``, as int64, and which ranges are ASCII: only theirs
    are right (a byte is then a UTF-16 code unit). ``h = 31 * h + c`` over a key of length L
    is ``state * 31**L + sum(c[j] * 31**(L-1-j))`` mod 2**32: one product per key length."""
    out = np.empty(len(starts), dtype=np.int64)
    ascii_ = np.ones(len(starts), dtype=bool)
    for length in np.unique(lengths).tolist():
        rows = np.flatnonzero(lengths == length)
        chars = data[starts[rows, None] + np.arange(length)]
        ascii_[rows] = (chars < 0x80).all(axis=1)
        powers = [pow(31, length - 1 - j, 1 << 32) for j in range(length)]
        # each term < 2**40, so a sum of fewer than 2**23 of them fits 64 bits
        h = chars.astype(np.uint64) @ np.array(powers, dtype=np.uint64)
        h = (h + (state * pow(31, length, 1 << 32) & 0xFFFFFFFF)) & 0xFFFFFFFF
        out[rows] = h.astype(np.uint32).view(np.int32)
    return out, ascii_


_UNIQ_KEY_NAME = PROPERTY_UNIQ_KEY.encode() + b"\x01"
_KEYS_NAME = PROPERTY_KEYS.encode() + b"\x01"


def not_utf8(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray
             ) -> list[tuple[int, str]]:
    """``(i, key as decoded)`` of the keys holding bytes that are no UTF-8 (damage: producers
    write UTF-8), found with one array pass when every key is ASCII."""
    high = np.flatnonzero(data >= 0x80)
    if not len(high):
        return []
    nxt = np.searchsorted(high, starts)  # the first non-ASCII byte at or after each start
    inside = nxt < len(high)
    inside[inside] = high[nxt[inside]] < (starts + lengths)[inside]
    out = []
    for i in np.flatnonzero(inside).tolist():
        raw = data[int(starts[i]):int(starts[i]) + int(lengths[i])].tobytes()
        try:
            raw.decode("utf-8")
        except UnicodeDecodeError:
            out.append((i, raw.decode("utf-8", errors="replace")))
    return out


def _may_hold_keys(props) -> bool:
    """False when no record's properties name a key at all (the common case without keys):
    a substring search over them all, instead of the array passes of ``key_ranges``."""
    joined = props[0] if props.count(props[0]) == len(props) else b"".join(props)
    return _UNIQ_KEY_NAME in joined or _KEYS_NAME in joined


@hookimpl(trylast=True)
def register_dispatchers(registry):
    registry.add("key_index", build)


def build(view, role):
    return KeyIndex(view, role) if view.config.index.enabled else None

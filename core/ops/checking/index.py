"""Cross-checking the key index against the commit log.

The key index (``plugins/index_key.py``) holds, for every record that is not a rolled-back
transaction, an entry ``(abs(hash(topic#key)), phys)`` for its UNIQ_KEY and each KEYS token,
reachable from the hash slot ``hash % slots`` by the chain of ``prevIndex`` links. Each file
is checked with ``IndexFile.verify``; then every keyed record of the walked log must have its
entries reachable, and every reachable entry naming a stored offset must be one of them.
"""

from __future__ import annotations

import os

import numpy as np

from mqstore.format import index_layout as L
from mqstore.format.property_keys import key_ranges
from mqstore.format.record import SYSFLAG_TX_MASK, TX_ROLLBACK
from mqstore.hashing import string_hasher
from mqstore.ops.checking.log_walk import LogScan
from mqstore.ops.checking.problems import INDEX, Problem, runs
from mqstore.storage.index_file import INDEX_DIR, IndexFile


def expected_entries(scan: LogScan, hash_kind: str) -> set[tuple[int, int]]:
    """``(key hash, phys)`` of every key the index must hold."""
    hasher = string_hasher(hash_kind)
    rows = [r for r in sorted(scan.properties)
            if int(scan.sysflags[r]) & SYSFLAG_TX_MASK != TX_ROLLBACK]
    if not rows:
        return set()
    keys = key_ranges([scan.properties[r] for r in rows])
    out = set()
    data = keys.data.tobytes()
    for msg, start, length in zip(keys.message.tolist(), keys.start.tolist(),
                                  keys.length.tolist()):
        row = rows[msg]
        key = data[start:start + length].decode("utf-8", errors="replace")
        topic = scan.topics[int(scan.topic_ids[row])]
        out.add((L.index_hash(L.key_string(topic, key), hasher), int(scan.phys[row])))
    return out


def _open(path: str, config) -> IndexFile:
    size = os.path.getsize(path)
    cfg = config.index
    if size == L.file_size(cfg.max_hash_slots, cfg.max_index_entries):
        return IndexFile.load(path, cfg.max_hash_slots, cfg.max_index_entries, read_only=True)
    return IndexFile.load(path, read_only=True)


def file_arrays(path: str, slots: int, entries: int) -> tuple[np.ndarray, np.ndarray]:
    """The slot table and the written entries (entry 0 included) of an index file."""
    raw = np.memmap(path, dtype=np.uint8, mode="r")
    count = min(max(L.unpack_header(raw).index_count, L.FIRST_INDEX), entries)
    table = raw[L.HEADER_SIZE:L.entries_start(slots)].view(L.SLOT_DTYPE)
    start = L.entries_start(slots)
    return table, raw[start:start + count * L.ENTRY_SIZE].view(L.ENTRY_DTYPE)


def reachable_entries(slots: np.ndarray, entries: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Entry numbers a lookup can reach (from their own hash slot) and the written ones."""
    count = len(entries)
    slot_of = entries["key_hash"].astype(np.int64) % len(slots)
    prev = entries["prev_index"].astype(np.int64)
    reached = np.zeros(count, dtype=bool)
    owner = np.flatnonzero((slots > 0) & (slots < count))
    cur = slots[owner].astype(np.int64)
    while len(cur):
        own = slot_of[cur] == owner  # a lookup walks on only while entries hash to its slot
        cur, owner = cur[own], owner[own]
        fresh = ~reached[cur]
        cur, owner = cur[fresh], owner[fresh]
        reached[cur] = True
        nxt = prev[cur]
        step = (nxt > 0) & (nxt < cur)  # chains only lead to earlier entries
        cur, owner = nxt[step], owner[step]
    return np.flatnonzero(reached), np.arange(L.FIRST_INDEX, count)


def check_index(scan: LogScan, root: str, hash_kind: str, config) -> list[Problem]:
    directory = os.path.join(root, INDEX_DIR)
    names = sorted(n for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(
        directory) else []
    expected = expected_entries(scan, hash_kind)
    problems: list[Problem] = []
    present: set[tuple[int, int]] = set()
    for name in names:
        rel = os.path.join(INDEX_DIR, name)
        try:
            f = _open(os.path.join(directory, name), config)
        except (ValueError, OSError) as exc:
            problems.append(Problem(INDEX, rel, 0, f"unreadable index file: {exc}"))
            continue
        try:
            broken = f.verify()
        finally:
            f.close()
        if broken is not None:
            problems.append(Problem(INDEX, rel, 0, broken.replace(f.path, "file", 1)))
            continue
        problems += _check_file(f.path, f.slots, f.entries, rel, scan, expected, present)
    missing = sorted({phys for h, phys in expected - present})
    if missing:
        problems += _missing(scan, missing, bool(names))
    return problems


def _check_file(path: str, slot_count: int, entry_count: int, rel: str, scan: LogScan,
                expected: set, present: set) -> list[Problem]:
    slots, entries = file_arrays(path, slot_count, entry_count)
    reached, written = reachable_entries(slots, entries)
    problems = []
    lost = np.setdiff1d(written, reached)
    for first, last in runs(lost.tolist()):
        problems.append(Problem(INDEX, rel, L.entry_position(slot_count, first),
                                f"entries {first}..{last} cannot be reached from their hash "
                                f"slots", None))
    wrong = []
    for n in reached.tolist():
        pair = (int(entries["key_hash"][n]), int(entries["phys_offset"][n]))
        if pair[1] < scan.min_offset:
            continue  # its record went with a deleted segment; cleanup drops the file later
        present.add(pair)
        if pair not in expected:
            wrong.append(n)
    for first, last in runs(wrong):
        phys = int(entries["phys_offset"][first])
        problems.append(Problem(INDEX, rel, L.entry_position(slot_count, first),
                                f"entries {first}..{last} name no key of the record they point "
                                f"at (first: commit-log offset {phys})", phys,
                                int(entries["phys_offset"][last])))
    return problems


def _missing(scan: LogScan, missing: list[int], have_files: bool) -> list[Problem]:
    """Runs of consecutive keyed records (in log order) whose keys are not all indexed."""
    keyed = np.array(sorted(int(scan.phys[r]) for r in scan.properties), dtype=np.int64)
    rank = np.searchsorted(keyed, np.array(missing, dtype=np.int64)).tolist()
    problems = []
    for first, last in runs(rank):
        begin, end = int(keyed[first]), int(keyed[last])
        where = "index/ holds no file" if not have_files else "not in the index"
        problems.append(Problem(INDEX, INDEX_DIR, 0,
                                f"keys of {last - first + 1} record(s) at commit-log offsets "
                                f"{begin}..{end}: {where}", begin, end))
    return problems

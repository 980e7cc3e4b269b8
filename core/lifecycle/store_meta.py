"""What a store records about itself in ``mqstore.json``, and recovering it when it is lost.

    {"format": 1, "hash": "mmh3" | "java",
     "commit_log_segment_bytes": <int>, "consume_queue_file_bytes": <int>,
     "record_crc_since": <int>, "store_id": <32 hex digits>, "directory": {...}}

``store_id`` and ``directory`` say which store this is and where it was last opened for
writing (``storage.store_id``). ``hash`` is the string hash of tag codes and index keys; the sizes are those the files were
written with (a later configuration never changes them). ``record_crc_since``, present while
``commit_log.record_crc`` is on, is the commit-log offset from which every record carries the
record CRC (``format.record_crc``): a record there without one had it destroyed, which a
record alone cannot tell from never having had one. The file is written atomically when
a writable store opens. When it is missing or unreadable, the sizes come from the files and
the hash from every derived file that was written with it: the tag codes that consume queues
hold for stored messages, and the index entries of stored messages' keys, are each compared
with both hashes of what they were computed from. When no such file is left (nothing written
can disagree) the configured ``store.hash`` is taken, and the open's report says so. When
such files are left but do not tell one hash (they disagree, or none of their records can be
read), the open is refused with an error naming ``mqstore.json`` and ``store.hash``, unless
``store.hash`` was set explicitly: a hash is never picked silently.
"""

from __future__ import annotations

import logging
import os

from mqstore.errors import CorruptRecordError, StoreCorruptError
from mqstore.format.cq_unit import EXT_ADDRESS_MAX, FILLER_SIZE
from mqstore.format import index_layout as L
from mqstore.format.properties import PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, find_property
from mqstore.format.verify import verify_record
from mqstore.hashing import HASH_KINDS, string_hasher
from mqstore.storage.meta_file import read_meta, write_meta
from mqstore.storage.index_file import INDEX_DIR, IndexFile

log = logging.getLogger(__name__)
SAMPLE_UNITS = 64  # tagged messages looked at per queue when the hash must be inferred
SAMPLE_ENTRIES = 32  # index entries looked at from each end of each index file
META_FORMAT = 1


def load_meta(root: str) -> tuple[dict, str | None]:
    """The recorded metadata ({} when missing) and a problem to report, if any."""
    try:
        meta = read_meta(root)
    except StoreCorruptError as exc:
        return {}, f"{exc}; recovered from the store's files"
    if meta is None:
        return {}, None
    if meta.get("hash") not in HASH_KINDS:
        return {k: v for k, v in meta.items() if k != "hash"}, (
            f"mqstore.json names hash {meta.get('hash')!r}, not one of {HASH_KINDS}; "
            f"inferred from the data")
    return meta, None


class HashEvidence:
    """What the derived files say about the hash: per source (``tag codes``, ``index``), the
    matches of each hash, and whether any file that depends on the hash is there at all."""

    def __init__(self) -> None:
        self.votes: dict[str, dict[str, int]] = {}
        self.sources: list[str] = []  # hash-dependent files found, by source

    def add(self, source: str, kind: str, n: int = 1) -> None:
        self.votes.setdefault(source, dict.fromkeys(HASH_KINDS, 0))[kind] += n

    def verdicts(self) -> dict[str, str | None]:
        """Per source that matched anything: its hash, or None when it matches both."""
        return {source: _decide(v) for source, v in self.votes.items() if any(v.values())}

    def describe(self) -> str:
        return "; ".join(f"{source}: " + ", ".join(f"{n} match {kind}" for kind, n in v.items())
                         for source, v in self.votes.items()) or "nothing readable matched"


def _decide(votes: dict[str, int]) -> str | None:
    kinds = [kind for kind, n in votes.items() if n]
    if len(kinds) == 1:
        return kinds[0]
    if len(kinds) > 1:  # both match some (colliding short tags): the clear majority wins
        best = max(kinds, key=votes.get)
        if votes[best] > 2 * min(votes.values()):
            return best
    return None


def infer_hash(commit_log, consume_queues, root: str | None = None) -> str | None:
    """The hash every derived file agrees on, or None when they disagree or none tells."""
    evidence = gather_evidence(commit_log, consume_queues, root)
    kinds = set(evidence.verdicts().values())
    return kinds.pop() if len(kinds) == 1 and None not in kinds else None


def gather_evidence(commit_log, consume_queues, root: str | None) -> HashEvidence:
    evidence = HashEvidence()
    _tag_code_votes(commit_log, consume_queues, evidence)
    if root is not None:
        _index_votes(root, commit_log, evidence)
    return evidence


def _read_record(commit_log, phys: int, size: int | None = None):
    """``(raw, layout)`` of the intact record at ``phys``, or None."""
    if size is None:
        head = commit_log.read(phys, 4)
        if head is None:
            return None
        size = int.from_bytes(bytes(head), "big", signed=True)
    raw = commit_log.read(phys, size)
    if raw is None:
        return None
    raw = bytes(raw)
    try:
        return raw, verify_record(raw, phys, size)
    except CorruptRecordError:
        return None


def _log_start(commit_log) -> int:
    segments = commit_log.segments.segments
    return segments[0].start if segments else 0


def _tag_code_votes(commit_log, consume_queues, evidence: HashEvidence) -> None:
    hashers = {kind: string_hasher(kind) for kind in HASH_KINDS}
    start = _log_start(commit_log)
    for cq in consume_queues:
        for phys, size, code in _tagged_units(cq):
            if phys < start:
                continue  # its record was cleaned up: the unit is dropped, it cannot disagree
            if "tag codes" not in evidence.sources:
                evidence.sources.append("tag codes")
            got = _read_record(commit_log, phys, size)
            if got is None:
                continue
            raw, lay = got
            tags = find_property(raw[lay.props_at:lay.props_at + lay.props_len],
                                 PROPERTY_TAGS.encode())
            if not tags:
                continue
            text = tags.decode("utf-8", errors="replace")
            for kind, hasher in hashers.items():
                if hasher(text) == code:
                    evidence.add("tag codes", kind)


def _index_votes(root: str, commit_log, evidence: HashEvidence) -> None:
    """Entries of the index files (each file's first and last few): the key hash each holds
    is compared with both hashes of the keys of the record it names."""
    directory = os.path.join(root, INDEX_DIR)
    names = sorted(n for n in os.listdir(directory) if n.isdigit()) if os.path.isdir(
        directory) else []
    hashers = {kind: string_hasher(kind) for kind in HASH_KINDS}
    for name in names:
        path = os.path.join(directory, name)
        try:
            f = IndexFile.load(path, read_only=True)
        except (ValueError, OSError):  # not readable as an index file (sizes not RocketMQ's
            evidence.sources.append(f"index file {path}")  # ratio): it cannot tell
            continue
        try:
            count = min(f.index_count, f.entries)
            if count <= L.FIRST_INDEX or 0 <= f.end_phys_offset < _log_start(commit_log):
                continue  # no entry yet, or only entries of records cleaned up
            evidence.sources.append("index")
            picked = sorted(set(range(L.FIRST_INDEX, min(count, L.FIRST_INDEX + SAMPLE_ENTRIES)))
                            | set(range(max(L.FIRST_INDEX, count - SAMPLE_ENTRIES), count)))
            for index in picked:
                key_hash, phys, _diff, _prev = f.read_entry(index)
                got = _read_record(commit_log, phys)
                if got is None:
                    continue
                raw, lay = got
                topic = raw[lay.topic_at:lay.topic_at + lay.topic_len].decode(
                    "utf-8", errors="replace")
                props = raw[lay.props_at:lay.props_at + lay.props_len]
                keys = []
                uniq = find_property(props, PROPERTY_UNIQ_KEY.encode())
                if uniq:
                    keys.append(uniq)
                tokens = find_property(props, PROPERTY_KEYS.encode())
                if tokens:
                    keys += [t for t in tokens.split(b" ") if t]
                texts = [L.key_string(topic, k.decode("utf-8", errors="replace")) for k in keys]
                for kind, hasher in hashers.items():
                    if any(L.index_hash(t, hasher) == key_hash for t in texts):
                        evidence.add("index", kind)
        except (ValueError, OSError, IndexError):
            continue
        finally:
            f.close()


def _tagged_units(cq):
    found = 0
    for seg in cq.segments.segments:
        units = cq.stored_units(seg)[:seg.wrote // 20]
        codes = units["tags_code"]
        mask = (codes != 0) & (codes > EXT_ADDRESS_MAX) & (units["size"] > 0) & (
            units["size"] != FILLER_SIZE)
        for unit in units[mask][:SAMPLE_UNITS - found]:
            yield int(unit["phys_offset"]), int(unit["size"]), int(unit["tags_code"])
            found += 1
        if found >= SAMPLE_UNITS:
            return


def settle_meta(root: str, meta: dict, problem: str | None, *, commit_log, consume_queues,
                configured_hash: str, configured_cq_bytes: int, read_only: bool,
                notes: list[str], hash_explicit: bool = False,
                identity: dict | None = None) -> dict:
    """Complete ``meta`` from the loaded files (and record it, when writable); ``identity``:
    the store's id and home as this open settled them (``storage.store_id``)."""
    recorded = meta
    meta = dict(meta, **(identity or {}))
    if problem:
        notes.append(problem)
    since = meta.get("record_crc_since")
    if since is not None and (type(since) is not int or since < 0):
        notes.append(f"mqstore.json: record_crc_since {since!r} is not a commit-log offset; "
                     f"records are checked by the CRC each carries")
        del meta["record_crc_since"]
    if "hash" not in meta:
        meta["hash"] = _settle_hash(root, commit_log, consume_queues, configured_hash,
                                    hash_explicit, read_only, problem, notes)
    meta.setdefault("format", META_FORMAT)
    if commit_log.segments.segment_bytes:
        meta["commit_log_segment_bytes"] = commit_log.segments.segment_bytes
    if "consume_queue_file_bytes" not in meta:
        # A new store takes the configured size; one that lost its record, what its queues
        # mostly have.
        sizes = [cq.segments.segment_bytes for cq in consume_queues if cq.segments.segments]
        meta["consume_queue_file_bytes"] = (max(set(sizes), key=sizes.count) if sizes
                                            else configured_cq_bytes)
    if not read_only and (meta != recorded or problem):
        write_meta(root, meta)
    return meta


def settle_record_crc(root: str, meta: dict, record_crc: bool, log_end: int) -> dict:
    """``meta`` of a writable store whose recovered log ends at ``log_end``, with
    ``record_crc_since`` as the configured ``record_crc`` makes it (recorded when it changes):
    set to the end when the setting is turned on, dropped when it is off, since records from
    here on come without the property and none may be required to have it."""
    settled = dict(meta)
    if record_crc:
        settled.setdefault("record_crc_since", log_end)
    else:
        settled.pop("record_crc_since", None)
    if settled != meta:
        write_meta(root, settled)
    return settled


def _settle_hash(root, commit_log, consume_queues, configured_hash: str, hash_explicit: bool,
                 read_only: bool, problem: str | None, notes: list[str]) -> str:
    """The hash of a store whose ``mqstore.json`` does not name one (see the module's doc)."""
    if not commit_log.segments.segments:
        return configured_hash  # a new store (or one with no data left)
    evidence = gather_evidence(commit_log, consume_queues, root)
    verdicts = evidence.verdicts()
    kinds = set(verdicts.values())
    if len(kinds) == 1 and None not in kinds:
        kind = kinds.pop()
        if problem or not read_only:
            notes.append(f"mqstore.json had no hash: the stored "
                         f"{' and '.join(verdicts)} show {kind}")
        return kind
    if not evidence.sources:
        message = (f"mqstore.json had no hash and no file written with one is left (no tagged "
                   f"consume-queue unit, no index entry): taking store.hash = "
                   f"{configured_hash} for the tag codes and index entries rebuilt from the "
                   f"commit log")
        notes.append(message)
        log.warning(message)
        return configured_hash
    found = ", ".join(dict.fromkeys(evidence.sources))
    why = ("they disagree" if len(verdicts) > 1 or None in kinds
           else "none of the records they name can be read to tell")
    if hash_explicit:
        message = (f"mqstore.json had no hash and the files written with it ({found}) do not "
                   f"tell which ({why}: {evidence.describe()}): taking store.hash = "
                   f"{configured_hash}, set in the configuration")
        notes.append(message)
        log.warning(message)
        return configured_hash
    raise StoreCorruptError(
        f"{os.path.join(root, 'mqstore.json')} does not name the store's string hash (it is "
        f"missing or damaged) and the files written with it ({found}) do not tell whether it "
        f"is mmh3 or java ({why}: {evidence.describe()}); set store.hash explicitly to the "
        f"hash this store was written with (mmh3 for stores mqstore created, java for "
        f"RocketMQ's) and open it again")

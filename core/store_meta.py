"""What a store records about itself in ``mqstore.json``, and recovering it when it is lost.

    {"format": 1, "hash": "mmh3" | "java",
     "commit_log_segment_bytes": <int>, "consume_queue_file_bytes": <int>}

``hash`` is the string hash of tag codes and index keys; the sizes are those the files were
written with (a later configuration never changes them). The file is written atomically when
a writable store opens. When it is missing or unreadable, the sizes come from the files and
the hash from the data: the tag codes that consume queues hold for stored messages are
compared with both hashes of those messages' tags. A store with data but no tagged message
to tell by gets Java's hash (RocketMQ's, so its directories stay readable by RocketMQ).
"""

from __future__ import annotations

import logging

from mqstore.errors import CorruptRecordError, StoreCorruptError
from mqstore.format.cq_unit import EXT_ADDRESS_MAX, FILLER_SIZE
from mqstore.format.properties import PROPERTY_TAGS, find_property
from mqstore.format.verify import verify_record
from mqstore.hashing import HASH_JAVA, HASH_KINDS, string_hasher
from mqstore.storage.checkpoint import read_meta, write_meta

log = logging.getLogger("mqstore.store")
SAMPLE_UNITS = 64  # tagged messages looked at per queue when the hash must be inferred
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


def infer_hash(commit_log, consume_queues) -> str | None:
    """The hash whose codes match the stored tags, or None when no tagged message tells."""
    hashers = {kind: string_hasher(kind) for kind in HASH_KINDS}
    votes = dict.fromkeys(HASH_KINDS, 0)
    for cq in consume_queues:
        for phys, size, code in _tagged_units(cq):
            raw = commit_log.read(phys, size)
            if raw is None:
                continue
            try:
                lay = verify_record(bytes(raw), phys, size)
            except CorruptRecordError:
                continue
            tags = find_property(bytes(raw[lay.props_at:lay.props_at + lay.props_len]),
                                 PROPERTY_TAGS.encode())
            if not tags:
                continue
            text = tags.decode("utf-8", errors="replace")
            for kind, hasher in hashers.items():
                votes[kind] += hasher(text) == code
    kinds = [kind for kind, n in votes.items() if n]
    if len(kinds) == 1:
        return kinds[0]
    if len(kinds) > 1:  # both match some (colliding short tags): the clear majority wins
        best = max(kinds, key=votes.get)
        if votes[best] > 2 * min(votes.values()):
            return best
    return None


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
                notes: list[str]) -> dict:
    """Complete ``meta`` from the loaded files (and record it, when writable)."""
    recorded = meta
    meta = dict(meta)
    if problem:
        notes.append(problem)
    if "hash" not in meta:
        has_data = bool(commit_log.segments.segments)
        inferred = infer_hash(commit_log, consume_queues) if has_data else None
        if inferred is not None:
            meta["hash"] = inferred
            if problem or not read_only:
                notes.append(f"mqstore.json had no hash: stored tag codes show {inferred}")
        else:
            meta["hash"] = HASH_JAVA if has_data or read_only else configured_hash
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

"""``mqstore check --fix``: repair with the store's own recovery and rebuild.

What is derived from the commit log is rebuilt, never patched: a damaged consume queue (or
commit-log damage that invalidates units) removes ``consumequeue/`` and ``consumequeue_ext/``,
a damaged index (or such commit-log damage) removes the index files. A writable open then
recovers the store as it always does: with no consume queue left to say what was dispatched,
it walks the whole commit log, quarantines damaged records (keeping every intact one after
them, and a copy of the damaged bytes), cuts a torn tail, and re-dispatches the log, which
builds the queues (fillers hold the offsets of lost records) and the index again. A clean close
then removes a stale ``abort`` marker. Every step is reported.

Before ``consumequeue/`` goes, each queue's end (its valid units) goes into the queue manifest:
a floor the rebuild keeps (NOTE [ Offset floors ] in ``offset_floor``), so offsets whose
records the damage took are held by fillers and new messages go on above them.
"""

from __future__ import annotations

import os
import shutil

from mqstore.config import StoreConfig
from mqstore.errors import StoreCorruptError
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.ops.checking.problems import CONSUME_QUEUE, INDEX, RECORD, SEGMENT, Problem
from mqstore.plugin_api.recovery_report import RecoveryReport
from mqstore.storage.abort_file import abort_exists
from mqstore.storage.meta_file import read_meta
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR, load_consume_queues
from mqstore.storage.index_file import INDEX_DIR
from mqstore.storage.queue_manifest import describe as queue_ends
from mqstore.storage.queue_manifest import merged, read_entries, write_manifest
from mqstore.storage.store_lock import exclusive
from mqstore.store import MessageStore

CONSUME_QUEUE_EXT_DIR = "consumequeue_ext"
DISPATCH_WAIT_S = 600.0


def repair(root: str, config: StoreConfig, problems: list[Problem]) -> list[str]:
    """Repair ``root`` for ``problems`` (a check's); returns what was done, in order."""
    kinds = {p.kind for p in problems}
    invalidating = bool(kinds & {SEGMENT, RECORD})
    done: list[str] = []
    with exclusive(root, "mqstore check --fix"):  # nothing removed under a live writer
        _remove_derived(root, config, kinds, invalidating, done)
    # The loops run as threads: the same code and files, without starting worker processes
    # for one open.
    cfg = config.replace(dispatch={"worker": "thread"}, flush={"worker": "thread"})
    was_abnormal = abort_exists(root)
    with MessageStore.open(root, config=cfg) as store:
        store.wait_dispatched(timeout=DISPATCH_WAIT_S)
        report = store.recovery_report
    done += describe(report)
    if INDEX in kinds:
        done += _reindexed(problems)
    if was_abnormal and not abort_exists(root):
        done.append("closed cleanly: the stale abort marker is gone")
    return done


def _remove_derived(root: str, config: StoreConfig, kinds: set, invalidating: bool,
                    done: list[str]) -> None:
    if CONSUME_QUEUE in kinds or invalidating:
        kept = _keep_queue_ends(root, config)
        if kept:
            done.append(f"recorded the end of {kept} consume queue(s) in the queue manifest: "
                        f"their offsets go on from there")
        for name in (CONSUME_QUEUE_DIR, CONSUME_QUEUE_EXT_DIR):
            path = os.path.join(root, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
                done.append(f"removed {name}/ to rebuild it from the commit log")
    if INDEX in kinds or invalidating:
        directory = os.path.join(root, INDEX_DIR)
        names = sorted(os.listdir(directory)) if os.path.isdir(directory) else []
        for name in names:
            os.unlink(os.path.join(directory, name))
        if names:
            done.append(f"removed {len(names)} index file(s) to rebuild the index from the "
                        f"commit log")


def _reindexed(problems: list[Problem]) -> list[str]:
    """The records whose index entries named keys they no longer hold, while their keys as
    they now read were missing: their properties changed after they were indexed (no CRC
    covers them, as in RocketMQ), so the rebuilt index holds them as they now read."""
    missing = [(p.position, p.last) for p in problems
               if p.kind == INDEX and p.file == INDEX_DIR and p.position is not None]
    out = []
    for p in problems:
        if p.kind != INDEX or p.file == INDEX_DIR or p.position is None:
            continue  # not an index file's entries naming a record
        first, last = p.position, p.last if p.last is not None else p.position
        if not any(begin <= last and first <= (end if end is not None else begin)
                   for begin, end in missing):
            continue
        if first == last:
            out.append(f"re-indexed the record at commit-log offset {first} as it now reads: "
                       f"its keys changed after it was indexed (no CRC covers its "
                       f"properties); nothing was quarantined")
        else:
            out.append(f"re-indexed the records at commit-log offsets {first}..{last} as they "
                       f"now read: their keys changed after they were indexed (no CRC covers "
                       f"their properties); nothing was quarantined")
    return out


def _keep_queue_ends(root: str, config: StoreConfig) -> int:
    """Raise the queue manifest to each consume queue's end (its valid units, checked as an
    open would, changing nothing on disk); returns how many entries that raised."""
    try:
        known = (read_meta(root) or {}).get("consume_queue_file_bytes")
    except StoreCorruptError:
        known = None  # then the files say (as they do at open)
    queues = load_consume_queues(
        root, known or round_file_bytes(config.consume_queue.file_units * CQ_UNIT_SIZE),
        read_only=True, known_bytes=known)
    try:
        for cq in queues.values():
            cq.recover()
        ends = queue_ends(queues)
    finally:
        for cq in queues.values():
            cq.close()
    recorded, _problem = read_entries(root)  # a garbled one is replaced
    entries = merged(recorded, ends)
    if entries != recorded:
        write_manifest(root, entries, durable=True)
    return sum(1 for key, entry in entries.items() if recorded.get(key) != entry)


def describe(report: RecoveryReport) -> list[str]:
    """What a recovery did, one line per change."""
    out = []
    if report.abnormal:
        out.append(f"recovered after an unclean exit, from commit-log offset {report.scan_from}")
    for q in report.quarantined:
        saved = f"; the original bytes are in {q.saved_to}" if q.saved_to else ""
        out.append(f"quarantined commit-log bytes [{q.offset}, {q.offset + q.length}) "
                   f"({q.reason}){saved}")
    for path in report.recreated_segments:
        out.append(f"recreated missing segment {path} (closed, empty)")
    if report.truncated_bytes:
        out.append(f"cut a torn tail of {report.truncated_bytes} bytes at commit-log offset "
                   f"{report.commit_log_end} ({report.stop_reason})")
    for path in report.deleted_files:
        out.append(f"deleted {path} (past the end of the log)")
    for queue, why in sorted(report.queues_rebuilt.items()):
        out.append(f"rebuilt consume queue {queue}: {why}")
    for queue, n in sorted(report.consume_queue_units_dropped.items()):
        out.append(f"dropped {n} unit(s) of consume queue {queue} past the end of the log")
    for queue, runs in sorted(report.queue_offsets_lost.items()):
        held = ", ".join(f"{a}..{b}" if a != b else f"{a}" for a, b in runs)
        out.append(f"queue offsets {held} of {queue} lost their messages; fillers hold them, "
                   f"later offsets are kept")
    if report.redispatch_bytes:
        out.append(f"re-dispatched {report.redispatch_bytes} commit-log bytes into the consume "
                   f"queues and the index")
    out += [f"note: {n}" for n in report.notes]
    return out

"""``mqstore check``: verify every record and cross-check the files derived from the log.

Read-only and without opening the store (no recovery runs): the commit log is walked record
by record (``log_walk``), the consume queues (``queues``) and the key index
(``index``) are compared with what the walk found, and a stale ``abort`` marker is
reported. A store a live writer holds is refused: its tail moves while it is read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from mqstore.config import StoreConfig
from mqstore.errors import CorruptStateError, StoreLockedError
from mqstore.ops.checking.index import check_index
from mqstore.ops.checking.log_walk import scan_log
from mqstore.ops.checking.queues import check_queues
from mqstore.ops.checking.problems import ABORT, KINDS, Problem
from mqstore.ops.store_files import ABORT_RUNNING, ABORT_STALE, abort_state, open_files
from mqstore.storage.abort_file import ABORT_FILE
from mqstore.storage.deleted_topics import read_deleted
from mqstore.storage.topic_file import read_table, topics_path
from mqstore.storage.store_lock import holder


@dataclass
class CheckReport:
    root: str
    records: int = 0
    commit_log_bytes: int = 0  # [min offset, end of the last intact record)
    crc_bad: int = 0
    queues: int = 0
    index_checked: bool = False
    problems: list[Problem] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict:
        return {"root": self.root, "clean": self.clean, "records": self.records,
                "commit_log_bytes": self.commit_log_bytes,
                "crc_ok": self.records, "crc_bad": self.crc_bad, "queues": self.queues,
                "index_checked": self.index_checked,
                "problems": [p.to_dict() for p in self.problems], "notes": self.notes}


def check_store(root: str, config: StoreConfig,
                on_total: Callable[[int], None] = lambda n: None,
                advance: Callable[[int], None] = lambda n: None) -> CheckReport:
    """Check ``root``; ``on_total(bytes)`` once the work is known (the commit-log bytes the
    walk covers, not the segments' allocated size), ``advance(bytes)`` as it is done (for a
    progress bar)."""
    state, pid = abort_state(root)
    held = holder(root) or (f"open for writing by process {pid}" if state == ABORT_RUNNING
                            else None)
    if held is not None:
        raise StoreLockedError(f"store {root!r} is {held}; check it once that writer has "
                               f"closed it")
    report = CheckReport(root)
    with open_files(root, config) as files:
        report.notes = list(files.notes)
        scan = scan_log(files.commit_log, root, advance, on_total)
        report.records, report.crc_bad = scan.records, scan.crc_bad
        report.commit_log_bytes = max(0, scan.end - scan.min_offset)
        problems = list(scan.problems)
        problems += check_queues(scan, files.queues, root, files.cq_file_bytes,
                                 _deleted_topics(root, report.notes))
        report.queues = len(files.queues)
        if config.index.enabled:
            problems += check_index(scan, root, files.hash_kind, config)
            report.index_checked = True
    if state == ABORT_STALE:
        who = f"process {pid}, which is gone" if pid is not None else "a writer that is gone"
        problems.append(Problem(ABORT, ABORT_FILE, 0, f"abort marker left by {who}: the last "
                                                       f"exit was not clean"))
    report.problems = sorted(problems, key=lambda p: (KINDS.index(p.kind), p.file, p.offset))
    return report


def _deleted_topics(root: str, notes: list[str]) -> dict[str, int]:
    """Deleted topics' floors (their old records have no unit); the state files beside the
    topics that cannot be read are noted."""
    try:
        read_table(topics_path(root))
    except CorruptStateError as exc:
        notes.append(str(exc))
    try:
        return read_deleted(root)
    except CorruptStateError as exc:
        notes.append(f"{exc}; consume queues checked as if no topic was deleted")
        return {}

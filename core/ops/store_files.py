"""A store directory's files opened read-only, without opening the store (and so without
recovery): what ``check``, ``inspect`` and ``stats`` read, beside a running writer or not.

The writer is recognised by the ``abort`` marker holding the PID of a live process (mqstore
and RocketMQ 5.x write it; RocketMQ 4.x leaves it empty, which reads as a stale marker).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from mqstore.config import StoreConfig
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.storage.abort_file import ABORT_FILE
from mqstore.storage.meta_file import META_FILE
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.consume_queue import ConsumeQueue, load_consume_queues
from mqstore.storage.queue_manifest import read_manifest
from mqstore.lifecycle.store_meta import load_meta, settle_meta

log = logging.getLogger(__name__)
COMMIT_LOG_DIR = "commitlog"

ABORT_NONE, ABORT_RUNNING, ABORT_STALE = "none", "running", "stale"
# What makes a directory a store: mqstore.json, which every store mqstore made has (an empty
# one made by ``init`` too), or the files of RocketMQ's layout, which a broker's store has.
STORE_MARKS = (META_FILE, COMMIT_LOG_DIR, "consumequeue", "checkpoint")


def store_marks(root: str) -> list[str]:
    """The entries of ``root`` that make it a store directory (none: it is not one)."""
    return [name for name in STORE_MARKS if os.path.exists(os.path.join(root, name))]


def abort_state(root: str) -> tuple[str, int | None]:
    """Whether the abort marker is absent, held by a live writer (its PID) or left behind."""
    path = os.path.join(root, ABORT_FILE)
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return ABORT_NONE, None
    pid = int(text) if text.isdigit() else None
    if pid is not None and pid_alive(pid):
        return ABORT_RUNNING, pid
    return ABORT_STALE, pid


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's live process
        return True
    return pid != os.getpid()


@dataclass
class StoreFiles:
    """The commit log, consume queues and recorded settings of a directory, read-only."""

    root: str
    commit_log: CommitLog
    queues: dict[tuple[str, int], ConsumeQueue]
    meta: dict
    known_queues: dict[tuple[str, int], tuple[int, int]]
    notes: list[str]

    @property
    def hash_kind(self) -> str:
        return self.meta["hash"]

    @property
    def cq_file_bytes(self) -> int:
        return self.meta["consume_queue_file_bytes"]

    def close(self) -> None:
        for cq in self.queues.values():
            cq.close()
        self.commit_log.close()

    def __enter__(self) -> "StoreFiles":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_files(root: str, config: StoreConfig) -> StoreFiles:
    """Load what ``root`` holds as the store would, read-only; sizes and the string hash come
    from ``mqstore.json``, else from the files (``store_meta``)."""
    if not os.path.isdir(root):
        raise FileNotFoundError(f"store directory {root!r} does not exist")
    meta, problem = load_meta(root)
    notes: list[str] = []
    commit_log = CommitLog(os.path.join(root, COMMIT_LOG_DIR), None, read_only=True,
                           on_warning=notes.append,
                           known_bytes=meta.get("commit_log_segment_bytes"))
    try:
        notes += commit_log.load()
        configured_cq = round_file_bytes(config.consume_queue.file_units * CQ_UNIT_SIZE)
        queues = load_consume_queues(root, meta.get("consume_queue_file_bytes") or configured_cq,
                                     read_only=True, on_warning=notes.append, notes=notes,
                                     known_bytes=meta.get("consume_queue_file_bytes"))
        meta = settle_meta(root, meta, problem, commit_log=commit_log,
                           consume_queues=queues.values(), configured_hash=config.store.hash,
                           configured_cq_bytes=configured_cq, read_only=True, notes=notes,
                           hash_explicit="hash" in config.store.model_fields_set)
    except BaseException:
        commit_log.close()
        raise
    if meta.get("record_crc_since") is not None:  # as the store's reads hold records to it
        commit_log.crc_range = (meta["record_crc_since"], 1 << 62)
    known, manifest_problem = read_manifest(root)
    if manifest_problem:
        notes.append(manifest_problem)
    return StoreFiles(root, commit_log, queues, meta, known, notes)

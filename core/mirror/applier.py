"""The slave's side of the state mirror: a dispatcher that applies the records of the state
topic to ``<root>/replica/`` (NOTE [ State mirror ]).

Built in the process that dispatches a slave's log (the dispatch worker, or the store process
with ``dispatch.worker: thread``). Every operation is idempotent, so a batch dispatched again
(a failed attempt retried, a restarted worker, recovery's re-dispatch after a kill) leaves the
mirror as the first time: ``write`` is a positional write; a ``put`` goes to a staging file
``<path>.put-<id>`` renamed into place by its last chunk (a chunk whose staging file is gone
was applied already, and is passed over); ``delete`` removes what may be gone already. The
mirror's progress is dispatch's: the files are forced in ``persist`` (before ``mqstore.queued``
moves past them), so a power loss re-applies what they lacked.

A record that is not an operation (garbled properties, a path outside the registry, a damaged
body) is reported, counted in ``replica/state.json`` and passed over: it never stops dispatch.
Only a full disk or an I/O error fails the batch, which dispatch retries.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import threading
import time
from typing import Callable

from mqstore.errors import CorruptRecordError
from mqstore.format.properties import decode_properties
from mqstore.format.state_record import (
    DELETE, PUT, SNAPSHOT_BEGIN, SNAPSHOT_END, STATE_TOPIC, WRITE, StateOp, StateRecordError,
    decode_op,
)
from mqstore.mirror.replica_state import read_state, replica_dir, write_state
from mqstore.plugin_api.contracts import PERSISTS
from mqstore.storage.durable_file import sync_dir, write_all
from mqstore.storage.state_files import state_files, unit_of

log = logging.getLogger(__name__)

STAGING = ".put-"
_RETRIED = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS)  # worth retrying the batch


class StateApplier:
    """Applies the state topic's operations to ``<root>/replica/`` while ``following()``
    (the store follows a master)."""

    capabilities = frozenset({PERSISTS})

    def __init__(self, view, following: Callable[[], bool]) -> None:
        self.root = view.root
        self.replica = replica_dir(self.root)
        self._message_at = view.message_at
        self._following = following
        self._lock = threading.Lock()
        self._dirty: set[str] = set()
        self._state, problem = read_state(self.root)
        if problem is not None:
            log.error("state mirror: %s; the mirror counts as incomplete until the next "
                      "snapshot", problem)
        self.rejected = 0

    def dispatch(self, batch) -> None:
        topics = batch.topics
        if STATE_TOPIC not in topics or not self._following():
            return
        with self._lock:
            for i, topic in enumerate(topics):
                if topic == STATE_TOPIC:
                    self._apply_record(int(batch.phys_offsets[i]))

    def _apply_record(self, phys: int) -> None:
        try:
            msg = self._message_at(phys)
            if msg is None:
                raise CorruptRecordError(f"no record starts at commit-log offset {phys}")
            op = decode_op(decode_properties(msg.properties_text), msg.body)
            if op.path and unit_of(op.path) is None:
                raise StateRecordError(f"MQSTATE_PATH {op.path!r} is not a state file of the "
                                       f"registry (storage.state_files)")
            self._apply(op, phys)
        except (StateRecordError, CorruptRecordError, UnicodeDecodeError) as exc:
            self._reject(phys, str(exc))
        except OSError as exc:
            if exc.errno in _RETRIED:
                raise
            self._reject(phys, f"{type(exc).__name__}: {exc}")

    def _reject(self, phys: int, why: str) -> None:
        self.rejected += 1
        state = self._state
        state["rejected"] = int(state.get("rejected") or 0) + 1
        state["last_rejected"] = f"commit-log offset {phys}: {why}"
        log.error("state mirror: the state record at commit-log offset %d is passed over: %s",
                  phys, why)
        with contextlib.suppress(OSError):
            write_state(self.root, state)

    # -- the operations ------------------------------------------------------------------------
    def _apply(self, op: StateOp, phys: int) -> None:
        if op.kind == WRITE:
            self._write(self._path(op.path), op.pos, op.body, create=True)
        elif op.kind == PUT:
            self._put(op)
        elif op.kind == DELETE:
            self._delete(op.path)
        elif op.kind == SNAPSHOT_BEGIN:
            self._state["begun"] = op.op_id
            write_state(self.root, self._state)
        elif op.kind == SNAPSHOT_END:
            self._snapshot_end(op, phys)

    def _path(self, rel: str) -> str:
        return os.path.join(self.replica, *rel.split("/"))

    def _write(self, path: str, pos: int, data: bytes, *, create: bool,
               truncate: bool = False) -> bool:
        """Write ``data`` at ``pos``; False when the file is absent and not ``create``d."""
        flags = os.O_WRONLY | (os.O_CREAT if create else 0) | (os.O_TRUNC if truncate else 0)
        if create:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        try:
            fd = os.open(path, flags | os.O_NOFOLLOW, 0o644)
        except FileNotFoundError:
            if create:
                raise
            return False
        try:
            if data:
                os.lseek(fd, pos, os.SEEK_SET)
                write_all(fd, data)
        finally:
            os.close(fd)
        self._dirty.add(path)
        return True

    def _put(self, op: StateOp) -> None:
        target = self._path(op.path)
        staging = f"{target}{STAGING}{op.op_id}"
        first = op.pos == 0
        if not self._write(staging, op.pos, op.body, create=first, truncate=first):
            return  # its put was completed (renamed) when this record was applied before
        if not op.last_chunk:
            return
        size = os.stat(staging).st_size
        if size != op.total:
            os.unlink(staging)
            raise StateRecordError(f"put of {op.path!r} ends with {size} bytes staged, not "
                                   f"{op.total}: a chunk is missing; the file is left as it was")
        os.replace(staging, target)
        self._dirty.discard(staging)
        self._dirty.add(target)

    def _delete(self, rel: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self._path(rel))
        self._dirty.add(os.path.dirname(self._path(rel)))

    def _snapshot_end(self, op: StateOp, phys: int) -> None:
        named = set(op.paths())
        for rel in state_files(self.replica):
            if rel not in named:
                self._delete(rel)
        self._drop_staging()
        state = self._state
        if state.get("begun") != op.op_id:
            log.warning("state mirror: snapshot %d ends at commit-log offset %d, but its "
                        "beginning is not in this log (it started before this slave's log "
                        "does): the mirror waits for the next snapshot", op.op_id, phys)
            return
        self._persist()
        state["complete"] = {"snapshot": op.op_id, "offset": phys, "epoch": op.epoch,
                             "applied_ms": int(time.time() * 1000)}
        write_state(self.root, state)
        log.info("state mirror: snapshot %d applied (%d files)", op.op_id, len(named))

    def _drop_staging(self) -> None:
        """Staging files of puts whose last chunk never came (the master died mid-put)."""
        for directory, _dirs, files in os.walk(self.replica):
            for name in files:
                if STAGING in name:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(os.path.join(directory, name))

    # -- dispatch's other calls ----------------------------------------------------------------
    def persist(self) -> None:
        """Force the files and directories changed since the last call (a failure is logged:
        the files are forced at the next call)."""
        with self._lock:
            try:
                self._persist()
            except OSError as exc:
                log.warning("state mirror: forcing %s failed: %s", self.replica, exc)

    def _persist(self) -> None:
        directories = set()
        for path in sorted(self._dirty):
            with contextlib.suppress(FileNotFoundError, IsADirectoryError):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            directories.add(path if os.path.isdir(path) else os.path.dirname(path))
        for directory in sorted(directories):
            with contextlib.suppress(FileNotFoundError):
                sync_dir(directory)
        self._dirty.clear()  # only once all of it is forced: a failure forces it all again

    def close(self) -> None:
        self.persist()

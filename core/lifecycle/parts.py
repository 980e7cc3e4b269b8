"""The parts of one open store, as the opener builds them and the facade holds them.

Every field is set by ``lifecycle.opener.Opener`` in the order an open runs (files, recovery,
view and readers, then the writer and loops of a writable store) and released by ``release``
in the reverse order; a failed open releases what it built so far.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

from mqstore.scheduler import Scheduler, system_scheduler

if TYPE_CHECKING:
    from mqstore.append.appender import Appender, ReadOnlyAppender
    from mqstore.config import StoreConfig
    from mqstore.dispatch.dispatchers import Dispatchers
    from mqstore.format.hosts import Host
    from mqstore.plugin_api.manager import PluginHooks
    from mqstore.plugin_api.recovery_report import RecoveryReport
    from mqstore.read.reader import Reader
    from mqstore.replication import Replication
    from mqstore.roles import RoleState
    from mqstore.runtime.loops import Runtime
    from mqstore.runtime.schedule import ScheduleService
    from mqstore.runtime.transactions import TransactionService
    from mqstore.storage.checkpoint import Checkpoint
    from mqstore.storage.commit_log import CommitLog
    from mqstore.storage.epoch_file import EpochFile
    from mqstore.storage.store_lock import StoreLock
    from mqstore.view.directory_view import DirectoryView


@dataclass(eq=False)
class StoreParts:
    config: "StoreConfig"
    clock: Callable[[], int]
    scheduler: Scheduler = system_scheduler
    lock: "StoreLock | None" = None
    hooks: "PluginHooks | None" = None
    commit_log: "CommitLog | None" = None
    hash_kind: str = "java"
    checkpoint: "Checkpoint | None" = None
    recovery_report: "RecoveryReport | None" = None
    view: "DirectoryView | None" = None
    store_host: "Host | None" = None
    dispatchers: "Dispatchers | None" = None
    reader: "Reader | None" = None
    appender: "Appender | ReadOnlyAppender | None" = None
    runtime: "Runtime | None" = None
    replication: "Replication | None" = None
    role: "RoleState | None" = None  # what the store is now (mqstore.roles)
    epochs: "EpochFile | None" = None  # its epoch file (storage.epoch_file)
    schedule: "ScheduleService | None" = None  # a writable store's delay levels
    transactions: "TransactionService | None" = None  # its open transactions and checker


    def last_append_end(self) -> int:
        last = getattr(self.appender, "last_append", None)
        return last[0] if last is not None else 0

    def stop_replication(self) -> None:
        """Before anything else closes: no slave reads or appends through a closing store,
        and the schedule delivers no more."""
        if self.schedule is not None:
            self.schedule.stop()
        if self.transactions is not None:
            self.transactions.stop()
        if self.replication is not None:
            self.replication.stop()

    def release_files(self) -> None:
        """Close what maps or holds files, loops stopped first by the caller."""
        if self.dispatchers is not None:
            self.dispatchers.close()
        if self.view is not None:
            self.view.close()
        if self.runtime is not None:
            self.runtime.close_writer(self.last_append_end())
            self.runtime.close_channels()
        for part in (self.checkpoint, self.commit_log):
            if part is not None:
                part.close()

    def unlock(self) -> None:
        if self.lock is not None:
            self.lock.release()
            self.lock = None

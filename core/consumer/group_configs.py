"""The store's consumer group configs: ``config/subscriptionGroup.json`` (the document:
``format.subscription_group``) read, looked up and changed.

The file is kept as ``config/topics.json`` is (``storage.topic_file``): a change takes the
file's flock, reads it as it is now, writes the next version beside it and renames it over
(fsynced), so changes from any process (the store, ``mqstore group config`` beside it) are never
lost and a reader sees one version or the next. A group the file does not list has
RocketMQ's defaults (16 retries, 1 retry queue); a store without the file has only defaults.
A damaged file is never replaced: lookups and changes raise ``CorruptStateError`` naming it.
The state mirror ships it to slaves (``storage.state_files``). Thread-safe.
"""

from __future__ import annotations

import os
import threading
import time
from typing import Callable

from mqstore.consumer import names
from mqstore.format.subscription_group import (
    GroupConfig, GroupTable, decode_table, default_config, empty_table, encode_table,
)
from mqstore.storage.durable_file import read_document, replace_file
from mqstore.storage.topic_file import CONFIG_DIR, identity, locked

GROUPS_FILE = "subscriptionGroup.json"
RELOAD_INTERVAL_S = 1.0  # how stale another process's change may be seen


def groups_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, GROUPS_FILE)


def read_table(path: str) -> GroupTable | None:
    """The document at ``path`` (None: no file); ``CorruptStateError`` when it is damaged."""
    return read_document(path, decode_table, lambda problem: (
        f"consumer group configs {path} are damaged: {problem}; the file is left as it is: "
        f"repair or remove it"))


class GroupConfigs:
    """The group configs of the store in ``root`` (open or closed)."""

    def __init__(self, root: str, clock: Callable[[], int]) -> None:
        self.path = groups_path(root)
        self._clock = clock
        self._lock = threading.Lock()
        self._table: GroupTable | None = None
        self._ident: object = ("unread",)
        self._checked = float("-inf")

    def table(self, fresh: bool = False) -> GroupTable | None:
        """The document (None: no file), re-read when it changed (looked at every
        RELOAD_INTERVAL_S, or now with ``fresh``)."""
        now = time.monotonic()
        with self._lock:
            if fresh or now - self._checked >= RELOAD_INTERVAL_S:
                ident = identity(self.path)
                if ident != self._ident:
                    self._table = read_table(self.path)
                    self._ident = ident
                self._checked = now
            return self._table

    def get(self, group: str) -> GroupConfig:
        """``group``'s config: the file's, or the defaults when it lists none."""
        table = self.table()
        config = None if table is None else table.groups.get(group)
        return config if config is not None else default_config(group)

    def listed(self) -> dict[str, GroupConfig]:
        """The groups the file lists, by name."""
        table = self.table()
        return {} if table is None else dict(table.groups)

    def set(self, group: str, **fields) -> GroupConfig:
        """Change ``fields`` (``format.subscription_group.SETTABLE`` names) of ``group``'s
        config, which the file gets if it did not list it; ValueError, with nothing written,
        when a value breaks a rule."""
        names.check_group(group)
        with locked(self.path):
            current = read_table(self.path)
            table = current if current is not None else empty_table()
            config = table.groups.get(group) or default_config(group)
            new = config.changed(**fields)
            if new != config or group not in table.groups:
                replace_file(self.path, encode_table(table.with_group(new, self._clock())
                                                     ).encode("utf-8"),
                             fsync=True, sync_directory=True)
            with self._lock:
                self._ident = ("unread",)
                self._checked = float("-inf")
        return new

"""The role a writable store has now: one small object every part that depends on it consults
at the moment it acts, so a role changes at run time without rebuilding anything.

    the Appender     refuses puts unless ``refusal()`` is None (a slave's, a fenced master's,
                     or a master whose write guard says no), checked again before PUT_OK
    the reader       keeps a consumer's offset on a slave (``get.offset_check_in_slave``)
    replication      follows ``master`` (a slave) or listens for slaves (a master)
    the endpoints    serve a writable master, and forward a slave's calls to its master

``store.role`` is only where a store starts; ``role.json`` (``storage.role_file``) records a
run-time change, and ``MessageStore.promote``/``demote`` make it (``store.roles``).

NOTE [ Fencing ]
A master stops taking puts the moment it learns it may not write: ``fence(why)`` (a peer holds
a newer epoch, a slave reported one, coordination's ``on_fenced``), or its write ``guard``
(coordination's ``may_write``, a clock check cheap enough for every put) answering False. The
Appender asks before a put takes the lock and again once it is stored: a put that passed the
first check just before the fence answers SERVICE_NOT_AVAILABLE, never PUT_OK (its records
stay, as RocketMQ's do for a put that failed after the append).
"""

from __future__ import annotations

import threading
from typing import Callable

MASTER_ROLES = ("async_master", "sync_master")
SLAVE_REFUSAL = "store role is slave"


class RoleState:
    """Thread-safe: readers take single attributes (each read is atomic); ``change`` sets
    several at once under a lock and then tells the watchers."""

    def __init__(self, role: str, *, master: str | None = None, epoch: int = 0,
                 fenced: str | None = None) -> None:
        self.role = role
        self.master = master  # the server.ha_listen a slave follows
        self.epoch = epoch  # this store's newest epoch (0: none)
        self.fenced = fenced  # why this master takes no puts (None: it takes them)
        self.guard: Callable[[], bool] | None = None  # e.g. coordination's may_write
        # What a slave last heard of its master (mqstore's handshake and status frames).
        self.master_endpoint: str | None = None  # its client (gRPC) endpoint, "host:port"
        self.master_confirmed = -1  # the end of what it had answered PUT_OK (-1: unknown)
        self.master_epoch = 0  # its newest epoch
        self._lock = threading.Lock()
        self._watchers: list[Callable[[RoleState], None]] = []

    @property
    def is_slave(self) -> bool:
        return self.role == "slave"

    def refusal(self) -> str | None:
        """Why this store takes no put now, or None."""
        if self.role == "slave":
            return SLAVE_REFUSAL
        fenced = self.fenced
        if fenced is not None:
            return fenced
        guard = self.guard
        if guard is not None and not guard():
            return ("fenced: this master's write guard (the coordination lease) does not "
                    "hold; it takes no writes until it is elected again")
        return None

    @property
    def writable(self) -> bool:
        return self.refusal() is None

    def fence(self, why: str) -> None:
        """Stop taking puts at once (NOTE [ Fencing ]); kept until the role changes."""
        self.change(fenced=why)

    def change(self, **fields) -> None:
        with self._lock:
            for name, value in fields.items():
                if not hasattr(self, name) or name.startswith("_"):
                    raise AttributeError(f"RoleState has no field {name!r}")
                setattr(self, name, value)
            watchers = list(self._watchers)
        for watcher in watchers:
            watcher(self)

    def watch(self, callback: Callable[[RoleState], None]) -> None:
        """``callback(state)`` after every change, on the changing thread."""
        with self._lock:
            self._watchers.append(callback)

    def snapshot(self) -> dict:
        return {"role": self.role, "master": self.master, "epoch": self.epoch,
                "fenced": self.fenced, "master_endpoint": self.master_endpoint,
                "master_confirmed": self.master_confirmed, "master_epoch": self.master_epoch}


__all__ = ["RoleState", "MASTER_ROLES", "SLAVE_REFUSAL"]

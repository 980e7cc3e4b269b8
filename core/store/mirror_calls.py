"""The state mirror's calls on an open store: a promotion's "the mirror becomes the state"
(NOTE [ State mirror ] in ``mirror``)."""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from mqstore.mirror.install import InstallReport, check_complete, install_mirror_files

if TYPE_CHECKING:
    from mqstore.store.facade import MessageStore

log = logging.getLogger(__name__)


def install_mirror(store: "MessageStore", *, timeout_s: float = 30.0) -> InstallReport:
    """Put the slave's mirror of its master's state files (``replica/``) in the place of the
    store's own, on the open, writable ``store``; returns what was moved where.

    The contract with the promotion that calls it:

    * Call it after the store stopped receiving the master's log (its HA client stopped) and
      before it takes any write: it waits (up to ``timeout_s``; ``TimeoutError`` otherwise,
      nothing changed) until dispatch covers every byte the store holds, so every state
      record received is applied.
    * It refuses, changing nothing, with ``mirror.install.MirrorIncompleteError`` saying what
      is missing, unless a complete snapshot was applied (``replica/state.json``): the
      master ships one when it starts and whenever a slave connects.
    * It closes the store's consumer side (consumers of this process end as at the store's
      close: auto-commit commits, pop journals are compacted; their files are the slave's
      own, and go aside), moves the store's own state files to
      ``replica-previous/<UTC time>/`` (named in the report, and logged), moves the mirror's
      files into place (documents before journals before marks), and opens the consumer side
      again on the new files; topic configs, deleted topics and subscriptions are re-read.
      Consumers in other processes (read-only stores) see new files and reload them.
    * The caller makes the slave's applier stop (``mirror.applier.StateApplier`` follows
      while its ``following()`` answers True; the store's role decides it) before the store,
      now a master, ships its own state, and starts the shipper (``Replication`` does, when
      it starts as a master).

    On a stopped slave directory, ``mirror.install.install_mirror_files(root)`` does the
    same before the store is opened as a master.
    """
    store._check_open()
    if store.read_only:
        raise PermissionError(f"store {store.root!r} is open read-only: the mirror is "
                              f"installed by the store that writes")
    check_complete(store.root)  # before anything is closed
    store.wait_dispatched(timeout_s)
    store._consumers.close()
    try:
        report = install_mirror_files(store.root)
    finally:
        store._consumers = store._consumers_of(store._parts)
        store.view.topics.reload()
        store.view.subscriptions.reload()
    log.warning("%s", report.describe())
    return report


__all__ = ["install_mirror"]

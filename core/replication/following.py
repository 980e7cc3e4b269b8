"""A slave's epochs as it follows its master (``format.epoch_file``): checked at every
connection against what the master said of itself (NOTE [ Node fields ] in
``format.ha_hello``), then taken as the log grows.

At a connection, with ``end`` this log's end and the master's entries and end:

- the master says nothing of its epochs (RocketMQ's master, an older mqstore): nothing is
  checked here, the classic rules stand (a frame must continue this log; a report past the
  master's end is refused there);
- this store's newest epoch is above the master's: that master was replaced; it is not
  followed (``MasterStale``), and it learns so from this slave's proof (NOTE [ Newer epochs ]);
- no epoch in common (``consistent_point`` is -1): the logs have nothing in common that the
  epochs can vouch for; not followed (``ReplicaDiverged``: rebuild this store);
- the consistent point is below ``end``: this log holds records the master does not
  (``CutNeeded``: the store cuts them and rejoins, NOTE [ Rejoining ]);
- else this log is a prefix of the master's: it takes the master's entries it reaches now,
  and each later one once its log reaches that entry's start (``advance``).
"""

from __future__ import annotations

from mqstore.format.epoch_file import EpochEntry, consistent_point, reached
from mqstore.format.ha_hello import NodeInfo
from mqstore.replication.receiver import ReplicaDiverged


class MasterStale(Exception):
    """The master's newest epoch is below this store's: it is not the master any more."""


class CutNeeded(Exception):
    """This log holds records past the consistent point with the master."""

    def __init__(self, point: int, end: int, master: NodeInfo) -> None:
        super().__init__(f"this log ends at {end}, but holds the master's bytes only up to "
                         f"{point} (epoch {master.last_epoch}): the bytes after it were "
                         f"written by this store as master and the master never had them")
        self.point = point
        self.end = end
        self.master = master


class Following:
    """Used by the slave's client thread only."""

    def __init__(self, epochs) -> None:
        self.epochs = epochs  # the store's EpochFile
        self._pending: list[EpochEntry] = []

    def check(self, master: NodeInfo | None, end: int) -> None:
        """The rules above, at a new connection (raises when not to follow)."""
        self._pending = []
        if master is None or not master.epochs:
            return
        own = self.epochs.entries
        if own and own[-1].epoch > master.last_epoch:
            raise MasterStale(
                f"the master's newest epoch is {master.last_epoch}, below this store's "
                f"{own[-1].epoch}: it was replaced by a newer master, and is not followed")
        if own:
            point = consistent_point(own, end, list(master.epochs), master.end)
            if point < 0:
                raise ReplicaDiverged(
                    f"this store's epochs ({_show(own)}) and the master's "
                    f"({_show(master.epochs)}) have no epoch in common starting at the same "
                    f"offset: nothing says where the logs agree; rebuild this store from the "
                    f"master")
            if point < end:
                raise CutNeeded(point, end, master)
        taken = reached(list(master.epochs), end)
        self._pending = [e for e in master.epochs if e.start > end]
        if taken != own:
            self.epochs.replace(taken)

    def advance(self, end: int) -> None:
        """This log now ends at ``end``: take the master's entries it reached."""
        while self._pending and self._pending[0].start <= end:
            entry = self._pending.pop(0)
            self.epochs.append(entry.epoch, entry.start)


def _show(entries) -> str:
    return ", ".join(f"{e.epoch}-{e.start}" for e in entries) or "none"


__all__ = ["Following", "CutNeeded", "MasterStale"]

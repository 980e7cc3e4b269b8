"""The store clock: epoch milliseconds, one clock for a store and its worker processes.

A clock is any callable returning int ms. It is pickled to the worker processes with their
arguments, so it must be picklable and, when it is settable, shared: ``system_clock`` (a
module-level function) and ``ManualClock`` (a cell in shared memory) both are. Workers do not
import the main script, so a clock defined there cannot reach them either; ``check_clock``
says so when the store opens, before anything touches its directory.
"""

from __future__ import annotations

import io
import os
import secrets
import time
import types
import weakref
from multiprocessing.reduction import ForkingPickler

import numpy as np

from mqstore.storage.shared_segment import close_segment, open_segment


def system_clock() -> int:
    return time.time_ns() // 1_000_000


CLOCK_SEGMENT_PREFIX = "mqs_clock_"  # /dev/shm/mqs_clock_<creator pid>_<random>


class ManualClock:
    """Store clock for tests: returns ``now`` (epoch ms) until told otherwise.

    One clock across processes: ``now`` is an int64 cell in a shared-memory segment, and a
    pickled clock (a spawned worker's argument) attaches to the same cell, so the worker sees
    an ``advance`` at once, and the test sees the worker's. The creating clock owns the segment
    and unlinks it when it is collected or at interpreter exit; an attached one only detaches.
    No resource tracker holds the segment (a tracker shared with a spawned worker would lose
    the creator's entry when the worker unregisters its own). Each step is one aligned 8-byte
    load or store, but ``advance`` reads then writes: advances from two processes at the same
    time can lose one, so a test orders them.
    """

    def __init__(self, now: int = 1_700_000_000_000) -> None:
        name = f"{CLOCK_SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        self._bind(*open_segment(name, 8, create=True, tracked=False))
        self.now = now

    def _bind(self, shm, owner: bool) -> None:
        self._shm = shm
        # The view sits in a list the finalizer empties: the segment cannot close under a view.
        self._cell = [np.ndarray((1,), dtype=np.int64, buffer=shm.buf)]
        weakref.finalize(self, _release_clock, shm, owner, self._cell)

    @property
    def now(self) -> int:
        return int(self._cell[0][0])

    @now.setter
    def now(self, value: int) -> None:
        self._cell[0][0] = value

    def __call__(self) -> int:
        return int(self._cell[0][0])

    def advance(self, ms: int) -> int:
        cell = self._cell[0]
        now = int(cell[0]) + ms
        cell[0] = now
        return now

    def __reduce__(self):
        # Another process (or a copy) attaches to the same segment by name.
        return (_attach_clock, (self._shm.name,))


def _attach_clock(name: str) -> ManualClock:
    clock = ManualClock.__new__(ManualClock)
    clock._bind(*open_segment(name, 8, create=False, tracked=False))
    return clock


def _release_clock(shm, owner: bool, cell: list) -> None:
    cell.clear()
    close_segment(shm, owner, tracked=False)


CLOCK_RULE = (
    "a store clock must reach the worker processes: a function defined at module level in "
    "an importable module (not the main script, which workers do not import), or "
    "mqstore.testing.ManualClock, which stays one clock shared with them; a clock that "
    "cannot travel can run with the loops in this process (dispatch.worker: thread and "
    "flush.worker: thread)")


def check_clock(clock, *, to_workers: bool) -> None:
    """Refuse a clock the store cannot use: TypeError when it is not callable; ValueError
    naming it and ``CLOCK_RULE`` when it goes ``to_workers`` and could not be pickled there,
    or would be looked up in a main script the workers never import."""
    if not callable(clock):
        raise TypeError(f"clock must be a callable returning epoch milliseconds, got {clock!r}")
    if not to_workers:
        return
    pickler = _WorkerPickler(io.BytesIO())
    try:
        pickler.dump(clock)
    except Exception as exc:
        raise ValueError(f"clock {clock!r} cannot be pickled to the store's worker processes "
                         f"({exc}); {CLOCK_RULE}") from None
    if pickler.in_main:
        raise ValueError(f"clock {clock!r} refers to {', '.join(pickler.in_main)} of the main "
                         f"script, which the store's worker processes cannot import; "
                         f"{CLOCK_RULE}")


class _WorkerPickler(ForkingPickler):
    """Pickles as the worker processes' arguments are, noting what it finds in ``__main__``."""

    def __init__(self, file) -> None:
        super().__init__(file)
        self.in_main: list[str] = []

    def reducer_override(self, obj):
        if (isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType))
                and getattr(obj, "__module__", None) == "__main__"):
            self.in_main.append(obj.__qualname__)
        return NotImplemented

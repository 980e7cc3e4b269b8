"""When the loops' periodic jobs are due: one scheduler for a store and its worker processes.

A writable store's loops run jobs every so often (``JOBS``): the store process's metadata tick
and cleanup decision (``runtime.loops``), the forcing of what dispatch derives (the dispatch
worker, ``dispatch.derived_flush``), the flush loop's interval pass and the transient pool's
thorough commit (``runtime.workers.flush_worker``). A consumer commits on its own and looks for
a rebalance every so often (``consumer.group``), and folds its offset journal
(``consumer.offsets``). Each measures its interval on its scheduler's ``monotonic`` clock,
sleeps no longer than ``wait_s`` before it looks at that clock again, and says ``ran`` once a
job is done.

``system_scheduler`` is the monotonic clock and records nothing. ``ManualScheduler`` is a
clock a test moves by hand, as Kafka's MockTime and MockScheduler are: nothing periodic runs
until it moves, and ``run`` moves it and returns once the named jobs ran. Like the store clock
(``mqstore.clock``), a scheduler is pickled to the worker processes with their arguments; a
``ManualScheduler``'s time and the jobs' last runs are cells in shared memory, so a worker sees
the test move the clock, and the test sees the worker's runs.
"""

from __future__ import annotations

import os
import secrets
import time
import weakref
from typing import Protocol

import numpy as np

from mqstore.storage.shared_segment import close_segment, open_segment

JOBS = (
    "metadata",  # Runtime.tick, about once a second: the lock check, the checkpoint (and with
    #              dispatch on a thread, what "derived_flush" does)
    "cleanup",  # Runtime.tick, every cleanup.interval_ms: the policy's decision, the deletion
    "derived_flush",  # the dispatch worker, once a second: consume queues, dispatchers' files,
    #                   the queue manifest, mqstore.queued
    "flush",  # the flush loop, every flush.interval_ms (a thorough pass every
    #           flush.thorough_interval_ms)
    "commit",  # the flush loop, every writer.commit_interval_ms: staged bytes by
    #            writer.commit_least_pages (all of them every writer.commit_thorough_interval_ms)
)
_INDEX = {job: i for i, job in enumerate(JOBS)}


class Scheduler(Protocol):
    """What a loop asks about time. Intervals only: store timestamps come from the store
    clock."""

    def monotonic(self) -> float:
        """Seconds on the clock intervals are measured on."""

    def wait_s(self, seconds: float) -> float:
        """How long a loop whose next job is ``seconds`` away may sleep before it looks at
        ``monotonic`` again (it wakes earlier when signalled)."""

    def ran(self, job: str, at: float) -> None:
        """The loop finished ``job`` (one of ``JOBS``), found due at ``at``."""


class SystemScheduler:
    """The monotonic clock; runs are not recorded."""

    monotonic = staticmethod(time.monotonic)

    @staticmethod
    def wait_s(seconds: float) -> float:
        return seconds

    @staticmethod
    def ran(job: str, at: float) -> None:
        return None

    def __reduce__(self):
        return "system_scheduler"  # unpickles as the module's one instance


system_scheduler = SystemScheduler()

SCHEDULER_SEGMENT_PREFIX = "mqs_sched_"  # /dev/shm/mqs_sched_<creator pid>_<random>
LOOK_S = 0.02  # a loop under a ManualScheduler looks at its clock this often
RUN_STEP_S = 86_400.0  # how far ``run`` moves the clock: past every interval a store keeps
RUN_AGAIN_S = 0.5  # ``run`` moves it again after this long (real time) without the runs
NEVER = float("-inf")


class ManualScheduler:
    """A scheduler for tests: the clock stands still until ``advance`` or ``run`` moves it.

    ``run("cleanup")`` moves the clock a day ahead, so every periodic job of every loop using
    this scheduler is due, and returns when cleanup ran after the move (a run begun before it
    does not count). Jobs in other processes (the workers, a writer process that
    attached by ``name``) are waited for the same way. One writable store per scheduler when
    a test waits on its jobs: two would each count.

    The cells (the clock, then each job's last run) are float64s in a shared-memory segment
    that the creating scheduler owns and unlinks when collected, as ``ManualClock``'s.
    """

    def __init__(self, start: float = 0.0) -> None:
        name = f"{SCHEDULER_SEGMENT_PREFIX}{os.getpid()}_{secrets.token_hex(6)}"
        self._bind(*open_segment(name, 8 * (1 + len(JOBS)), create=True, tracked=False))
        cells = self._cells[0]
        cells[0] = start
        cells[1:] = NEVER

    def _bind(self, shm, owner: bool) -> None:
        self._shm = shm
        # The view sits in a list the finalizer empties: the segment cannot close under a view.
        self._cells = [np.ndarray((1 + len(JOBS),), dtype=np.float64, buffer=shm.buf)]
        weakref.finalize(self, _release, shm, owner, self._cells)

    @property
    def name(self) -> str:
        """The segment's name: another process attaches with ``attach_scheduler(name)``."""
        return self._shm.name

    # -- what loops ask ----------------------------------------------------------------------
    def monotonic(self) -> float:
        return float(self._cells[0][0])

    @staticmethod
    def wait_s(seconds: float) -> float:
        return min(seconds, LOOK_S)

    def ran(self, job: str, at: float) -> None:
        cells = self._cells[0]
        i = 1 + _INDEX[job]
        if at > cells[i]:  # one process runs a job at a time
            cells[i] = at

    # -- what tests do -----------------------------------------------------------------------
    def advance(self, seconds: float) -> float:
        """Move the clock ``seconds`` ahead; returns the new time. Advances from two processes
        at once can lose one (a read, then a write): a test orders them."""
        if not seconds >= 0:
            raise ValueError(f"seconds {seconds!r} must be >= 0: the clock only moves ahead")
        cells = self._cells[0]
        now = float(cells[0]) + seconds
        cells[0] = now
        return now

    def last_run(self, job: str) -> float:
        """When ``job`` last ran on this clock (``-inf``: never)."""
        return float(self._cells[0][1 + _job_index(job)])

    def run(self, *jobs: str, seconds: float = RUN_STEP_S, timeout: float = 60.0) -> float:
        """Move the clock ``seconds`` ahead and wait, up to ``timeout`` real seconds, until
        every one of ``jobs`` ran at that time or later; returns the time moved to. While they
        have not, the clock moves on by ``seconds`` every ``RUN_AGAIN_S``: a loop that started
        after the first move (a worker starting up) counts its interval from there."""
        for job in jobs:
            _job_index(job)
        target = self.advance(seconds)
        began = time.monotonic()
        moved = began
        while True:
            late = [job for job in jobs if self.last_run(job) < target]
            if not late:
                return target
            now = time.monotonic()
            if now - began > timeout:
                raise TimeoutError(
                    f"{', '.join(late)} did not run within {timeout} s of the scheduler "
                    f"moving to {target} s (is a writable store open with this scheduler?)")
            if now - moved >= RUN_AGAIN_S:
                self.advance(seconds)
                moved = now
            time.sleep(LOOK_S)

    def __reduce__(self):
        # Another process (or a copy) attaches to the same segment by name.
        return (attach_scheduler, (self.name,))


def _job_index(job: str) -> int:
    try:
        return _INDEX[job]
    except KeyError:
        raise ValueError(f"job {job!r} is not one of the loops' jobs {list(JOBS)}") from None


def attach_scheduler(name: str) -> ManualScheduler:
    """The ``ManualScheduler`` whose ``name`` is given, from another process."""
    scheduler = ManualScheduler.__new__(ManualScheduler)
    scheduler._bind(*open_segment(name, 8 * (1 + len(JOBS)), create=False, tracked=False))
    return scheduler


def _release(shm, owner: bool, cells: list) -> None:
    cells.clear()
    close_segment(shm, owner, tracked=False)

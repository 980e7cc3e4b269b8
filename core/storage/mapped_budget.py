"""How many consume-queue files one process keeps mapped: a bounded set, least recently used
first out.

NOTE [ Mapped budget ]
Every mapped segment costs two descriptors (Python's mmap keeps a duplicate of the one it was
made from), so a process that kept every queue it ever touched mapped would run out of
descriptors with the number of topics: a server taking sends to ten thousand new topics, or a
store holding them, would need twenty thousand. A ``MappedBudget`` governs the consume queues
of one process (the view's, ``DirectoryView``): each queue counts the files it has mapped, and
once the total passes ``capacity`` the queues used least recently are parked (their files
unmapped, their positions kept: ``MappedFile.park``) until it fits again. A parked queue maps
its files again when next used, so parking changes how many descriptors a process holds,
never what a read or a write sees.

A queue is in use from ``enter`` to ``leave`` (``ConsumeQueue`` brackets every method that
touches its maps): a queue in use is never parked, so a write never meets an unmapped file.
Arrays a read handed out may outlive that bracket; they pin their file's map (``park`` finds
it exported and leaves that file mapped), so the bound is ``capacity`` plus the files such
arrays still hold. Reads that take the map directly (``read.plain_pull``) treat a closed map
as "look the slow way", which unparks it.
"""

from __future__ import annotations

import errno
import functools
import threading
from collections import OrderedDict


OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


class MappedBudget:
    """At most ``capacity`` mapped files among the queues that ``enter`` it (plus those in use).
    Thread-safe."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity {capacity!r} must be at least 1")
        self.capacity = capacity
        self._lock = threading.Lock()
        self._mapped: OrderedDict = OrderedDict()  # queue -> files it has mapped, LRU first
        self._users: dict = {}  # queue -> brackets open on it
        self._total = 0
        self.parked = 0  # queues parked so far (for the curious: tests and metrics)

    @property
    def mapped_files(self) -> int:
        return self._total

    def enter(self, queue) -> None:
        """``queue`` is about to touch its maps: unpark it if it was parked."""
        with self._lock:
            self._users[queue] = self._users.get(queue, 0) + 1
            if queue.parked:
                try:
                    queue.unpark()
                except BaseException:
                    self._release(queue)
                    raise
            self._count(queue)

    def leave(self, queue) -> None:
        """``queue`` is done for now: count what it maps, park others past the capacity."""
        with self._lock:
            self._release(queue)
            self._count(queue)
            if self._total > self.capacity:
                self._park_idle()

    def adopt(self, queue) -> None:
        """Count a queue mapped before the budget knew it (loaded at open); park past the
        capacity."""
        with self._lock:
            self._count(queue)
            if self._total > self.capacity:
                self._park_idle()

    def forget(self, queue) -> None:
        """``queue`` was closed or dropped."""
        with self._lock:
            self._total -= self._mapped.pop(queue, 0)
            self._users.pop(queue, None)

    def shed(self) -> None:
        """Park every queue not in use (the process ran out of descriptors)."""
        with self._lock:
            capacity, self.capacity = self.capacity, 0
            try:
                self._park_idle()
            finally:
                self.capacity = capacity

    def _release(self, queue) -> None:
        users = self._users.get(queue, 0) - 1
        if users > 0:
            self._users[queue] = users
        else:
            self._users.pop(queue, None)

    def _count(self, queue) -> None:
        files = queue.mapped_files()
        self._total += files - self._mapped.pop(queue, 0)
        if files:
            self._mapped[queue] = files  # most recently used last

    def _park_idle(self) -> None:
        """Park the least recently used queues not in use until the total fits."""
        for queue in list(self._mapped):
            if self._total <= self.capacity:
                return
            if queue in self._users:
                continue
            queue.park()
            self.parked += 1
            self._count(queue)


def maps(method):
    """Bracket a method of a ``Parkable`` that touches its maps: its budget keeps it mapped
    meanwhile. Out of descriptors (the process's other files took them), every queue not in
    use is parked and the method tried once more: what it maps or writes is idempotent (a
    write skips the units already there)."""
    @functools.wraps(method)
    def run(self, *args, **kwargs):
        budget = self._budget
        if budget is None:
            return method(self, *args, **kwargs)
        try:
            return _bracketed(budget, method, self, args, kwargs)
        except OSError as exc:
            if exc.errno not in OUT_OF_DESCRIPTORS:
                raise
            budget.shed()
            return _bracketed(budget, method, self, args, kwargs)
    return run


def _bracketed(budget, method, queue, args, kwargs):
    budget.enter(queue)
    try:
        return method(queue, *args, **kwargs)
    finally:
        budget.leave(queue)


class Parkable:
    """What a consume queue needs to be governed by a ``MappedBudget``: its ``segments`` (a
    ``SegmentQueue``) parked and mapped again, ``_arrays`` (views of the maps) forgotten when
    parked, ``min_logic_offset`` raised past leading files deleted meanwhile. It sets
    ``_budget`` (None: always mapped) and ``parked``."""

    _budget: MappedBudget | None
    parked: bool

    def govern(self, budget: MappedBudget) -> None:
        """Count this queue's mapped files in ``budget`` from now on."""
        self._budget = budget
        budget.adopt(self)

    def forget(self) -> None:
        """The queue was closed: the budget stops counting it."""
        if self._budget is not None:
            self._budget.forget(self)

    def mapped_files(self) -> int:
        return sum(1 for seg in self.segments.segments if seg.mapped)

    def park(self) -> None:
        """Unmap the files (positions stay); the next bracketed method maps them again."""
        self._arrays.clear()
        for seg in self.segments.segments:
            seg.park()
        self.parked = True

    def unpark(self) -> None:
        """Map the files again. A leading file deleted meanwhile (cleanup: the writer's, when
        this process follows it) is forgotten, as a follower's ``refresh`` forgets it."""
        segs = self.segments.segments
        for i, seg in enumerate(segs):
            try:
                seg.unpark()
            except FileNotFoundError:
                if any(s.mapped or s.parked for s in segs[:i]) or i == len(segs) - 1:
                    raise
                seg.close()
        kept = [seg for seg in segs if seg.mapped]
        if len(kept) < len(segs):
            self.segments.segments = kept
            self.min_logic_offset = max(self.min_logic_offset, self.segments.min_offset)
        self.parked = False


__all__ = ["MappedBudget", "Parkable", "maps"]

"""GroupConsumer: RocketMQ's consumer with committed offsets, on the store's columnar reads.

``poll`` reads the queues this instance owns with ``MessageStore.read`` (a ``ReadBatch`` per
queue and read) from where it left off, and when nothing is there sleeps on the dispatch
notification (NOTE [ Long polling ] in ``workers.wakeup``) until messages arrive or its
timeout passes. ``commit`` records, for every owned queue, the offset after the last message
polled (``config/consumerOffset.json``); a restarted or new owner starts there, so a message
is delivered again only when it was polled after the last commit (at least once), and never
skipped. Instances of one group in any processes split the topic's queues
(NOTE [ Group membership ] in ``consumer.membership``).

Where a group with no offset starts (``consume_from``, RocketMQ's ConsumeFromWhere) is decided
once for the group: its first instance records a start for every queue of the topic; a queue
created later (after the instance opened) starts at its first message, so the group misses
nothing put after it started.

Not thread-safe: one thread polls and commits a consumer (open one per thread).
"""

from __future__ import annotations

import logging
import os
import time

from mqstore.consumer import names
from mqstore.consumer.membership import Membership
from mqstore.consumer.messages import Polled
from mqstore.consumer.progress import QueueLag, group_offsets, queue_lags
from mqstore.errors import PluginError, StoreClosedError
from mqstore.message import GetStatus
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR

log = logging.getLogger(__name__)
TAKE_RETRY_S = 0.05  # a queue its previous owner still holds is tried again this soon
_NOTHING_NEW = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)


class GroupConsumer:
    """One instance of a consumer group reading one topic. Use as a context manager, or call
    ``close``."""

    def __init__(self, service, group: str, topic: str, expression: str | None = None,
                 expression_type: str = "TAG", *, consume_from: str = names.LAST,
                 consume_timestamp: int | None = None, auto_commit: bool | None = None,
                 allocation: str | None = None) -> None:
        store = service.store
        cfg = store.config
        names.check_group(group)
        names.check_topic(topic)
        names.check_consume_from(consume_from, consume_timestamp)
        if auto_commit is not None and not isinstance(auto_commit, bool):
            raise ValueError(f"auto_commit {auto_commit!r} must be True, False or None "
                             f"(None: consumer.auto_commit)")
        strategy_name = cfg.allocation if allocation is None else allocation
        self._strategy = store.allocation.get(strategy_name)()
        self._strategy_name = strategy_name
        if expression is not None:
            store.compile_filter(expression, expression_type)  # refuse a bad one now
        self.group, self.topic = group, topic
        self.expression, self.expression_type = expression, expression_type
        self.consume_from = consume_from
        self.consume_timestamp = consume_timestamp
        self.auto_commit = cfg.auto_commit if auto_commit is None else auto_commit
        self._auto_commit_s = cfg.auto_commit_interval_ms / 1000.0
        self._interval_s = cfg.rebalance_interval_ms / 1000.0
        self._store = store
        self._scheduler = store.scheduler  # auto-commit and rebalance intervals
        self._service = service
        self._offsets = service.offsets
        self._wakeup = service.wakeup()
        self._topic_dir = os.path.join(store.root, CONSUME_QUEUE_DIR, topic)
        self._next: dict[int, int] = {}  # owned queue -> offset of the next message to poll
        self._committed: dict[int, int] = {}  # owned queue -> offset last committed
        self._rotate = 0
        self._next_check = 0.0
        self._topic_mtime = -1
        self._pending = False
        self._last_commit = self._scheduler.monotonic()
        self._closed = False
        # Queues that appear after this instance opened start at their first message, even
        # for a group that starts "last": what was put there came after the start.
        self._queues_at_open = set(store.queue_ids(topic))
        # A damaged offset table refuses the instance before it takes a seat in the group.
        self._offsets.offsets(topic, group)
        self._membership = Membership(store.root, group, topic, store.clock())
        try:
            self._rebalance(self._scheduler.monotonic())
        except BaseException:
            self.close(commit=False)
            raise
        self._wakeup.wake_all()  # the others rebalance now, not at their next check

    # -- polling --------------------------------------------------------------------------
    def poll(self, max_msgs: int = 32, timeout_ms: int | float = 0) -> Polled:
        """Up to ``max_msgs`` messages from the queues this instance owns, waiting up to
        ``timeout_ms`` for some to arrive. Each queue's messages come in queue-offset order.
        With auto-commit, what earlier polls returned is committed first (when due)."""
        names.check_int("max_msgs", max_msgs, 1)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) \
                or not timeout_ms >= 0:
            raise ValueError(f"timeout_ms {timeout_ms!r} must be a number >= 0")
        self._check_open()
        scheduler = self._scheduler
        if self.auto_commit and scheduler.monotonic() - self._last_commit >= self._auto_commit_s:
            self.commit()
        deadline = time.monotonic() + timeout_ms / 1000.0  # the caller's, in real time
        while True:
            seen = self._wakeup.sequence()  # before looking: NOTE [ Long polling ]
            now = scheduler.monotonic()
            if self._rebalance_due(now):
                self._rebalance(now)
            batches = self._fetch(max_msgs)
            left = deadline - time.monotonic()
            if batches or left <= 0:
                return Polled(self.topic, batches)
            self._wakeup.wait(seen, min(left, scheduler.wait_s(
                max(self._next_check - scheduler.monotonic(), 0.001))))

    def _fetch(self, max_msgs: int) -> list:
        owned = sorted(self._next)
        if not owned:
            return []
        start = self._rotate % len(owned)
        self._rotate += 1  # every queue gets its turn to go first
        return read_queues(self._store, self.topic, self.group, owned[start:] + owned[:start],
                           self._next, max_msgs, self.expression, self.expression_type)

    # -- committing -----------------------------------------------------------------------
    def commit(self) -> dict[int, int]:
        """Record, for every owned queue, the offset after the last message polled; returns
        what was written (queues whose offset moved since the last commit)."""
        self._check_open()
        return self._commit(list(self._next))

    def _commit(self, queues) -> dict[int, int]:
        changed = {q: self._next[q] for q in queues if self._next[q] != self._committed.get(q)}
        if changed:
            self._offsets.commit(self.topic, self.group, changed)
            self._committed.update(changed)
            self._service.state_changed()
        self._last_commit = self._scheduler.monotonic()
        return changed

    def seek(self, queue_id: int, offset: int) -> None:
        """Poll ``queue_id`` (owned by this instance) from ``offset`` on; ``commit`` records
        it."""
        names.check_int("queue_id", queue_id, 0)
        names.check_int("offset", offset, 0)
        self._check_open()
        if queue_id not in self._next:
            raise ValueError(f"queue_id {queue_id} is not consumed by this instance of group "
                             f"{self.group!r} (it owns {sorted(self._next)}); seek only owned "
                             f"queues")
        self._next[queue_id] = offset

    # -- what it owns and how far the group is --------------------------------------------
    @property
    def assignment(self) -> list[int]:
        """The queues this instance consumes now."""
        return sorted(self._next)

    @property
    def member_id(self) -> str:
        return self._membership.member_id

    def positions(self) -> dict[int, int]:
        """Owned queue -> offset of the next message ``poll`` returns."""
        return dict(self._next)

    def committed(self) -> dict[int, int]:
        """The group's committed offsets in every queue (all instances', from the file)."""
        return self._offsets.offsets(self.topic, self.group)

    def lag(self) -> list[QueueLag]:
        """The group's backlog in every queue of the topic (see ``MessageStore.consumer_lag``)."""
        self._check_open()
        return queue_lags(self._store, self.topic,
                          group_offsets(self._store.root, self._offsets, self.topic, self.group))

    # -- rebalancing ----------------------------------------------------------------------
    def _rebalance_due(self, now: float) -> bool:
        if now >= self._next_check or self._membership.changed():
            return True
        try:
            mtime = os.stat(self._topic_dir).st_mtime_ns  # a queue was created
        except FileNotFoundError:
            mtime = -1
        return mtime != self._topic_mtime

    def _rebalance(self, now: float) -> None:
        try:
            self._topic_mtime = os.stat(self._topic_dir).st_mtime_ns
        except FileNotFoundError:
            self._topic_mtime = -1
        members = self._membership.members()
        queues = self._store.queue_ids(self.topic)
        mine = self._allocate(members, queues)
        gone = [q for q in self._next if q not in mine]
        if gone:
            if self.auto_commit:  # a poll says the previous ones were handled
                self._commit(gone)
            for q in gone:
                self._membership.give_up(q)
                del self._next[q]
                self._committed.pop(q, None)
        wanted = [q for q in sorted(mine) if q not in self._next]
        taken = [q for q in wanted if self._membership.try_take(q)]
        if taken:
            self._start(taken, queues)
        self._pending = len(taken) < len(wanted)
        self._next_check = now + (TAKE_RETRY_S if self._pending else self._interval_s)
        if gone or taken:
            log.info("group %s, %s: member %s consumes queues %s", self.group, self.topic,
                     self.member_id, sorted(self._next))

    def _allocate(self, members: list[str], queues: list[int]) -> set[int]:
        mine = self._strategy.allocate(self.group, self.member_id, members, queues)
        try:
            chosen = {int(q) for q in mine}
        except (TypeError, ValueError):
            chosen = None
        if chosen is None or not chosen <= set(queues):
            raise PluginError(f"allocation strategy {self._strategy_name!r} returned {mine!r} "
                              f"for queues {queues}: it must return some of those queue ids")
        return chosen

    def _start(self, taken: list[int], queues: list[int]) -> None:
        """Offsets of newly taken queues: committed, or where the group starts."""
        recorded = self._offsets.offsets(self.topic, self.group)
        missing = [q for q in taken if q not in recorded]
        if missing:
            if recorded:  # the group is under way: a queue new to it starts at its first message
                start = {q: self._store.min_offset(self.topic, q) for q in missing}
            else:  # a new group: where it starts is decided once, for every queue
                start = {q: self._initial(q) if q in self._queues_at_open
                         else self._store.min_offset(self.topic, q)
                         for q in sorted(set(queues) | set(missing))}
            recorded.update(self._offsets.start_where_absent(self.topic, self.group, start))
        for q in taken:
            self._next[q] = self._committed[q] = recorded[q]

    def _initial(self, q: int) -> int:
        return initial_offset(self._store, self.topic, q, self.consume_from,
                              self.consume_timestamp)

    # -- closing --------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"consumer of group {self.group!r} on {self.topic!r} is "
                                   f"closed")

    def close(self, commit: bool | None = None) -> None:
        """Leave the group: commit (with auto-commit, or when ``commit`` is True), give the
        queues up, and let the others rebalance at once."""
        if self._closed:
            return
        self._closed = True
        try:
            if self.auto_commit if commit is None else commit:
                self._commit(list(self._next))
            self._offsets.persist()  # NOTE [ Offset journal ]: the document is complete now
        finally:
            self._next.clear()
            self._membership.leave()
            self._wakeup.wake_all()

    def __enter__(self) -> "GroupConsumer":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        # Messages polled just before an exception may not have been handled: no commit then.
        self.close(commit=None if exc_type is None else False)

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"queues {self.assignment}"
        return f"GroupConsumer({self.group!r}, {self.topic!r}, {state})"


def read_queues(store, topic: str, group: str, order: list[int], positions: dict[int, int],
                max_msgs: int, expression: str | None, expression_type: str) -> list:
    """Up to ``max_msgs`` messages of ``topic`` as ``(queue_id, ReadBatch)`` pairs: each queue
    of ``order`` in turn, read from ``positions[q]`` on until it has nothing more (or the
    count is reached), then the next. ``positions`` moves past what was read, and past what
    the subscription passed over. A poll's read (``GroupConsumer``) and a peek's
    (``consumer.peek``)."""
    read = store.read
    out, n = [], 0
    for q in order:
        while n < max_msgs:
            offset = positions[q]
            batch = read(topic, q, offset, max_msgs - n, expression=expression,
                         expression_type=expression_type, group=group)
            if batch is None:  # the store is not readable now
                break
            if len(batch):
                out.append((q, batch))
                n += len(batch)
            moved = batch.next_begin_offset
            if batch.status is GetStatus.OFFSET_TOO_SMALL:
                log.warning("group %s, %s/%d: messages %d..%d were deleted before they were "
                            "consumed; going on from %d", group, topic, q, offset,
                            moved - 1, moved)
            positions[q] = moved
            if batch.status in _NOTHING_NEW or moved == offset:
                break
    return out


def initial_offset(store, topic: str, q: int, consume_from: str,
                   consume_timestamp: int | None) -> int:
    """Where a new group starts queue ``q`` (``consume_from``: RocketMQ's ConsumeFromWhere)."""
    if consume_from == names.FIRST:
        return store.min_offset(topic, q)
    if consume_from == names.LAST:
        return store.max_offset(topic, q)
    ts = consume_timestamp
    if ts is None:
        ts = store.clock() - names.HALF_AN_HOUR_MS
    return store.offset_by_time(topic, q, ts)

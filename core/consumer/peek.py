"""GroupPeek: what a consumer group would get next, read without joining the group.

A peek (``store.peek``, ``mqstore consume --no-commit``) starts each queue where an instance
of the group would start it: at the group's committed offset; in a queue the group has no
offset for, where a new instance would (the group's ``consume_from`` when the group has no
offset at all; a group under way starts a queue new to it at its first message, as does
everyone for a queue created after the peek opened). It then reads as a lone instance owning
every queue of the topic polls (``group.read_queues``, the same round-robin over the sorted
queues) and waits for messages on the same dispatch notification (NOTE [ Long polling ] in
``workers.wakeup``).

It writes nothing under the store: no seat among the group's members and no queue lock (the
group's live instances keep their queues and are not woken), no start offset and no commit.
The wakeup word is only opened, never created: while no process has made it, a wait looks
again every ``consumer.rebalance_interval_ms``. The committed offsets are read once, when the
peek opens (and again for a queue that appears later); what the group commits meanwhile does
not move a peek.
"""

from __future__ import annotations

import os
import time

from mqstore.consumer import names
from mqstore.consumer.group import initial_offset, read_queues
from mqstore.consumer.messages import Polled
from mqstore.errors import StoreClosedError
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR
from mqstore.runtime.workers.wakeup import Wakeup


class GroupPeek:
    """Reads ``topic`` from where ``group`` would go on, as a non-member. Use as a context
    manager, or call ``close``."""

    def __init__(self, service, group: str, topic: str, expression: str | None = None,
                 expression_type: str = "TAG", *, consume_from: str = names.LAST,
                 consume_timestamp: int | None = None) -> None:
        store = service.store
        names.check_group(group)
        names.check_topic(topic)
        names.check_consume_from(consume_from, consume_timestamp)
        if expression is not None:
            store.compile_filter(expression, expression_type)  # refuse a bad one now
        self.group, self.topic = group, topic
        self.expression, self.expression_type = expression, expression_type
        self._store = store
        self._root = service.root
        self._offsets = service.offsets
        self._look_s = service.config.rebalance_interval_ms / 1000.0
        self._topic_dir = os.path.join(store.root, CONSUME_QUEUE_DIR, topic)
        self._topic_mtime = self._queues_mtime()
        self._wakeup: Wakeup | None = None
        self._rotate = 0
        self._closed = False
        committed = self._offsets.offsets(topic, group)
        self._next: dict[int, int] = {}
        for q in store.queue_ids(topic):
            if q in committed:
                self._next[q] = committed[q]
            elif committed:  # the group is under way: a queue new to it from its first message
                self._next[q] = store.min_offset(topic, q)
            else:
                self._next[q] = initial_offset(store, topic, q, consume_from, consume_timestamp)

    def poll(self, max_msgs: int = 32, timeout_ms: int | float = 0) -> Polled:
        """Up to ``max_msgs`` messages, each queue's in queue-offset order, waiting up to
        ``timeout_ms`` for some to arrive (as ``GroupConsumer.poll``)."""
        names.check_int("max_msgs", max_msgs, 1)
        if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) \
                or not timeout_ms >= 0:
            raise ValueError(f"timeout_ms {timeout_ms!r} must be a number >= 0")
        self._check_open()
        deadline = time.monotonic() + timeout_ms / 1000.0
        while True:
            wakeup = self._wakeup_word()
            seen = wakeup.sequence() if wakeup is not None else 0  # NOTE [ Long polling ]
            self._add_new_queues()
            batches = self._fetch(max_msgs)
            left = deadline - time.monotonic()
            if batches or left <= 0:
                return Polled(self.topic, batches)
            if wakeup is not None:
                wakeup.wait(seen, min(left, self._look_s))
            else:
                time.sleep(min(left, self._look_s))

    def positions(self) -> dict[int, int]:
        """Queue -> offset of the next message ``poll`` returns."""
        return dict(self._next)

    def _fetch(self, max_msgs: int) -> list:
        queues = sorted(self._next)
        if not queues:
            return []
        start = self._rotate % len(queues)
        self._rotate += 1  # every queue gets its turn to go first, as in a poll
        return read_queues(self._store, self.topic, self.group, queues[start:] + queues[:start],
                           self._next, max_msgs, self.expression, self.expression_type)

    def _queues_mtime(self) -> int:
        try:
            return os.stat(self._topic_dir).st_mtime_ns  # changes when a queue is created
        except FileNotFoundError:
            return -1

    def _add_new_queues(self) -> None:
        mtime = self._queues_mtime()
        if mtime == self._topic_mtime:
            return
        self._topic_mtime = mtime
        new = [q for q in self._store.queue_ids(self.topic) if q not in self._next]
        if new:
            committed = self._offsets.offsets(self.topic, self.group)
            for q in new:
                self._next[q] = committed.get(q, self._store.min_offset(self.topic, q))

    def _wakeup_word(self) -> Wakeup | None:
        if self._wakeup is None:
            try:
                self._wakeup = Wakeup(self._root, create=False)
            except OSError:
                return None  # not made yet (or not ours to map): look again later
        return self._wakeup

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"peek of group {self.group!r} on {self.topic!r} is closed")

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._wakeup is not None:
            self._wakeup.close()
            self._wakeup = None

    def __enter__(self) -> "GroupPeek":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"at {self.positions()}"
        return f"GroupPeek({self.group!r}, {self.topic!r}, {state})"

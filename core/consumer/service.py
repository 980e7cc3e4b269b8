"""The consumer side of one open store in one process, and the store's consumer calls.

It owns what every consumer of the store shares here: the offset table, the wakeup word, the
pop consumer, and the consumers to close with the store. ``MessageStore`` delegates the calls
named in ``CONSUMER_CALLS`` to it (docs/consumers.md). It is handed what it uses of the store
(``consumer.store_side.ConsumerStore``), never the facade, so no reference cycle runs through
the facade (which is closed when dropped).
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass

from mqstore.consumer import names, pop_state
from mqstore.consumer.group import GroupConsumer
from mqstore.consumer.group_configs import GroupConfigs
from mqstore.consumer.membership import live_members, remove_group_files, topics_of_group
from mqstore.consumer.offsets import ConsumerOffsets
from mqstore.consumer.peek import GroupPeek
from mqstore.consumer.pop import PopConsumer
from mqstore.consumer.store_side import ConsumerStore
from mqstore.consumer.progress import (
    QueueLag, group_offsets, groups, queue_lags, retention_floor,
)
from mqstore.errors import InUseError, TopicNotFoundError
from mqstore.format.names import INT64_MAX, INT64_MIN, check_int, check_queue_id
from mqstore.runtime.workers.wakeup import Wakeup

log = logging.getLogger(__name__)

CONSUMER_CALLS = ("consumer", "peek", "consumer_lag", "consumer_groups", "consumed_floor",
                  "delete_consumer_group", "reset_consumer_offsets", "commit_consumer_offsets",
                  "committed_offsets", "pop", "ack", "change_invisible_duration",
                  "dead_letter", "group_config", "set_group_config", "dead_letter_counts",
                  "watch_dead_letters")


@dataclass(frozen=True)
class OffsetReset:
    """One queue of a reset: the group's offset before (None: it had none) and after, and
    the queue's offsets then."""

    queue_id: int
    before: int | None
    after: int
    min_offset: int
    max_offset: int


def live_instances(root: str, group: str, topic: str | None = None) -> dict[str, int]:
    """``{topic: live instances}`` of ``group`` (on ``topic``, or on any), where there are."""
    topics = [topic] if topic is not None else topics_of_group(root, group)
    out = {}
    for t in topics:
        alive = live_members(root, group, t)
        if alive:
            out[t] = len(alive)
    return out


def refuse_live(root: str, group: str, topic: str | None, doing: str) -> None:
    """InUseError when instances of ``group`` consume (``topic``, or any topic) now."""
    alive = live_instances(root, group, topic)
    if alive:
        where = ", ".join(f"{n} on {t!r}" for t, n in sorted(alive.items()))
        raise InUseError(f"group {group!r} has live instances ({where}): they would go on "
                         f"from the offsets they hold; stop them before {doing}")


class ConsumerService:
    def __init__(self, store: ConsumerStore) -> None:
        """``store``: what the consumers use of their store (``consumer.store_side``)."""
        self.store = store
        self.root = store.root
        self.config = store.config
        self.offsets = ConsumerOffsets(self.root, fsync=self.config.commit_fsync,
                                       persist_interval_ms=self.config.persist_interval_ms,
                                       scheduler=store.scheduler)
        self.group_configs = GroupConfigs(self.root, store.clock)
        self._wakeup: Wakeup | None = None
        self._pop = None
        self._open: "weakref.WeakSet" = weakref.WeakSet()
        self._lock = threading.Lock()

    # -- the store's consumer calls -------------------------------------------------------
    def consumer(self, group: str, topic: str, expression: str | None = None,
                 expression_type: str = "TAG", *, consume_from: str = names.LAST,
                 consume_timestamp: int | None = None, auto_commit: bool | None = None,
                 allocation: str | None = None) -> GroupConsumer:
        """An instance of consumer group ``group`` reading ``topic``: ``poll``, ``commit``,
        ``lag``, ``close`` (or ``with``). Instances of a group, in this process or others,
        split the topic's queues. ``consume_from`` (``"first"``, ``"last"``,
        ``"timestamp"`` with ``consume_timestamp`` in epoch ms) says where a group with no
        committed offset starts."""
        consumer = GroupConsumer(self, group, topic, expression, expression_type,
                                 consume_from=consume_from, consume_timestamp=consume_timestamp,
                                 auto_commit=auto_commit, allocation=allocation)
        self._open.add(consumer)
        return consumer

    def peek(self, group: str, topic: str, expression: str | None = None,
             expression_type: str = "TAG", *, consume_from: str = names.LAST,
             consume_timestamp: int | None = None) -> GroupPeek:
        """The messages ``group`` would get next from ``topic``, read without joining it:
        ``poll`` from the group's committed offsets (``consume_from`` as for ``consumer``
        where it has none), writing nothing (no membership, no offsets); ``close`` (or
        ``with``)."""
        peek = GroupPeek(self, group, topic, expression, expression_type,
                         consume_from=consume_from, consume_timestamp=consume_timestamp)
        self._open.add(peek)
        return peek

    def consumer_lag(self, group: str, topic: str) -> list[QueueLag]:
        """``QueueLag`` of ``group`` in every queue of ``topic``: max offset - committed
        offset, and the store-clock age of the oldest message it has not consumed."""
        names.check_group(group)
        names.check_topic(topic)
        return queue_lags(self.store, topic, group_offsets(self.root, self.offsets, topic, group))

    def consumer_groups(self) -> dict[tuple[str, str], dict[int, int]]:
        """``{(topic, group): {queue_id: consumed offset}}`` of every group that committed
        (``config/consumerOffset.json``) or popped."""
        return groups(self.root, self.offsets)

    def consumed_floor(self) -> tuple[int, str | None]:
        """The lowest commit-log offset holding a message some consumer group (committed or
        popping) has not consumed, and which group, queue and offset that is; ``(-1, None)``
        when every group has consumed everything stored. ``CorruptStateError`` when a group's
        state file cannot be read (its progress is unknown)."""
        return retention_floor(self.store, self.root, self.offsets)

    def delete_consumer_group(self, group: str, topic: str | None = None
                              ) -> list[tuple[str, str]]:
        """Forget ``group``'s committed offsets and pop state (of ``topic``, or all): it no
        longer holds back ``cleanup.policy: keep_unconsumed``. Its membership files
        (``consumer/groups/<group>/``) go too, unless a live instance holds them. Returns the
        ``(topic, group)`` pairs whose offsets or pop state were forgotten."""
        names.check_group(group)
        if topic is not None:
            names.check_topic(topic)
        gone = set(self.offsets.delete(group, None if topic is None else [topic]))
        for t, g in pop_state.pop_groups(self.root):
            if g == group and (topic is None or t == topic):
                self._pop_consumer().remove(t, g)
                gone.add((t, g))
        remove_group_files(self.root, group, topic)
        self.state_changed()
        return sorted(gone)

    def reset_consumer_offsets(self, group: str, topic: str, *, offset: int | None = None,
                               timestamp_ms: int | None = None,
                               queue_id: int | None = None) -> list[OffsetReset]:
        """Move ``group``'s committed offsets of ``topic`` (every queue, or ``queue_id``) to
        ``offset`` (clamped to each queue's ``[min, max]``) or to the first message stored at
        or after ``timestamp_ms`` (the queue's end when none is): RocketMQ's resetOffset.
        The group's next consumer, and its next pop, start there (its pop state of the
        topic goes, with the deliveries in flight). Refused (``InUseError``) while instances
        of the group consume the topic."""
        names.check_group(group)
        names.check_topic(topic)
        if (offset is None) == (timestamp_ms is None):
            raise ValueError("give exactly one of offset and timestamp_ms")
        if offset is not None:
            offset = check_int("offset", offset, 0, INT64_MAX)
        if timestamp_ms is not None:
            timestamp_ms = check_int("timestamp_ms", timestamp_ms, INT64_MIN, INT64_MAX)
        store = self.store
        queues = store.queue_ids(topic)
        config = store.topic_config(topic)
        if config is not None:
            queues = sorted(set(queues) | set(range(config.read_queue_nums)))
        if queue_id is not None:
            queues = [check_queue_id(queue_id)]
        elif not queues:
            raise TopicNotFoundError(f"topic {topic!r} has no queues and no config in "
                                     f"{self.root!r}")
        refuse_live(self.root, group, topic, "resetting its offsets")
        before = group_offsets(self.root, self.offsets, topic, group)
        out = []
        for q in queues:
            low, high = store.min_offset(topic, q), store.max_offset(topic, q)
            after = (min(max(offset, low), high) if offset is not None
                     else store.offset_by_time(topic, q, timestamp_ms))
            out.append(OffsetReset(q, before.get(q), after, low, high))
        self.offsets.commit(topic, group, {r.queue_id: r.after for r in out})
        self.offsets.persist()
        if (topic, group) in pop_state.pop_groups(self.root):
            self._pop_consumer().remove(topic, group)
        self.state_changed()
        return out

    def commit_consumer_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Record ``group``'s offsets of ``topic`` (``{queue id: next offset to consume}``) as a
        consumer commits them: RocketMQ's updateConsumerOffset, for consumers the store does
        not run itself (a broker's clients). Other queues and groups stay."""
        names.check_group(group)
        names.check_topic(topic)
        checked = {check_queue_id(q): check_int("offset", o, 0, INT64_MAX)
                   for q, o in offsets.items()}
        self.offsets.commit(topic, group, checked)

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        """``{queue id: offset}`` ``group`` committed for ``topic`` (empty: none)."""
        names.check_group(group)
        names.check_topic(topic)
        return self.offsets.offsets(topic, group)

    def pop(self, group: str, topic: str, max_msgs: int = 32, invisible_ms: int = 30_000, *,
            expression: str | None = None, expression_type: str = "TAG",
            wait_ms: int | float = 0, consume_from: str = names.LAST,
            max_bytes: int | None = None) -> list:
        """RocketMQ 5's pop (SimpleConsumer.receive): up to ``max_msgs`` messages of
        ``topic``, from all its queues, each invisible to other pops for ``invisible_ms`` and
        carrying a ``receipt_handle`` for ``ack``; unacked ones come back with
        ``delivery_attempt`` + 1. Waits up to ``wait_ms`` for messages to arrive. A queue new
        to the group starts at its committed offset, else by ``consume_from``: ``"last"``
        (its end), ``"first"`` (its first message) or ``"max"`` (RocketMQ 5's proxy: its
        first message while offset 0 is still stored, else its last message).
        ``max_bytes``: at most that many bytes of records, the first message whatever its
        size (RocketMQ's maxTotalMsgSize of a pull)."""
        return self._pop_consumer().pop(group, topic, max_msgs, invisible_ms,
                                        expression=expression, expression_type=expression_type,
                                        wait_ms=wait_ms, consume_from=consume_from,
                                        max_bytes=max_bytes)

    def ack(self, receipt_handle: str | list[str] | tuple[str, ...]):
        """Acknowledge a popped message; a stale or unknown handle raises
        ``ReceiptHandleError`` and changes nothing. Given a list (or tuple) of handles,
        acknowledges them all in one step per topic and group and returns one result per
        handle, in order: None (acknowledged) or the ``ReceiptHandleError`` (a
        ``StaleReceiptHandleError`` for a delivery that is over) saying why not."""
        try:
            return self._pop_consumer().ack(receipt_handle)
        finally:
            self.state_changed()

    def change_invisible_duration(self, receipt_handle: str, invisible_ms: int) -> str:
        """Make a popped message invisible for ``invisible_ms`` from now; returns its new
        receipt handle (the old one goes stale)."""
        handle = self._pop_consumer().change_invisible_duration(receipt_handle, invisible_ms)
        self.state_changed()
        return handle

    def dead_letter(self, receipt_handle: str) -> None:
        """Send a popped message to its group's dead-letter queue (``%DLQ%<group>``) now,
        ending its delivery; a stale or unknown handle raises as ``ack`` does."""
        try:
            self._pop_consumer().dead_letter(receipt_handle)
        finally:
            self.state_changed()

    def group_config(self, group: str):
        """``group``'s config (``config/subscriptionGroup.json``, else RocketMQ's defaults)."""
        names.check_group(group)
        return self.group_configs.get(group)

    def set_group_config(self, group: str, **fields):
        """Change ``group``'s config: ``retry_max_times``, ``retry_queue_nums``,
        ``consume_enable``, ``consume_broadcast_enable``, ``consume_message_orderly``;
        returns the new config. ValueError, nothing written, when a value breaks a rule."""
        config = self.group_configs.set(group, **fields)
        self.state_changed()
        return config

    def dead_letter_counts(self) -> dict[str, int]:
        """Dead letters this store wrote since it opened, per group (a read-only store: none)."""
        dead = self.store.dead_letters
        return {} if dead is None else dead.counts()

    def watch_dead_letters(self, listener) -> None:
        """``listener(group, count)`` after each put of dead letters by this store."""
        dead = self.store.dead_letters
        if dead is not None:
            dead.watch(listener)

    def state_changed(self) -> None:
        """A change a client is told of was made (NOTE [ State mirror ]): returns once it is
        replicated as the store's role promises."""
        self.store.state_changed()

    # -- shared parts ---------------------------------------------------------------------
    def wakeup(self) -> Wakeup:
        with self._lock:
            if self._wakeup is None:
                self._wakeup = Wakeup(self.root)
            return self._wakeup

    def _pop_consumer(self):
        with self._lock:
            if self._pop is None:
                self._pop = PopConsumer(self)
            return self._pop

    def close(self) -> None:
        """The store closes: its consumers end as if closed by their owners."""
        for consumer in list(self._open):
            try:
                consumer.close()
            except Exception:
                log.exception("closing consumer %r with its store failed", consumer)
        with self._lock:
            if self._pop is not None:
                self._pop.close()
                self._pop = None
            if self._wakeup is not None:
                self._wakeup.close()
                self._wakeup = None
        self.offsets.close()

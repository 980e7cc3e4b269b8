"""The store's consumer calls (docs/consumers.md): ``MessageStore`` inherits them.

They delegate, as the facade's every call does, to ``consumer.service.ConsumerService``, which
holds what the consumers of the store share in this process (offsets, the pop consumer, the
wakeup word) and is handed what it uses of the store (``consumer.store_side``).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, overload

from mqstore.store.consumer_side import consumer_side

if TYPE_CHECKING:
    from mqstore.lifecycle.parts import StoreParts
    from mqstore.consumer.errors import ReceiptHandleError
    from mqstore.consumer.group import GroupConsumer
    from mqstore.format.subscription_group import GroupConfig
    from mqstore.consumer.peek import GroupPeek
    from mqstore.consumer.progress import QueueLag
    from mqstore.consumer.service import ConsumerService, OffsetReset


class ConsumerCalls:
    # What the calls use of the store that inherits them.
    _consumers: ConsumerService
    _dead_letter_listeners: tuple[Callable[[str, int], None], ...] = ()

    if TYPE_CHECKING:
        def _check_open(self) -> None: ...

    def consumer(self, group: str, topic: str, expression: str | None = None,
                 expression_type: str = "TAG", *, consume_from: str = "last",
                 consume_timestamp: int | None = None, auto_commit: bool | None = None,
                 allocation: str | None = None) -> GroupConsumer:
        """An instance of consumer group ``group`` reading ``topic``: ``poll``, ``commit``,
        ``lag``, ``close`` (or ``with``). Instances of a group, in this process or others,
        split the topic's queues. ``consume_from`` (``"first"``, ``"last"``,
        ``"timestamp"`` with ``consume_timestamp`` in epoch ms) says where a group with no
        committed offset starts."""
        self._check_open()
        return self._consumers.consumer(group, topic, expression, expression_type,
                                        consume_from=consume_from,
                                        consume_timestamp=consume_timestamp,
                                        auto_commit=auto_commit, allocation=allocation)

    def peek(self, group: str, topic: str, expression: str | None = None,
             expression_type: str = "TAG", *, consume_from: str = "last",
             consume_timestamp: int | None = None) -> GroupPeek:
        """The messages ``group`` would get next from ``topic``, read without joining it:
        ``poll`` from the group's committed offsets (``consume_from`` as for ``consumer``
        where it has none), writing nothing (no membership, no offsets); ``close`` (or
        ``with``)."""
        self._check_open()
        return self._consumers.peek(group, topic, expression, expression_type,
                                    consume_from=consume_from,
                                    consume_timestamp=consume_timestamp)

    def consumer_lag(self, group: str, topic: str) -> list[QueueLag]:
        """``QueueLag`` of ``group`` in every queue of ``topic``: max offset - committed
        offset, and the store-clock age of the oldest message it has not consumed."""
        self._check_open()
        return self._consumers.consumer_lag(group, topic)

    def consumer_groups(self) -> dict[tuple[str, str], dict[int, int]]:
        """``{(topic, group): {queue_id: consumed offset}}`` of every group that committed
        (``config/consumerOffset.json``) or popped."""
        self._check_open()
        return self._consumers.consumer_groups()

    def consumed_floor(self) -> tuple[int, str | None]:
        """The lowest commit-log offset holding a message some consumer group (committed or
        popping) has not consumed, and which group, queue and offset that is; ``(-1, None)``
        when every group has consumed everything stored. ``CorruptStateError`` when a group's
        state file cannot be read (its progress is unknown)."""
        self._check_open()
        return self._consumers.consumed_floor()

    def delete_consumer_group(self, group: str, topic: str | None = None
                              ) -> list[tuple[str, str]]:
        """Forget ``group``'s committed offsets and pop state (of ``topic``, or all): it no
        longer holds back ``cleanup.policy: keep_unconsumed``. Its membership files
        (``consumer/groups/<group>/``) go too, unless a live instance holds them. Returns the
        ``(topic, group)`` pairs whose offsets or pop state were forgotten."""
        self._check_open()
        return self._consumers.delete_consumer_group(group, topic)

    def reset_consumer_offsets(self, group: str, topic: str, *, offset: int | None = None,
                               timestamp_ms: int | None = None,
                               queue_id: int | None = None) -> list[OffsetReset]:
        """RocketMQ's resetOffset: ``group``'s committed offsets of ``topic`` moved to
        ``offset`` or to the first message stored at or after ``timestamp_ms``."""
        self._check_open()
        return self._consumers.reset_consumer_offsets(
            group, topic, offset=offset, timestamp_ms=timestamp_ms, queue_id=queue_id)

    def commit_consumer_offsets(self, group: str, topic: str, offsets: dict[int, int]) -> None:
        """Record ``group``'s offsets of ``topic`` (``{queue id: next offset}``) for consumers
        outside the store (RocketMQ's updateConsumerOffset), as ``consumer.commit`` does."""
        self._check_open()
        self._consumers.commit_consumer_offsets(group, topic, offsets)

    def committed_offsets(self, group: str, topic: str) -> dict[int, int]:
        """``{queue id: offset}`` that ``group`` committed for ``topic`` (empty: none)."""
        self._check_open()
        return self._consumers.committed_offsets(group, topic)

    def pop(self, group: str, topic: str, max_msgs: int = 32, invisible_ms: int = 30000, *,
            expression: str | None = None, expression_type: str = "TAG",
            wait_ms: int | float = 0, consume_from: str = "last",
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
        self._check_open()
        return self._consumers.pop(group, topic, max_msgs, invisible_ms, expression=expression,
                                   expression_type=expression_type, wait_ms=wait_ms,
                                   consume_from=consume_from, max_bytes=max_bytes)

    @overload
    def ack(self, receipt_handle: str) -> None: ...

    @overload
    def ack(self, receipt_handle: list[str] | tuple[str, ...]
            ) -> list[ReceiptHandleError | None]: ...

    def ack(self, receipt_handle: str | list[str] | tuple[str, ...]
            ) -> list[ReceiptHandleError | None] | None:
        """Acknowledge a popped message; a stale or unknown handle raises
        ``ReceiptHandleError`` and changes nothing. Given a list (or tuple) of handles,
        acknowledges them all in one step per topic and group and returns one result per
        handle, in order: None (acknowledged) or the ``ReceiptHandleError`` (a
        ``StaleReceiptHandleError`` for a delivery that is over) saying why not."""
        self._check_open()
        return self._consumers.ack(receipt_handle)

    def change_invisible_duration(self, receipt_handle: str, invisible_ms: int) -> str:
        """Make a popped message invisible for ``invisible_ms`` from now; returns its new
        receipt handle (the old one goes stale)."""
        self._check_open()
        return self._consumers.change_invisible_duration(receipt_handle, invisible_ms)

    def dead_letter(self, receipt_handle: str) -> None:
        """Send a popped message to its group's dead-letter queue (``%DLQ%<group>``) now and
        end its delivery (gRPC's ForwardMessageToDeadLetterQueue); a stale or unknown handle
        raises ``ReceiptHandleError`` as ``ack`` does, and nothing changes."""
        self._check_open()
        self._consumers.dead_letter(receipt_handle)

    def group_config(self, group: str) -> GroupConfig:
        """``group``'s config (``config/subscriptionGroup.json``, RocketMQ's format), or
        RocketMQ's defaults (16 retries, 1 retry queue) when the file lists none."""
        self._check_open()
        return self._consumers.group_config(group)

    def set_group_config(self, group: str, **fields: object) -> GroupConfig:
        """Change ``group``'s config (``retry_max_times``, ``retry_queue_nums``,
        ``consume_enable``, ``consume_broadcast_enable``, ``consume_message_orderly``) and
        return it; a bad value raises ValueError naming it, and nothing is written. Pop
        consumers of the group get ``retry_max_times`` + 1 deliveries of a message, then it
        goes to ``%DLQ%<group>``."""
        self._check_open()
        return self._consumers.set_group_config(group, **fields)

    def dead_letter_counts(self) -> dict[str, int]:
        """Dead letters this store wrote since it opened, per group."""
        self._check_open()
        return self._consumers.dead_letter_counts()

    def watch_dead_letters(self, listener: Callable[[str, int], None]) -> None:
        """Call ``listener(group, count)`` after each put of dead letters this store makes
        (pops past their last attempt, ``dead_letter``); quick, and never raising: it runs
        under the group's pop state lock. It stays through a role change that rebuilds the
        store's parts, and may be named while they are rebuilt."""
        self._dead_letter_listeners = (*self._dead_letter_listeners, listener)
        consumers = getattr(self, "_consumers", None)
        if consumers is not None:
            consumers.watch_dead_letters(listener)

    def _consumers_of(self, parts: StoreParts) -> ConsumerService:
        """A consumer service for ``parts`` that tells this store's dead-letter listeners.
        The listeners are read after the service is built, so one named meanwhile is told
        by one of the two (both: named once, as ``watch`` keeps a listener once)."""
        consumers = consumer_side(parts)
        for listener in self._dead_letter_listeners:
            consumers.watch_dead_letters(listener)
        return consumers

"""How far each consumer group has got, whatever the model: lag and the retention floor.

A group's consumed offset in a queue is its committed offset (``config/consumerOffset.json``)
or, for a pop group, its first unacknowledged offset (``pop_state``, NOTE [ Pop journal ]); a
group with both counts the lower. Everything here reads through the store's public read API,
so it works the same in the writer's process and in read-only stores.
"""

from __future__ import annotations

from dataclasses import dataclass

from mqstore.consumer import pop_state
from mqstore.consumer.locked_json import CorruptStateError
from mqstore.consumer.offsets import ConsumerOffsets
from mqstore.consumer.pop_journal import PopJournal
from mqstore.message import GetStatus


@dataclass(frozen=True)
class QueueLag:
    """A group's backlog in one queue. ``committed_offset`` is None when the group has no
    offset there (it never consumed the queue: all its messages count)."""

    queue_id: int
    min_offset: int
    max_offset: int
    committed_offset: int | None
    lag: int
    """Messages from the committed offset to the queue's end (RocketMQ's diff)."""
    oldest_unconsumed_age_ms: int
    """Store-clock age of the first message still stored and not consumed (0 when none)."""


def groups(root: str, offsets: ConsumerOffsets) -> dict[tuple[str, str], dict[int, int]]:
    """Every ``(topic, group)`` that committed or popped, with its consumed offsets."""
    out = {key: dict(value) for key, value in offsets.table().items()}
    for topic, group in pop_state.pop_groups(root):
        popped = _popped(root, topic, group)
        if popped is not None:
            _merge(out.setdefault((topic, group), {}), popped)
    return out


def group_offsets(root: str, offsets: ConsumerOffsets, topic: str, group: str) -> dict[int, int]:
    """``groups(...).get((topic, group), {})``, reading only that group's state."""
    mine = dict(offsets.offsets(topic, group))
    popped = _popped(root, topic, group) if (topic, group) in pop_state.pop_groups(root) else None
    if popped is not None:
        _merge(mine, popped)
    return mine


def _popped(root: str, topic: str, group: str) -> dict[int, int] | None:
    journal = PopJournal(root, topic, group)
    try:
        return journal.snapshot().consumed_offsets()
    except CorruptStateError:
        return None  # its pops fail loudly; its progress is unknown, not zero
    finally:
        journal.close()


def _merge(mine: dict[int, int], popped: dict[int, int]) -> None:
    for q, off in popped.items():
        mine[q] = min(off, mine.get(q, off))


def first_unconsumed(store, topic: str, queue_id: int, offset: int | None):
    """``(queue offset, commit-log offset, store time)`` of the first message at or after
    ``offset`` still stored, or None when the group has consumed the whole queue."""
    low = store.min_offset(topic, queue_id)
    at = low if offset is None else max(offset, low)
    for _attempt in range(4):  # cleanup may move the queue's start while we look
        if at >= store.max_offset(topic, queue_id):
            return None
        batch = store.read(topic, queue_id, at, 1, verify=False)
        if batch is None:
            return None
        if len(batch):
            return (int(batch.queue_offsets[0]), int(batch.phys_offsets[0]),
                    int(batch.store_timestamps[0]))
        if batch.status in (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE):
            return None
        if batch.next_begin_offset <= at:
            return None
        at = batch.next_begin_offset
    return None


def queue_lags(store, topic: str, consumed: dict[int, int]) -> list[QueueLag]:
    now = store.clock()
    out = []
    for q in store.queue_ids(topic):
        low, high = store.min_offset(topic, q), store.max_offset(topic, q)
        committed = consumed.get(q)
        first = first_unconsumed(store, topic, q, committed)
        start = low if committed is None else committed
        out.append(QueueLag(q, low, high, committed, max(0, high - start),
                            max(0, now - first[2]) if first is not None else 0))
    return out


def retention_floor(store, root: str, offsets: ConsumerOffsets) -> tuple[int, str | None]:
    """The lowest commit-log offset holding a message some group has not consumed, and who;
    ``(-1, None)`` when every group has consumed everything stored."""
    floor, who = -1, None
    for (topic, group), consumed in groups(root, offsets).items():
        for q in store.queue_ids(topic):
            first = first_unconsumed(store, topic, q, consumed.get(q))
            if first is not None and (floor < 0 or first[1] < floor):
                floor, who = first[1], f"group {group!r} at {topic}/{q} offset {first[0]}"
    return floor, who

"""Every consumer group's lag in every queue of its topic, for ``stats`` and ``/metrics``.

The offset table is read once (``store.consumer_groups()``: committed offsets, and pop
groups' first unacknowledged ones); each queue then costs its offsets and one one-message read
for the oldest unconsumed message's store time (``consumer.progress.queue_lags``, what
``store.consumer_lag`` computes for one group after reading the table itself). Nothing is
written. Groups come as the table names them, a RocketMQ broker's included, without the
argument checks ``consumer_lag`` makes of names a caller passes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from mqstore.consumer.progress import QueueLag, queue_lags


@dataclass(frozen=True)
class GroupLag:
    group: str
    topic: str
    queues: tuple[QueueLag, ...]
    """One per queue the store holds for the topic (none when it holds no such topic)."""

    @property
    def lag(self) -> int:
        return sum(q.lag for q in self.queues)

    @property
    def oldest_unconsumed_age_ms(self) -> int:
        return max((q.oldest_unconsumed_age_ms for q in self.queues), default=0)

    def as_dict(self) -> dict:
        return {"group": self.group, "topic": self.topic, "lag": self.lag,
                "oldest_unconsumed_age_ms": self.oldest_unconsumed_age_ms,
                "queues": [asdict(q) for q in self.queues]}


def group_lags(store) -> list[GroupLag]:
    """Each ``(group, topic)`` the store's offset table or pop state knows, by group then
    topic."""
    table = store.consumer_groups()
    return [GroupLag(group, topic, tuple(queue_lags(store, topic, consumed)))
            for (topic, group), consumed in sorted(table.items(), key=lambda kv: kv[0][::-1])]

"""What ``poll`` and ``pop`` hand out: message objects over the rows of columnar reads.

A poll reads with ``MessageStore.read`` (one ``ReadBatch`` of numpy columns per queue and
read) and wraps the batches, not the messages: a ``ConsumedMessage`` is made only when the
caller takes one, its offsets, times, tag code and body come from the batch's columns, and
everything else (topic and tags strings, keys, properties, hosts, msg id) is decoded from its
record the first time one of them is read. A consumer that only wants the columns takes
``Polled.batches``.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Iterator, Sequence

from mqstore.message import ReadBatch


class ConsumedMessage:
    """One message of a poll: a row of a ``ReadBatch``; the record's other fields (every one
    ``StoredMessage`` has) are decoded on first use."""

    __slots__ = ("topic", "queue_id", "_batch", "_row", "_full")

    def __init__(self, topic: str, queue_id: int, batch: ReadBatch, row: int) -> None:
        self.topic = topic
        self.queue_id = queue_id
        self._batch = batch
        self._row = row
        self._full = None

    @property
    def queue_offset(self) -> int:
        return int(self._batch.queue_offsets[self._row])

    @property
    def phys_offset(self) -> int:
        return int(self._batch.phys_offsets[self._row])

    @property
    def store_timestamp(self) -> int:
        return int(self._batch.store_timestamps[self._row])

    @property
    def born_timestamp(self) -> int:
        return int(self._batch.born_timestamps[self._row])

    @property
    def tags_code(self) -> int:
        return int(self._batch.tags_codes[self._row])

    @property
    def reconsume_times(self) -> int:
        return int(self._batch.reconsume_times[self._row])

    @property
    def size(self) -> int:
        return int(self._batch.sizes[self._row])

    @property
    def body(self) -> bytes:
        batch, row = self._batch, self._row
        offsets = batch.body_offsets
        return batch.bodies[offsets[row]:offsets[row + 1]].tobytes()

    @property
    def full(self):
        """The decoded ``StoredMessage`` (read from its record once)."""
        full = self._full
        if full is None:
            full = self._full = self._batch.message(self._row)
        return full

    def __getattr__(self, name: str):
        # Only for names not defined above: tags, keys, properties, msg_id, born_host ...
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.full, name)

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset})")


class Polled(Sequence[ConsumedMessage]):
    """The messages of one poll, queue by queue in queue-offset order. ``batches`` holds
    ``(queue_id, ReadBatch)`` pairs, the columns as they were read."""

    def __init__(self, topic: str, batches: list[tuple[int, ReadBatch]]) -> None:
        self.topic = topic
        self.batches = batches
        self._starts: list[int] = []
        n = 0
        for _q, batch in batches:
            self._starts.append(n)
            n += len(batch)
        self._len = n

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(self._len))]
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError(f"message {i} of a poll of {self._len}")
        part = bisect_right(self._starts, i) - 1
        q, batch = self.batches[part]
        return self._make(q, batch, i - self._starts[part])

    def _make(self, q: int, batch: ReadBatch, row: int) -> ConsumedMessage:
        return ConsumedMessage(self.topic, q, batch, row)

    def __iter__(self) -> Iterator[ConsumedMessage]:
        make = self._make
        for q, batch in self.batches:
            for row in range(len(batch)):
                yield make(q, batch, row)

    def __repr__(self) -> str:
        return f"Polled({self._len} messages of {self.topic!r})"

"""What the consumers of one store use of it, and nothing else (``ConsumerStore``).

The store hands its consumer service this, not itself: its reader's queue calls, the clock and
scheduler, the consumer settings, the allocation strategies, the filter compiler and the topic
configs. So the consumers' dependence on the store is this list, checked where it is built,
and no consumer keeps the facade alive.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Protocol

if TYPE_CHECKING:
    from mqstore.config import ConsumerSection
    from mqstore.format.topic_config import TopicConfig
    from mqstore.message import ReadBatch
    from mqstore.plugin_api.registry import Registry
    from mqstore.scheduler import Scheduler


class QueueReads(Protocol):
    """The store's queue reads the consumers make (``read.reader.Reader`` is one)."""

    root: str

    def queue_ids(self, topic: str) -> list[int]: ...

    def min_offset(self, topic: str, queue_id: int) -> int: ...

    def max_offset(self, topic: str, queue_id: int) -> int: ...

    def read(self, topic: str, queue_id: int, offset: int, max_msgs: int = 1024, *,
             expression: str | None = None, expression_type: str = "TAG",
             group: str | None = None, max_total_bytes: int | None = None,
             verify: bool = True) -> ReadBatch | None: ...

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int,
                       boundary: str = "lower") -> int: ...


class ConsumerStore:
    """One store as its consumers see it."""

    def __init__(self, reads: QueueReads, *, clock: Callable[[], int], scheduler: Scheduler,
                 config: ConsumerSection, allocation: Registry,
                 compile_filter: Callable[[str | None, str], Any],
                 topic_config: Callable[[str], TopicConfig | None],
                 state_changed: Callable[[], None] = lambda: None,
                 dead_letters: Any = None) -> None:
        """``allocation``: the allocation strategies by name; ``compile_filter(expression,
        type)`` refuses a bad expression (ValueError); ``topic_config(name)``: a topic's
        config, or None; ``state_changed()``: called after a change a client is told of (a
        commit, an ack, a new invisible time, a reset or deletion), outside every lock:
        the store returns once the change is replicated as its role promises (the state
        mirror's ``ship_now``); ``dead_letters``: the writer's ``consumer.dead_letters.
        DeadLetters`` (None in a store that cannot write: exhausted messages wait for the
        writer)."""
        self.root = reads.root
        self.queue_ids = reads.queue_ids
        self.min_offset = reads.min_offset
        self.max_offset = reads.max_offset
        self.read = reads.read
        self.offset_by_time = reads.offset_by_time
        self.clock = clock
        self.scheduler = scheduler
        self.config = config
        self.allocation = allocation
        self.compile_filter = compile_filter
        self.topic_config = topic_config
        self.state_changed = state_changed
        self.dead_letters = dead_letters

"""``plugin_api.contracts.StoreReads`` of one open store: what a cleanup policy declaring
``READS_STORE`` is bound to, these calls and no others (never the facade itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable

if TYPE_CHECKING:
    from mqstore.consumer.service import ConsumerService
    from mqstore.read.reader import Reader


class StoreReadsOf:
    """The store's read API as a plugin may call it (``contracts.StoreReads``)."""

    def __init__(self, reader: Reader, clock: Callable[[], int],
                 consumers: ConsumerService) -> None:
        self.root = reader.root
        self.clock = clock
        self.topics = reader.topics
        self.queue_ids = reader.queue_ids
        self.min_offset = reader.min_offset
        self.max_offset = reader.max_offset
        self.read = reader.read
        self.consumed_floor = consumers.consumed_floor

"""Round-robin queue selection, as RocketMQ's producer does it.

Each thread keeps a counter per topic that starts at a random int; a pick increments it and
takes ``abs((counter & 0x7FFFFFFF) % n)``, so one thread's consecutive sends cycle the queues.
"""

from __future__ import annotations

import random
import threading

from mqstore.plugin_api import hookimpl


class RoundRobinSelector:
    def __init__(self, config=None, string_hash=None) -> None:
        self._local = threading.local()

    def select(self, message, queue_count: int) -> int:
        counters = getattr(self._local, "counters", None)
        if counters is None:
            counters = self._local.counters = {}
        value = counters.get(message.topic)
        if value is None:
            value = random.getrandbits(31)
        value = (value + 1) & 0xFFFFFFFF
        counters[message.topic] = value
        return (value & 0x7FFFFFFF) % queue_count


@hookimpl(trylast=True)
def register_queue_selectors(registry):
    registry.add("round_robin", RoundRobinSelector)

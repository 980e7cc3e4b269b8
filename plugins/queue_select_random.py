"""Uniformly random queue selection."""

from __future__ import annotations

import random

from mqstore.plugin_api import hookimpl


class RandomSelector:
    def __init__(self, config=None, string_hash=None) -> None:
        self._random = random.Random()

    def select(self, message, queue_count: int) -> int:
        return self._random.randrange(queue_count)


@hookimpl(trylast=True)
def register_queue_selectors(registry):
    registry.add("random", RandomSelector)

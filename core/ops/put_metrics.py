"""Counts the store's puts for ``mqstore serve``'s metrics: a plugin its store loads.

``serve`` adds this module to ``plugins.modules``; ``after_append`` runs in the store process
after every put and put_batch (refused ones included), so the counts cover every producer
of the deployment, whatever plugin or thread it runs in. Other processes that import the
module (workers rebuild their plugin managers by name) never append, so theirs stay zero.
"""

from __future__ import annotations

import threading

from mqstore.plugin_api.hookspecs import hookimpl

MODULE = __name__


class PutCounts:
    def __init__(self) -> None:
        self.messages = 0
        self.bytes = 0
        self.refused = 0  # calls refused with a status (nothing written)
        self._lock = threading.Lock()  # puts may come from several threads

    def add(self, result) -> None:
        with self._lock:
            if result.status.stored:
                self.messages += len(result)
                self.bytes += result.wrote_bytes
            else:
                self.refused += 1


COUNTS = PutCounts()


@hookimpl
def after_append(result) -> None:
    COUNTS.add(result)

"""A plugin for bench_consumer.py: notes when the dispatch loop dispatched each batch.

Loaded into the dispatch worker by ``plugins.modules``; appends ``<begin> <end> <monotonic ns>``
per batch to the file named by ``MQSTORE_BENCH_DISPATCH_LOG`` (``after_dispatch`` runs just
before the worker publishes the batch and wakes the consumers).
"""

from __future__ import annotations

import os
import time

from mqstore import hookimpl

_out = None


@hookimpl
def after_dispatch(batch):
    global _out
    path = os.environ.get("MQSTORE_BENCH_DISPATCH_LOG")
    if path is None:
        return
    if _out is None:
        _out = open(path, "a", buffering=1)
    _out.write(f"{batch.begin} {batch.end} {time.monotonic_ns()}\n")

"""Asynchronous flush (``flush.policy: async``), RocketMQ's FlushRealTimeService.

The flush loop (a worker process or thread, see ``mqstore.runtime.workers.flush_worker``) flushes the
commit log every ``flush.interval_ms`` if at least ``flush.least_pages`` pages (4 KiB) were
written past the flushed position, and every ``flush.thorough_interval_ms`` regardless. A put
never waits; consumers see what is written (committed, with the transient pool).
"""

from __future__ import annotations

from mqstore.plugin_api import FlushSchedule, hookimpl, PutStatus


class AsyncFlush:
    visible_after_flush = False

    def __init__(self, config, flusher) -> None:
        pass

    @staticmethod
    def schedule(config) -> FlushSchedule:
        f = config.flush
        return FlushSchedule(f.interval_ms / 1000.0, f.least_pages, f.thorough_interval_ms / 1000.0)

    def complete_put(self, end_offset: int, wait: bool) -> PutStatus:
        return PutStatus.PUT_OK


@hookimpl(trylast=True)
def register_flush_policies(registry):
    registry.add("async", AsyncFlush)

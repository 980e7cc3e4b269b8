"""Synchronous flush (``flush.policy: sync``): a put returns once its bytes are on disk.

Group commit as RocketMQ's GroupCommitService: a put publishes the end offset it needs, wakes
the flush loop if it sleeps (see ``mqstore.runtime.workers.flush_worker``) and sleeps until the loop
wakes it (``mqstore.runtime.workers.sync_waiters``); the loop forces everything written so far, so
producers that arrive while the disk works are covered by the next force together. A put not covered within ``flush.sync_timeout_ms`` answers FLUSH_DISK_TIMEOUT (the
message stays stored). ``WAIT=false`` returns at once; those bytes go with the next pass (at
the latest after ``flush.interval_ms``). Consumers see only flushed bytes.
"""

from __future__ import annotations

from mqstore.plugin_api import FlushSchedule, hookimpl, PutStatus


class SyncFlush:
    visible_after_flush = True  # RocketMQ's confirm offset: consumers see what is on disk

    def __init__(self, config, flusher) -> None:
        self.flusher = flusher
        self.timeout_s = config.flush.sync_timeout_ms / 1000.0

    @staticmethod
    def schedule(config) -> FlushSchedule:
        interval = config.flush.interval_ms / 1000.0
        return FlushSchedule(interval, 0, interval)

    def complete_put(self, end_offset: int, wait: bool) -> PutStatus:
        if not wait:
            return PutStatus.PUT_OK
        if self.flusher.wait_flushed(end_offset, self.timeout_s):
            return PutStatus.PUT_OK
        return PutStatus.FLUSH_DISK_TIMEOUT


@hookimpl(trylast=True)
def register_flush_policies(registry):
    registry.add("sync", SyncFlush)

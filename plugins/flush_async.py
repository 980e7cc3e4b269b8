"""Asynchronous flush (``flush.mode: async``), RocketMQ's FlushRealTimeService.

Every ``flush.interval_ms`` the commit log is flushed if at least ``flush.least_pages`` pages
(4 KiB) were written past the flushed position; every ``flush.thorough_interval_ms`` it is
flushed regardless. A put never waits. ``stop`` does the final full flush.
"""

from __future__ import annotations

import threading
import time

from mqstore.hookspecs import hookimpl
from mqstore.message import PutStatus


METADATA_INTERVAL_S = 1.0  # consume queues and checkpoint, as RocketMQ's 1 s checkpoint task


class AsyncFlush:
    visible_after_flush = False  # consumers see what is written
    def __init__(self, store) -> None:
        self.store = store
        cfg = store.config.flush
        self.interval_s = cfg.interval_ms / 1000.0
        self.least_pages = cfg.least_pages
        self.thorough_s = cfg.thorough_interval_ms / 1000.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqstore-flush", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last_thorough = 0.0
        last_flush = last_metadata = time.monotonic()
        try:
            while not self._stop.wait(min(self.interval_s, METADATA_INTERVAL_S)):
                now = time.monotonic()
                if now >= last_flush + self.interval_s:
                    last_flush = now
                    least = self.least_pages
                    if now >= last_thorough + self.thorough_s:
                        least, last_thorough = 0, now
                    self.store.flush_commit_log(least)
                if now >= last_metadata + METADATA_INTERVAL_S:
                    self.store.flush_metadata()
                    last_metadata = now
        except BaseException as exc:
            self.error = exc

    def after_append(self, end_offset: int, wait: bool) -> PutStatus:
        return PutStatus.PUT_OK

    def halt(self) -> None:
        """Stop the pass thread without a final flush (what a crash leaves behind)."""
        self._stop.set()
        self._thread.join()

    def stop(self) -> None:
        self.halt()
        self.store.flush_commit_log(0)


@hookimpl(trylast=True)
def register_flush_policies(registry):
    registry.add("async", AsyncFlush)

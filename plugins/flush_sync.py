"""Synchronous flush (``flush.mode: sync``): a put returns once its bytes are on disk.

Group commit: the first waiting producer flushes everything written so far while the others
wait on the same lock, then find their bytes already covered, so concurrent producers share
fsyncs. A flush slower than ``flush.sync_timeout_ms`` answers FLUSH_DISK_TIMEOUT (the message
stays stored). Messages with ``WAIT=false`` return at once; a background pass flushes them
within ``flush.interval_ms``.
"""

from __future__ import annotations

import threading
import time

from mqstore.hookspecs import hookimpl
from mqstore.message import PutStatus
from mqstore.plugins.flush_async import METADATA_INTERVAL_S


class SyncFlush:
    visible_after_flush = True  # consumers see only what is on disk (RocketMQ's confirm offset)

    def __init__(self, store) -> None:
        self.store = store
        self.timeout_s = store.config.flush.sync_timeout_ms / 1000.0
        self.interval_s = store.config.flush.interval_ms / 1000.0
        self._group = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="mqstore-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last_flush = last_metadata = time.monotonic()
        while not self._stop.wait(min(self.interval_s, METADATA_INTERVAL_S)):
            now = time.monotonic()
            if now >= last_flush + self.interval_s:
                last_flush = now
                if self.store.flushed_offset < self.store.commit_log.max_offset:
                    with self._group:
                        self.store.flush_commit_log(0)
            if now >= last_metadata + METADATA_INTERVAL_S:
                self.store.flush_metadata()
                last_metadata = now

    def after_append(self, end_offset: int, wait: bool) -> PutStatus:
        if not wait:
            return PutStatus.PUT_OK
        deadline = time.monotonic() + self.timeout_s
        if not self._group.acquire(timeout=self.timeout_s):
            return PutStatus.FLUSH_DISK_TIMEOUT
        try:
            if self.store.flushed_offset < end_offset:
                self.store.flush_commit_log(0)
        finally:
            self._group.release()
        if self.store.flushed_offset < end_offset or time.monotonic() > deadline:
            return PutStatus.FLUSH_DISK_TIMEOUT
        return PutStatus.PUT_OK

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        with self._group:
            self.store.flush_commit_log(0)


@hookimpl(trylast=True)
def register_flush_policies(registry):
    registry.add("sync", SyncFlush)

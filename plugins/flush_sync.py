"""Synchronous flush (``flush.mode: sync``): a put returns once its bytes are on disk.

Group commit: the first put that finds no flush running becomes the leader and forces
everything written so far (the disk works with the GIL released, so other producers keep
appending meanwhile); the others wait, are all woken when it finishes, and one of those still
uncovered leads the next flush. Concurrent producers therefore share fsyncs, and a lone
producer flushes on its own thread with no hand-off. A put not covered within ``flush.sync_timeout_ms``
answers FLUSH_DISK_TIMEOUT (the message stays stored). ``WAIT=false`` returns at once; those
bytes are flushed by the next pass (at the latest after ``flush.interval_ms``).
"""

from __future__ import annotations

import threading
import time

from mqstore.hookspecs import hookimpl
from mqstore.message import PutStatus
from mqstore.plugins.flush_async import METADATA_INTERVAL_S

IDLE_WAIT_S = 0.01  # the flusher's longest sleep without a request (RocketMQ: 10 ms)


class SyncFlush:
    visible_after_flush = True  # consumers see only what is on disk (RocketMQ's confirm offset)

    def __init__(self, store) -> None:
        self.store = store
        self.timeout_s = store.config.flush.sync_timeout_ms / 1000.0
        self.interval_s = store.config.flush.interval_ms / 1000.0
        self._cond = threading.Condition()
        self._requested = 0  # highest end offset a waiting put asked for
        self._flushing = False  # a flush is running (led by a producer or the pass thread)
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="mqstore-flush", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _run(self) -> None:
        last_pass = last_metadata = time.monotonic()
        while True:
            with self._cond:
                if not self._stopping:
                    self._cond.wait(IDLE_WAIT_S)
                if self._stopping:
                    return
                # requests a timed-out or WAIT=false producer left behind
                wanted = self._requested > self.store.flushed_offset
            now = time.monotonic()
            if wanted or now >= last_pass + self.interval_s:
                last_pass = now
                with self._cond:
                    if self._flushing:  # a producer is leading a flush right now
                        continue
                    self._flushing = True
                try:
                    if self.store.flushed_offset < self.store.commit_log.max_offset:
                        self.store.flush_commit_log(0)
                finally:
                    with self._cond:
                        self._flushing = False
                        self._cond.notify_all()
            if now >= last_metadata + METADATA_INTERVAL_S:
                self.store.flush_metadata()
                last_metadata = now

    def after_append(self, end_offset: int, wait: bool) -> PutStatus:
        if not wait:
            return PutStatus.PUT_OK
        store = self.store
        deadline = time.monotonic() + self.timeout_s
        with self._cond:
            if end_offset > self._requested:
                self._requested = end_offset
            while store.flushed_offset < end_offset:
                left = deadline - time.monotonic()
                if left <= 0:
                    return PutStatus.FLUSH_DISK_TIMEOUT
                if self._flushing:
                    self._cond.wait(left)
                    continue
                self._flushing = True
                self._cond.release()
                try:
                    store.flush_commit_log(0)
                finally:
                    self._cond.acquire()
                    self._flushing = False
                    self._cond.notify_all()
        # Covered, but past the deadline (a slow disk): RocketMQ answers FLUSH_DISK_TIMEOUT too.
        return PutStatus.PUT_OK if time.monotonic() <= deadline else PutStatus.FLUSH_DISK_TIMEOUT

    def halt(self) -> None:
        """Stop the pass thread without a final flush (what a crash leaves behind)."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        self._thread.join()

    def stop(self) -> None:
        self.halt()
        self.store.flush_commit_log(0)


@hookimpl(trylast=True)
def register_flush_policies(registry):
    registry.add("sync", SyncFlush)

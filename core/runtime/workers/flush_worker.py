"""The flush loop: commits transient-pool buffers into segment files and forces files to disk.

It runs in its own worker process (``flush.worker: process``) or on a thread of the store
process (``thread``); the code is the same, it talks to the store only through the shared
positions and two pipes (see NOTE [ Shutdown ] in ``supervisor``). It opens the segment files
itself: ``fdatasync`` on its own descriptor writes back the pages the store dirtied through its
map, since both share the page cache.

Decisions follow RocketMQ's services over absolute offsets:
- commit (transient pool only, CommitRealTimeService): copy ``[committed, written)`` of a
  segment when the segment is complete, or when at least ``writer.commit_least_pages`` pages
  are pending, or every ``writer.commit_thorough_interval_ms``; a sync-flush request or an
  explicit flush commits everything first. A segment that opened while the pool was dry holds
  no buffer: its bytes are in the file already and count as committed once reached. The pool is
  the core's (``mqstore.append.pool_writer``: the ``transient_pool`` writer stages in it); with any
  other writer there is none and the committed end follows the written one.
- flush (MappedFileQueue.flush): force the segment holding the flushed position when it is
  complete, or when ``least_pages`` is 0 and it has unflushed bytes, or when at least
  ``least_pages`` whole pages are unflushed. The flush policy says when
  (``FlushPolicyFactory.schedule``); sync-flush requests are served at once.
"""

from __future__ import annotations

import logging
import os
import time

from mqstore.plugin_api.contracts import FlushSchedule
from mqstore.append.pool_writer import attach_pool
from mqstore.storage.mapped_file import segment_name
from mqstore.storage.durable_file import sync_dir
from mqstore.storage.transient_pool import TransientPool, nonzero_end
from mqstore.scheduler import Scheduler, system_scheduler
from mqstore.uninterrupted import parent_alive, worker_signals
from mqstore.runtime.workers import shm, sync_waiters
from mqstore.runtime.workers.pipes import poke, wait_and_drain

log = logging.getLogger(__name__)
PAGE = 4096
PARENT_CHECK_S = 0.5  # longest sleep, so a worker notices its store is gone


def force(fd: int) -> None:
    os.fdatasync(fd)


class FlushService:
    def __init__(self, directory: str, segment_bytes: int, channels: shm.Channels,
                 schedule: FlushSchedule, commit_schedule: FlushSchedule,
                 pool: TransientPool | None = None, after_flush=None, waker=None,
                 scheduler: Scheduler = system_scheduler) -> None:
        self.directory = directory
        self.size = segment_bytes
        self.ch = channels.flush
        self.append = channels.append
        self.interval_s, self.least_pages, self.thorough_s = schedule
        self.commit_s, self.commit_least, self.commit_thorough_s = commit_schedule
        self.pool = pool
        self.after_flush = after_flush
        self.waker = waker  # wakes the sync-flush puts a force covers (workers.sync_waiters)
        self.scheduler = scheduler
        self._fds: dict[int, int] = {}
        self._unnamed: set[int] = set()  # opened here, its directory entry not forced yet
        self.flushed = self.ch.flushed
        self.committed = self.ch.committed
        self._seen_written = self.committed  # WRITTEN at the last commit decision

    # -- files -------------------------------------------------------------------------------
    def _fd(self, start: int) -> int | None:
        fd = self._fds.get(start)
        if fd is None:
            try:
                fd = os.open(os.path.join(self.directory, segment_name(start)), os.O_RDWR)
            except FileNotFoundError:  # removed by cleanup: nothing left to make durable
                return None
            self._fds[start] = fd
            self._unnamed.add(start)
        return fd

    def _close_done(self) -> None:
        done = min(self.flushed, self.committed)
        for start in [s for s in self._fds if s + self.size <= done]:
            os.close(self._fds.pop(start))
            self._unnamed.discard(start)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()
        if self.waker is not None:
            self.waker.close()

    def _segment_step(self, pos: int, limit: int, least_pages: int):
        """The segment holding ``pos``: ``(start, upto, complete, due)``, where bytes
        ``[pos, upto)`` lie below ``limit`` and ``due`` is RocketMQ's rule for acting on them:
        the segment is complete, or ``least_pages`` is 0, or that many whole pages are pending."""
        start = pos - pos % self.size
        end = start + self.size
        upto = min(limit, end)
        complete = limit >= end
        pages = (upto - start) // PAGE - (pos - start) // PAGE
        return start, upto, complete, upto > pos and (
            complete or least_pages == 0 or pages >= least_pages)

    # -- commit ------------------------------------------------------------------------------
    def commit(self, least_pages: int) -> bool:
        """Copy staged bytes into the files by the rule above; True if the store has pool
        buffers or readable ends to update."""
        if self.pool is None:  # the bytes are in the file already; only the flush follows
            self.committed = max(self.committed, self.append.written)
            self.ch.committed = self.committed
            return False
        written = self._seen_written = self.append.written
        begin = c = self.committed
        while c < written:
            start, upto, complete, due = self._segment_step(c, written, least_pages)
            buf = self.pool.buffer_of(start)
            if buf is not None:
                if not due:
                    break
                fd = self._fd(start)
                if fd is None:
                    raise RuntimeError(f"segment {start}: no file to commit [{c}, {upto}) into")
                at, stop = c - start, upto - start
                if complete:  # closed by a blank: its zeros to the end stay a hole
                    stop = nonzero_end(buf, at, stop)
                while at < stop:
                    at += os.pwrite(fd, buf[at:stop], at)
            # else the pool was dry when the segment opened: its bytes went through the map
            c = upto
            if not complete:
                break
        self.committed = c
        self.ch.committed = c
        return c > begin

    # -- flush -------------------------------------------------------------------------------
    def flush(self, least_pages: int) -> bool:
        """Force by the rule above; True if the store has to learn the new flushed end (not
        when sync-flush puts were woken: the first of them tells it)."""
        begin = f = self.flushed
        while True:
            start, upto, complete, due = self._segment_step(f, self.committed, least_pages)
            if due:
                fd = self._fd(start)
                if fd is not None:
                    began = time.perf_counter_ns()
                    force(fd)
                    if start in self._unnamed:  # a new file's name must outlive a power loss
                        sync_dir(self.directory)
                        sync_dir(os.path.dirname(self.directory))  # the first: commitlog/
                        self._unnamed.discard(start)
                    self.ch.fsync_ns += time.perf_counter_ns() - began
                    self.ch.fsyncs += 1
                f = upto
            if not complete or f < start + self.size:
                break
        if f > begin:
            self.flushed = f
            self.ch.flushed = f
            woken = self.waker.wake(f) if self.waker is not None else 0
            self._close_done()
            if self.after_flush is not None:
                self.after_flush(f)
            return not woken
        return False

    # -- loop --------------------------------------------------------------------------------
    def _asked(self) -> bool:
        ch = self.ch
        return bool(ch.stop or ch.ask > ch.done or ch.request > self.flushed
                    or (self.pool is not None and self.append.written > self._seen_written))

    def _serve_asks(self) -> bool:
        """Explicit passes and sync-flush requests; True if anything moved."""
        ch = self.ch
        moved = False
        ask = ch.ask
        if ask > ch.done:
            least = ch.ask_least
            moved |= self.commit(0)
            if least >= 0:  # -1: commit only
                moved |= self.flush(least)
            ch.done = ask
            moved = True
        if ch.request > self.flushed:
            moved |= self.commit(0)
            moved |= self.flush(0)
        return moved

    def _finish(self, progress_w, parent_pid) -> None:
        # Whatever the store acknowledged is complete below ``written``: make it durable
        # (from the transient pool too) before leaving, as a stop would.
        log.error("store process %s is gone; the flush worker commits and flushes what was "
                  "written, then exits", parent_pid)
        self.commit(0)
        self.flush(0)
        poke(progress_w)

    def run(self, wake_r, progress_w, parent_pid: int | None = None) -> None:
        ch, scheduler = self.ch, self.scheduler
        now = scheduler.monotonic()
        next_flush, next_thorough = now + self.interval_s, now + self.thorough_s
        next_commit, next_commit_thorough = now + self.commit_s, now + self.commit_thorough_s
        failed_at = 0.0
        while True:
            stop = ch.stop
            if stop == 2:
                return
            if parent_pid is not None and not parent_alive():
                self._finish(progress_w, parent_pid)
                return
            now = scheduler.monotonic()
            moved = False
            try:
                if stop:
                    self.commit(0)
                    self.flush(0)
                    poke(progress_w)
                    return
                moved |= self._serve_asks()
                least = self.commit_least
                if now >= next_commit_thorough:
                    least, next_commit_thorough = 0, now + self.commit_thorough_s
                moved |= self.commit(least)  # a put's wake-up commits by the pages rule
                scheduler.ran("commit", now)
                next_commit = now + self.commit_s
                if now >= next_flush:
                    least = self.least_pages
                    if now >= next_thorough:
                        least, next_thorough = 0, now + self.thorough_s
                    moved |= self.flush(least)
                    next_flush = now + self.interval_s
                    scheduler.ran("flush", now)
            except OSError as exc:
                if not ch.error:
                    log.error("commit-log flush failed: %s", exc)
                    ch.note = f"commit-log flush failed: {exc}"
                ch.error = 1
                moved = True
                failed_at = now
            if moved:
                poke(progress_w)
            if ch.request > self.flushed and not failed_at:
                continue
            # Idle handshake (as the dispatch worker's): announce, drain, re-check, sleep.
            ch.idle = 1
            wait_and_drain(wake_r, 0)
            if not self._asked():
                due = min(next_flush, next_commit) - scheduler.monotonic()
                if failed_at:
                    due, failed_at = max(due, 0.1), 0.0
                wait_and_drain(wake_r, scheduler.wait_s(max(0.0, min(due, PARENT_CHECK_S))))
            ch.idle = 0


def run(root: str, config, channels: shm.Channels, wake_r, progress_w, parent_pid: int,
        restarted: bool, clock, scheduler: Scheduler, segment_bytes: int,
        pool_name: str | None, waiter_pipes) -> None:
    """Worker entry point (``multiprocessing`` target)."""
    from mqstore.plugin_api.manager import PluginHooks, make_plugin_manager
    from mqstore.storage.store_lock import hold_worker_lock, release_worker_lock

    worker_signals()
    lock_fds = hold_worker_lock(root)  # a store reopened after a crash waits for this process
    pool = None
    try:
        if pool_name:
            pool = attach_pool(pool_name, config, segment_bytes)
        os.set_blocking(progress_w.fileno(), False)
        hooks = PluginHooks(make_plugin_manager(
            modules=config.plugins.modules, disable=config.plugins.disable,
            load_entry_points=config.plugins.load_entry_points))
        service = FlushService(
            os.path.join(root, "commitlog"), segment_bytes, channels,
            hooks.flush_policies.get(config.flush.policy).schedule(config),
            commit_schedule(config), pool,
            hooks.after_flush if hooks.has_after_flush else None,
            sync_waiters.Waker(channels, waiter_pipes), scheduler)
        try:
            service.run(wake_r, progress_w, parent_pid)
        finally:
            service.close()
    finally:
        if pool is not None:
            pool.close()
        channels.close()
        release_worker_lock(lock_fds)


def commit_schedule(config) -> FlushSchedule:
    w = config.writer
    return FlushSchedule(w.commit_interval_ms / 1000.0, w.commit_least_pages,
                         w.commit_thorough_interval_ms / 1000.0)

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
  no buffer: its bytes are in the file already and count as committed once reached.
- flush (MappedFileQueue.flush): force the segment holding the flushed position when it is
  complete, or when ``least_pages`` is 0 and it has unflushed bytes, or when at least
  ``least_pages`` whole pages are unflushed. The flush policy's ``schedule(config)`` gives the
  period, least pages and thorough period; sync-flush requests are served at once.
- cleanup (CleanCommitLogService's decision, ``mqstore.cleanup``): every
  ``cleanup.interval_ms`` decide whether segments go and whether the disk is full; the store
  process carries the deletion out.
"""

from __future__ import annotations

import logging
import os
import time

from mqstore import cleanup
from mqstore.storage.mapped_file import segment_name
from mqstore.storage.transient_pool import TransientPool
from mqstore.uninterrupted import terminate_requested, worker_signals
from mqstore.workers import shm, sync_waiters
from mqstore.workers.pipes import poke, wait_and_drain

log = logging.getLogger("mqstore.workers.flush")
PAGE = 4096
PARENT_CHECK_S = 0.5  # longest sleep, so a worker notices its store is gone


def force(fd: int) -> None:
    os.fdatasync(fd)


class FlushService:
    def __init__(self, directory: str, segment_bytes: int, positions: shm.SharedPositions,
                 schedule: tuple[float, int, float], commit_schedule: tuple[float, int, float],
                 pool: TransientPool | None = None, after_flush=None, cleanup_config=None,
                 waker=None) -> None:
        self.directory = directory
        self.cleanup_config = cleanup_config
        self.size = segment_bytes
        self.p = positions
        self.interval_s, self.least_pages, self.thorough_s = schedule
        self.commit_s, self.commit_least, self.commit_thorough_s = commit_schedule
        self.pool = pool
        self.after_flush = after_flush
        self.waker = waker  # wakes the sync-flush puts a force covers (workers.sync_waiters)
        self._fds: dict[int, int] = {}
        self.flushed = positions[shm.FLUSHED]
        self.committed = positions[shm.COMMITTED]
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
        return fd

    def _close_done(self) -> None:
        done = min(self.flushed, self.committed)
        for start in [s for s in self._fds if s + self.size <= done]:
            os.close(self._fds.pop(start))

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
            self.committed = max(self.committed, self.p[shm.WRITTEN])
            self.p[shm.COMMITTED] = self.committed
            return False
        written = self._seen_written = self.p[shm.WRITTEN]
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
                while at < stop:
                    at += os.pwrite(fd, buf[at:stop], at)
            # else the pool was dry when the segment opened: its bytes went through the map
            c = upto
            if not complete:
                break
        self.committed = c
        self.p[shm.COMMITTED] = c
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
                    force(fd)
                    self.p[shm.FLUSH_COUNT] = self.p[shm.FLUSH_COUNT] + 1
                f = upto
            if not complete or f < start + self.size:
                break
        if f > begin:
            self.flushed = f
            self.p[shm.FLUSHED] = f
            woken = self.waker.wake(f) if self.waker is not None else 0
            self._close_done()
            if self.after_flush is not None:
                self.after_flush(f)
            return not woken
        return False

    # -- cleanup decision ----------------------------------------------------------------------
    def cleanup_pass(self) -> None:
        """Decide whether old segments go (the store deletes them; see mqstore.cleanup)."""
        p = self.p
        decision = cleanup.decide(self.cleanup_config, time.localtime().tm_hour,
                                  cleanup.disk_used_ratio(os.path.dirname(self.directory)))
        if decision.disk_full is not None:
            p[shm.DISK_FULL_FLAG] = int(decision.disk_full)
        if decision.delete and p[shm.CLEAN_DONE] >= p[shm.CLEAN_ASK]:
            p[shm.CLEAN_AT_ONCE] = int(decision.at_once)
            p[shm.CLEAN_ASK] = p[shm.CLEAN_ASK] + 1

    # -- loop --------------------------------------------------------------------------------
    def _asked(self) -> bool:
        p = self.p
        return bool(p[shm.FLUSH_STOP] or p[shm.FLUSH_ASK] > p[shm.FLUSH_DONE]
                    or p[shm.FLUSH_REQUEST] > self.flushed
                    or (self.pool is not None and p[shm.WRITTEN] > self._seen_written))

    def run(self, wake_r, progress_w, parent_pid: int | None = None) -> None:
        p = self.p
        now = time.monotonic()
        next_flush, next_thorough = now + self.interval_s, now + self.thorough_s
        next_commit, next_commit_thorough = now + self.commit_s, now + self.commit_thorough_s
        failed_at = 0.0
        cleanup_s = (self.cleanup_config.interval_ms / 1000.0
                     if self.cleanup_config is not None else float("inf"))
        next_cleanup = now + cleanup_s
        while True:
            stop = p[shm.FLUSH_STOP]
            if stop == 2:
                return
            if (parent_pid is not None and os.getppid() != parent_pid) or terminate_requested():
                # Whatever the store acknowledged is complete below WRITTEN: make it durable
                # (from the transient pool too) before leaving, as a stop would.
                log.error("store process %d is gone or asked to terminate; the flush worker "
                          "commits and flushes what was written, then exits", parent_pid)
                self.commit(0)
                self.flush(0)
                poke(progress_w)
                return
            now = time.monotonic()
            moved = False
            try:
                if stop:
                    moved = self.commit(0) | self.flush(0)
                    poke(progress_w)
                    return
                ask = p[shm.FLUSH_ASK]
                if ask > p[shm.FLUSH_DONE]:
                    least = p[shm.FLUSH_ASK_LEAST]
                    moved |= self.commit(0)
                    if least >= 0:  # -1: commit only
                        moved |= self.flush(least)
                    p[shm.FLUSH_DONE] = ask
                    moved = True
                if p[shm.FLUSH_REQUEST] > self.flushed:
                    moved |= self.commit(0)
                    moved |= self.flush(0)
                least = self.commit_least
                if now >= next_commit_thorough:
                    least, next_commit_thorough = 0, now + self.commit_thorough_s
                moved |= self.commit(least)  # a put's wake-up commits by the pages rule
                next_commit = now + self.commit_s
                if now >= next_flush:
                    least = self.least_pages
                    if now >= next_thorough:
                        least, next_thorough = 0, now + self.thorough_s
                    moved |= self.flush(least)
                    next_flush = now + self.interval_s
                if now >= next_cleanup:
                    next_cleanup = now + cleanup_s
                    self.cleanup_pass()
                    moved = True
            except OSError as exc:
                if not p[shm.FLUSH_ERROR]:
                    log.error("commit-log flush failed: %s", exc)
                p[shm.FLUSH_ERROR] = 1
                moved = True
                failed_at = now
            if moved:
                poke(progress_w)
            if p[shm.FLUSH_REQUEST] > self.flushed and not failed_at:
                continue
            # Idle handshake (as the dispatch worker's): announce, drain, re-check, sleep.
            p[shm.FLUSH_IDLE] = 1
            wait_and_drain(wake_r, 0)
            if not self._asked():
                due = min(next_flush, next_commit, next_cleanup) - time.monotonic()
                if failed_at:
                    due, failed_at = max(due, 0.1), 0.0
                wait_and_drain(wake_r, max(0.0, min(due, PARENT_CHECK_S)))
            p[shm.FLUSH_IDLE] = 0


def run(root: str, config, positions_name: str, wake_r, progress_w, parent_pid: int,
        restarted: bool, segment_bytes: int, pool_name: str | None, waiter_pipes) -> None:
    """Worker entry point (``multiprocessing`` target)."""
    from mqstore.plugins_manager import PluginHooks, make_plugin_manager
    from mqstore.storage.checkpoint import hold_worker_lock

    worker_signals()
    lock_fd = hold_worker_lock(root)  # a store reopened after a crash waits for this process
    positions = shm.SharedPositions(positions_name)
    pool = (TransientPool(config.writer.transient_pool_buffers, segment_bytes, pool_name)
            if pool_name else None)
    try:
        if pool is not None:
            pool.warm()
        os.set_blocking(progress_w.fileno(), False)
        hooks = PluginHooks(make_plugin_manager(
            modules=config.plugins.modules, disable=config.plugins.disable,
            load_entry_points=config.plugins.load_entry_points))
        service = FlushService(
            os.path.join(root, "commitlog"), segment_bytes, positions,
            schedule_of(hooks.flush_policies.get(config.flush.mode), config),
            commit_schedule(config), pool,
            hooks.after_flush if hooks.has_after_flush else None, config.cleanup,
            sync_waiters.Waker(positions, waiter_pipes))
        try:
            service.run(wake_r, progress_w, parent_pid)
        finally:
            service.close()
    finally:
        if pool is not None:
            pool.close()
        positions.close()
        os.close(lock_fd)


def schedule_of(policy_factory, config) -> tuple[float, int, float]:
    """(period s, least pages, thorough period s) of the configured flush policy."""
    schedule = getattr(policy_factory, "schedule", None)
    if schedule is not None:
        return schedule(config)
    f = config.flush
    return f.interval_ms / 1000.0, f.least_pages, f.thorough_interval_ms / 1000.0


def commit_schedule(config) -> tuple[float, int, float]:
    w = config.writer
    return w.commit_interval_ms / 1000.0, w.commit_least_pages, w.commit_thorough_interval_ms / 1000.0

"""The store's side of the flush loop: start it, ask it for flushes, follow what it reports.

A listener thread sleeps on the loop's progress pipe; each byte means "positions moved". It
hands the new committed and flushed ends to the store's ``FlushListener`` (readable ends, pool
buffers coming back, the checkpoint, what dispatch may see), and calls its ``tick`` at least
once a second (the store persists metadata and runs its cleanup from there). Sync-flush puts
are woken by the flush loop itself (``workers.sync_waiters``); this client is the ``Flusher``
flush policies wait on.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
import weakref
from typing import Protocol

from mqstore.scheduler import Scheduler, system_scheduler
from mqstore.runtime.workers import flush_worker, shm, sync_waiters
from mqstore.runtime.workers.pipes import poke, wait_and_drain
from mqstore.runtime.workers.supervisor import STOP_TIMEOUT_S, WorkerSupervisor

log = logging.getLogger(__name__)
TICK_INTERVAL_S = 1.0  # the listener's longest sleep: metadata once a second, as RocketMQ's
ASK_TIMEOUT_S = 60.0


class FlushListener(Protocol):
    """What the store does with the flush loop's reports (on the listener thread, or on the
    thread of a put or flush call that observed them first; never two at once)."""

    def on_flush_progress(self, committed: int, flushed: int, failed: bool) -> None: ...

    def tick(self) -> None:
        """At least once a second (more often when asked: ``tick_s``)."""


class FlushSupervisor(WorkerSupervisor):
    name = "flush"

    def own_channel(self) -> shm.FlushChannel:
        return self.channels.flush

    def resume_point(self) -> str:
        ch = self.channels.flush
        return f"committed offset {ch.committed}, flushed offset {ch.flushed}"


def _listen(client_ref) -> None:
    """The listener thread. It holds the client (and through it the store) only while it
    works, never while it sleeps: a store its program dropped stays collectable, and closes
    itself when collected."""
    client = client_ref()
    progress_r = client.progress_r
    tick_s = client.tick_s
    scheduler = client.scheduler
    next_tick = scheduler.monotonic() + tick_s
    del client
    while True:
        poked = wait_and_drain(
            progress_r, scheduler.wait_s(max(0.0, next_tick - scheduler.monotonic())))
        client = client_ref()
        if client is None or client._stopping:
            return
        if poked or scheduler.monotonic() >= next_tick:  # else a look at a hand-moved clock
            next_tick = client._listen_once(next_tick, tick_s)
        del client


class FlushClient:
    def __init__(self, root: str, config, channels: shm.Channels, clock, segment_dir: str,
                 segment_bytes: int, schedule, pool, after_flush,
                 listener: FlushListener, tick_s: float = TICK_INTERVAL_S,
                 scheduler: Scheduler = system_scheduler) -> None:
        self.root = root
        self.config = config
        self.channels = channels
        self.ch = channels.flush
        self.clock = clock
        self.segment_dir = segment_dir
        self.segment_bytes = segment_bytes
        self.schedule = schedule
        self.pool = pool
        self.after_flush = after_flush
        self.listener = listener
        self.tick_s = tick_s
        self.scheduler = scheduler
        self.seen_flushed = channels.flush.flushed
        self.mode = config.flush.worker
        self.supervisor: FlushSupervisor | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition(threading.Lock())
        self._request_lock = threading.Lock()
        self.waiters = sync_waiters.SyncWaiters(channels, mp.get_context("spawn"))
        self._sync_lock = threading.Lock()
        self._ask_lock = threading.Lock()
        self._stopping = False
        self._listener: threading.Thread | None = None

    # -- life --------------------------------------------------------------------------------
    def start(self) -> None:
        seg_bytes = self.segment_bytes
        pool_name = self.pool.name if self.pool is not None else None
        if self.mode == "process":
            sup = self.supervisor = FlushSupervisor(
                self.root, self.config, self.channels, self.clock, flush_worker.run,
                (seg_bytes, pool_name, self.waiters.writers), scheduler=self.scheduler)
            self.wake_w, self.progress_r, self._progress_w = sup.wake_w, sup.progress_r, sup.progress_w
            sup.start()
        else:
            ctx = mp.get_context("spawn")
            wake_r, self.wake_w = ctx.Pipe(duplex=False)
            self.progress_r, self._progress_w = ctx.Pipe(duplex=False)
            os.set_blocking(self.wake_w.fileno(), False)
            os.set_blocking(self._progress_w.fileno(), False)
            self._pipes = (wake_r, self.wake_w, self.progress_r, self._progress_w)
            service = flush_worker.FlushService(
                self.segment_dir, seg_bytes, self.channels, self.schedule,
                flush_worker.commit_schedule(self.config), self.pool, self.after_flush,
                sync_waiters.Waker(self.channels, self.waiters.writers), self.scheduler)
            self._service = service

            progress_w = self._progress_w

            def serve():  # holds no reference to this client: see _listen
                try:
                    service.run(wake_r, progress_w)
                finally:
                    service.close()

            self._thread = threading.Thread(target=serve, name="mqstore-flush", daemon=True)
            self._thread.start()
        self._listener = threading.Thread(target=_listen, args=(weakref.ref(self),),
                                          name="mqstore-flush-listener", daemon=True)
        self._listener.start()

    def _listen_once(self, next_tick: float, tick_s: float) -> float:
        try:
            self.sync()
            now = self.scheduler.monotonic()
            if now >= next_tick:
                next_tick = now + tick_s
                self.listener.tick()
        except Exception:  # a closing store; the next close() reports real trouble
            log.exception("flush listener")
        return next_tick

    def _end(self, slot_value: int) -> None:
        self._stopping = True
        poke(self._progress_w)  # the listener first: the supervisor closes the pipes it reads
        if self._listener is not None:
            self._listener.join(STOP_TIMEOUT_S)
        if self.supervisor is not None:
            if slot_value == 1:
                self.supervisor.stop()
            else:
                self.supervisor.kill()
        elif self._thread is not None:
            self.ch.stop = slot_value
            poke(self.wake_w)
            self._thread.join(STOP_TIMEOUT_S)
            for conn in self._pipes:
                conn.close()
            self._thread = None
        with self._cond:
            self._cond.notify_all()

    def stop(self) -> None:
        """Final commit and flush of everything written, then the loop ends."""
        if self._stopping:
            return
        if self.supervisor is None and self._thread is None:
            # Never started: an open that failed before.
            self._stopping = True
            self.waiters.close()
            return
        listened = self._listener is not None  # else a start cut short (a Ctrl-C in an open)
        self._end(1)
        if listened:
            self.sync()
        self.waiters.close()  # whatever the final flush did not cover answers at once

    def kill(self) -> None:
        """End the loop without a final flush, as the death of the store process would."""
        if not self._stopping and self.supervisor is None and self._thread is None:
            self._stopping = True
            self.waiters.close()
        elif not self._stopping:
            self._end(2)
            self.waiters.close()  # waiting puts answer at once: nothing will flush them

    # -- asking ------------------------------------------------------------------------------
    def take_failure(self) -> str | None:
        return self.supervisor.take_failure() if self.supervisor is not None else None

    def wake(self) -> None:
        poke(self.wake_w)

    def wake_if_idle(self) -> None:
        if self.ch.idle:
            poke(self.wake_w)

    def wait_flushed(self, end_offset: int, timeout_s: float) -> bool:
        """Group commit: ask for ``end_offset`` to be flushed and wait until it is (or time
        is up)."""
        done = self.waiters.wait(end_offset, timeout_s, lambda: self._request(end_offset))
        if self.ch.flushed > self.seen_flushed and not self._stopping:
            self._apply_progress()  # the first put back after a force tells the store
        return done

    def _request(self, end: int) -> None:
        ch = self.ch
        with self._request_lock:
            if end > ch.request:
                ch.request = end
        # Releasing the lock above orders the request store before this load; the loop
        # re-reads the request after announcing idle, so one side always sees the other.
        if ch.idle:
            poke(self.wake_w)

    def commit_now(self) -> None:
        """One explicit pass that commits everything staged in the pool and forces nothing."""
        self.flush_now(-1)

    def flush_now(self, least_pages: int = 0) -> int:
        """One explicit pass: commit everything, flush by ``least_pages`` (-1: not at all);
        returns the flushed end."""
        ch = self.ch
        if self._stopping:
            return self.seen_flushed
        with self._ask_lock:
            seq = ch.ask + 1
            ch.ask_least = least_pages
            ch.ask = seq
            poke(self.wake_w)
            deadline = time.monotonic() + ASK_TIMEOUT_S
            with self._cond:
                while ch.done < seq:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"the flush loop did not answer within {ASK_TIMEOUT_S} s")
                    self._cond.wait(min(left, 0.05))
        self.sync()
        return self.seen_flushed

    # -- following ---------------------------------------------------------------------------
    def sync(self) -> None:
        self._apply_progress()
        with self._cond:
            self._cond.notify_all()

    def _apply_progress(self) -> None:
        ch = self.ch
        with self._sync_lock:
            flushed = ch.flushed
            self.listener.on_flush_progress(ch.committed, flushed, bool(ch.error))
            self.seen_flushed = max(self.seen_flushed, flushed)

    def failing(self) -> str | None:
        """Why the flush loop cannot do its work now, or None."""
        sup = self.supervisor
        if sup is not None and sup.gave_up is not None:
            return sup.gave_up
        return None

    def status(self) -> dict:
        sup = self.supervisor
        ch = self.ch
        out = {"mode": self.mode, "committed": ch.committed, "flushed": ch.flushed,
               "fsyncs": ch.fsyncs, "fsync_seconds": ch.fsync_ns / 1e9}
        if sup is not None:
            out.update(alive=sup.alive(), pid=sup.process.pid, restarts=sup.restarts,
                       failures=list(sup.failures))
        else:
            out["alive"] = self._thread is not None and self._thread.is_alive()
        return out

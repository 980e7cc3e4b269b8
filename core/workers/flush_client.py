"""The store's side of the flush loop: start it, ask it for flushes, follow what it reports.

A listener thread sleeps on the loop's progress pipe; each byte means "positions moved". It
applies COMMITTED and FLUSHED to the store (readable ends, pool buffers coming back, the
checkpoint's ``physicMsgTimestamp``, what dispatch may see) and carries out cleanup decisions.
Once a second it also persists the checkpoint and, in thread-dispatch mode, the consume
queues. Sync-flush puts are woken by the flush loop itself (``workers.sync_waiters``).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import threading
import time
import weakref

from mqstore.workers import flush_worker, shm, sync_waiters
from mqstore.workers.pipes import poke, wait_and_drain
from mqstore.workers.supervisor import STOP_TIMEOUT_S, WorkerSupervisor

log = logging.getLogger("mqstore.workers.flush")
METADATA_INTERVAL_S = 1.0  # consume queues and checkpoint, as RocketMQ's 1 s checkpoint task
ASK_TIMEOUT_S = 60.0


class FlushSupervisor(WorkerSupervisor):
    name = "flush"
    stop_slot = shm.FLUSH_STOP

    def resume_point(self) -> str:
        return (f"committed offset {self.positions[shm.COMMITTED]}, flushed offset "
                f"{self.positions[shm.FLUSHED]}")


def _listen(client_ref) -> None:
    """The listener thread. It holds the client (and through it the store) only while it
    works, never while it sleeps: a store its program dropped stays collectable, and closes
    itself when collected."""
    client = client_ref()
    progress_r = client.progress_r
    next_metadata = time.monotonic() + METADATA_INTERVAL_S
    del client
    while True:
        wait_and_drain(progress_r, max(0.0, next_metadata - time.monotonic()))
        client = client_ref()
        if client is None or client._stopping:
            return
        next_metadata = client._listen_once(next_metadata)
        del client


class FlushClient:
    def __init__(self, store, positions: shm.SharedPositions, pool=None) -> None:
        self.store = store
        self.p = positions
        self.pool = pool
        self.mode = store.config.flush.worker
        self.supervisor: FlushSupervisor | None = None
        self._thread: threading.Thread | None = None
        self._cond = threading.Condition(threading.Lock())
        self._request_lock = threading.Lock()
        self.waiters = sync_waiters.SyncWaiters(positions, mp.get_context("spawn"))
        self._sync_lock = threading.Lock()
        self._ask_lock = threading.Lock()
        self._stopping = False
        self._listener: threading.Thread | None = None

    # -- life --------------------------------------------------------------------------------
    def start(self) -> None:
        store = self.store
        seg_bytes = store.commit_log.segment_bytes
        pool_name = self.pool.name if self.pool is not None else None
        if self.mode == "process":
            sup = self.supervisor = FlushSupervisor(
                store.root, store.config, self.p, flush_worker.run,
                (seg_bytes, pool_name, self.waiters.writers))
            self.wake_w, self.progress_r, self._progress_w = sup.wake_w, sup.progress_r, sup.progress_w
            sup.start()
        else:
            ctx = mp.get_context("spawn")
            wake_r, self.wake_w = ctx.Pipe(duplex=False)
            self.progress_r, self._progress_w = ctx.Pipe(duplex=False)
            os.set_blocking(self.wake_w.fileno(), False)
            os.set_blocking(self._progress_w.fileno(), False)
            self._pipes = (wake_r, self.wake_w, self.progress_r, self._progress_w)
            hooks = store.hooks
            service = flush_worker.FlushService(
                store.commit_log.segments.directory, seg_bytes, self.p,
                flush_worker.schedule_of(type(store.flush_policy), store.config),
                flush_worker.commit_schedule(store.config), self.pool,
                hooks.after_flush if hooks.has_after_flush else None, store.config.cleanup,
                sync_waiters.Waker(self.p, self.waiters.writers))
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

    def _listen_once(self, next_metadata: float) -> float:
        try:
            self.sync()
            now = time.monotonic()
            if now >= next_metadata:
                next_metadata = now + METADATA_INTERVAL_S
                self.store.flush_metadata()
        except Exception:  # a closing store; the next close() reports real trouble
            log.exception("flush listener")
        return next_metadata

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
            self.p[shm.FLUSH_STOP] = slot_value
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
        self._end(1)
        self.sync()
        self.waiters.close()  # whatever the final flush did not cover answers at once

    def kill(self) -> None:
        """End the loop without a final flush, as the death of the store process would."""
        if not self._stopping:
            self._end(2)
            self.waiters.close()  # waiting puts answer at once: nothing will flush them

    # -- asking ------------------------------------------------------------------------------
    def take_failure(self) -> str | None:
        return self.supervisor.take_failure() if self.supervisor is not None else None

    def wake(self) -> None:
        poke(self.wake_w)

    def wake_if_idle(self) -> None:
        if self.p[shm.FLUSH_IDLE]:
            poke(self.wake_w)

    def wait_flushed(self, end: int, timeout_s: float) -> bool:
        """Group commit: ask for ``end`` to be flushed and wait until it is (or time is up)."""
        done = self.waiters.wait(end, timeout_s, lambda: self._request(end))
        if self.p[shm.FLUSHED] > self.store.flushed_where and not self._stopping:
            self._apply_progress()  # the first put back after a force tells the store
        return done

    def _request(self, end: int) -> None:
        p = self.p
        with self._request_lock:
            if end > p[shm.FLUSH_REQUEST]:
                p[shm.FLUSH_REQUEST] = end
        # Releasing the lock above orders the FLUSH_REQUEST store before this load; the loop
        # re-reads FLUSH_REQUEST after announcing FLUSH_IDLE, so one side always sees the other.
        if p[shm.FLUSH_IDLE]:
            poke(self.wake_w)

    def commit_now(self) -> None:
        """One explicit pass that commits everything staged in the pool and forces nothing."""
        self.flush_now(-1)

    def flush_now(self, least_pages: int = 0) -> int:
        """One explicit pass: commit everything, flush by ``least_pages`` (-1: not at all);
        returns the flushed end."""
        if self._stopping:
            return self.store.flushed_where
        with self._ask_lock:
            seq = self.p[shm.FLUSH_ASK] + 1
            self.p[shm.FLUSH_ASK_LEAST] = least_pages
            self.p[shm.FLUSH_ASK] = seq
            poke(self.wake_w)
            deadline = time.monotonic() + ASK_TIMEOUT_S
            with self._cond:
                while self.p[shm.FLUSH_DONE] < seq:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise TimeoutError(f"the flush loop did not answer within {ASK_TIMEOUT_S} s")
                    self._cond.wait(min(left, 0.05))
        self.sync()
        return self.store.flushed_where

    # -- following ---------------------------------------------------------------------------
    def sync(self) -> None:
        self._apply_progress()
        p = self.p
        with self._sync_lock:
            ask = p[shm.CLEAN_ASK]
            if ask > p[shm.CLEAN_DONE] and not self._stopping:
                self.store._run_cleanup(bool(p[shm.CLEAN_AT_ONCE]))
                p[shm.CLEAN_DONE] = ask
        with self._cond:
            self._cond.notify_all()

    def _apply_progress(self) -> None:
        p = self.p
        with self._sync_lock:
            self.store._apply_flush_progress(p[shm.COMMITTED], p[shm.FLUSHED],
                                             bool(p[shm.FLUSH_ERROR]))
            self.store._apply_disk_state(bool(p[shm.DISK_FULL_FLAG]))

    def status(self) -> dict:
        sup = self.supervisor
        out = {"mode": self.mode, "committed": self.p[shm.COMMITTED],
               "flushed": self.p[shm.FLUSHED], "fsyncs": self.p[shm.FLUSH_COUNT]}
        if sup is not None:
            out.update(alive=sup.alive(), pid=sup.process.pid, restarts=sup.restarts,
                       failures=list(sup.failures))
        else:
            out["alive"] = self._thread is not None and self._thread.is_alive()
        return out

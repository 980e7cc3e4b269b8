"""The Runtime: the loops of a writable store (dispatch, flush, cleanup) and their channels.

It starts the dispatch loop (a worker process, or a thread with ``dispatch.worker: thread``)
and the flush loop (likewise), follows what they report, runs the cleanup job's first step on
the store clock, and stops them in order (NOTE [ Shutdown ] in ``workers.supervisor``). The
store's other parts see it through a few calls: ``appended`` after each append,
``confirm_offset`` for what consumers may see, ``failing`` for why puts must wait.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref

from mqstore.runtime import cleanup
from mqstore.config import describe_watermark, parse_delay_levels
from mqstore.plugin_api.contracts import (
    READS_STORE, CapabilityError, WriterContext, check_capabilities,
)
from mqstore.dispatch.derived_flush import DerivedFlush
from mqstore.dispatch.loop import DispatchLoop, DispatchThread, TagsCoder
from mqstore.errors import PluginError, WorkerError
from mqstore.append.pool_writer import staging_pool
from mqstore.append.tail import AppendTail
from mqstore.running_flags import DISK_FULL, NOT_WRITEABLE
from mqstore.scheduler import Scheduler, system_scheduler
from mqstore.runtime.workers import shm
from mqstore.runtime.workers.flush_client import FlushClient
from mqstore.runtime.workers.pipes import wait_and_drain
from mqstore.runtime.workers.supervisor import DISPATCH_CATCH_UP_S, DispatchSupervisor
from mqstore.runtime.workers.wakeup import open_wakeup

log = logging.getLogger(__name__)
CLEANUP_ACK_TIMEOUT_S = 30.0
OPEN_CATCH_UP_POLL_S = 0.05


class Runtime:
    def __init__(self, *, state, config, view, dispatchers, hooks, writer_factory,
                 flush_factory, channels: shm.Channels, tail: AppendTail, store_lock, clock,
                 manifest, store_id: str, scheduler: Scheduler = system_scheduler) -> None:
        """Built in dependency order, each part handed what it uses: the writer (from
        ``writer_factory``, waking the committer through this runtime, weakly), the flush
        client, then the flush policy (from ``flush_factory``, on that client). ``channels``:
        the store's shared positions (the opener made them for the reader already);
        ``tail``: what appends leave (``append.tail``); ``store_lock``: the writer's lock,
        watched by ``tick`` (None where the directory cannot be locked)."""
        # Built and checked first: a policy refused here leaves nothing to undo.
        self.cleanup_policy = hooks.cleanup_policies.get(config.cleanup.policy)(config)
        try:
            declared = check_capabilities(self.cleanup_policy,
                                          f"cleanup policy {config.cleanup.policy!r}")
        except CapabilityError as exc:
            raise PluginError(str(exc)) from None
        self.cleanup_reads_store = READS_STORE in declared  # bound by the store once open
        self.state = state
        self.config = config
        self.root = view.root
        self.view = view
        self.commit_log = view.commit_log
        self.checkpoint = view.checkpoint
        self.dispatchers = dispatchers
        self.hooks = hooks
        self.clock = clock
        self.scheduler = scheduler
        self.manifest = manifest
        self.tail = tail
        self.store_lock = store_lock
        self.lock_changed: str | None = None  # what tick found changed (NOTE [ Store lock ])
        self.flushed_where = self.commit_log.max_offset
        self.channels = channels
        wake = weakref.WeakMethod(self.wake_committer)  # the writer must not keep us alive
        self.writer = writer = writer_factory(WriterContext(
            self.root, config, self.commit_log, lambda: _call(wake), store_id))
        try:
            self._build(config, view, dispatchers, hooks, writer, flush_factory, clock,
                        scheduler)
        except BaseException:
            writer.close()
            raise

    def _build(self, config, view, dispatchers, hooks, writer, flush_factory, clock,
               scheduler: Scheduler) -> None:
        self._append_channel = self.channels.append  # the put path's, looked up once
        self._dispatch_channel = self.channels.dispatch
        self.staging = staging_pool(writer)  # the transient pool, or None (a plain writer)
        self._staged = self.staging is not None
        self.supervisor: DispatchSupervisor | None = None
        self.dispatch_loop: DispatchLoop | None = None
        self.dispatch_thread: DispatchThread | None = None
        self.wakeup = None  # thread mode: NOTE [ Long polling ] in workers.wakeup
        self._next_cleanup = scheduler.monotonic() + config.cleanup.interval_ms / 1000.0
        self._cleanup_lock = threading.Lock()
        self._flush_derived = DerivedFlush(
            self.root, view, dispatchers, self.manifest,
            lambda: None if self.dispatch_loop is None else self.dispatch_loop.last_mark,
            lambda: self.channels.flush.flushed)
        self.flush_client = FlushClient(
            self.root, config, self.channels, clock, self.commit_log.segments.directory,
            self.commit_log.segment_bytes, flush_factory.schedule(config), self.staging,
            hooks.after_flush if hooks.has_after_flush else None, listener=_Listener(self),
            tick_s=min(1.0, config.cleanup.interval_ms / 1000.0), scheduler=scheduler)
        self.flush_policy = flush_factory(config, self.flush_client)
        self.visible_after_flush = bool(self.flush_policy.visible_after_flush)

    # -- starting ----------------------------------------------------------------------------
    def start(self, start: int, abnormal: bool, trusted_end: int = -1, *,
              hold: bool = False) -> tuple[int, float]:
        """Publish the initial positions, dispatch ``[start, end)`` (recovery's re-dispatch:
        queue offsets must be known before the first put), start the loops. Returns the
        bytes re-dispatched and the seconds it took. ``trusted_end``: the report's (the
        dispatch worker's dispatchers resume from it as the store process's did); ``hold``:
        queues are below their floors (the manifest's), so the open waits for their
        fillers even with nothing to dispatch."""
        ch = self.channels
        end = self.commit_log.max_offset
        ch.append.written = ch.flush.committed = ch.flush.flushed = end
        ch.append.confirmed = self.confirm_offset()
        ch.append.abnormal = int(abnormal)
        ch.append.trusted_end = trusted_end
        ch.dispatch.dispatched = start
        ch.dispatch.logics_ts = self.checkpoint.logics_msg_timestamp
        ch.dispatch.index_ts = self.checkpoint.index_msg_timestamp
        ch.cleanup.min_phys = ch.cleanup.dropped = max(self.commit_log.min_offset, 0)
        began = time.perf_counter()
        if self.config.dispatch.worker == "process":
            self.supervisor = DispatchSupervisor(self.root, self.config, ch, self.clock,
                                                 scheduler=self.scheduler)
            self.supervisor.start()
            if start < end or hold:  # else a clean open does not wait for the worker
                self._wait_caught_up(end)
        else:
            self._start_dispatch_thread(start, end)
        seconds = time.perf_counter() - began
        self.flush_client.start()
        return max(0, end - start), seconds

    def _start_dispatch_thread(self, start: int, end: int) -> None:
        view = self.view
        self.wakeup = open_wakeup(self.root)
        self.dispatch_loop = DispatchLoop(
            self.commit_log, self.dispatchers,
            TagsCoder(view.string_hash, parse_delay_levels(self.config.store.message_delay_levels)),
            lambda ch=self.channels.append: ch.confirmed, start,
            batch_bytes=self.config.dispatch.batch_bytes, after_dispatch=self._after_dispatch)
        self.dispatch_loop.run_until(end)
        view.hold_floors(self.manifest.floors())  # NOTE [ Offset floors ]
        self.channels.dispatch.dispatched = self.dispatch_loop.dispatched
        self.dispatch_thread = DispatchThread(self.dispatch_loop, self.config.dispatch.interval_ms)
        self.dispatch_thread.start()

    def _wait_caught_up(self, end: int) -> None:
        """Recovery's re-dispatch, done by the dispatch worker (it owns the files): wait for it
        (queue offsets must be known before the first put), or raise what stops it."""
        sup, ch = self.supervisor, self.channels.dispatch
        while not (ch.started and ch.dispatched >= end):
            if sup.gave_up is not None:
                raise WorkerError(sup.gave_up)
            if ch.fails:
                raise WorkerError(f"re-dispatch at open failed: {ch.note}")
            wait_and_drain(sup.progress_r, OPEN_CATCH_UP_POLL_S)

    def _after_dispatch(self, batch) -> None:
        self.manifest.write_marked(self.view.consume_queues)  # new queues, once they hold units
        self.hooks.after_dispatch(batch)
        if self.wakeup is not None:  # the units are written: readers may look (thread mode)
            self.wakeup.notify()

    # -- what the other parts call -----------------------------------------------------------
    def confirm_offset(self) -> int:
        """End of what consumers may see: flushed bytes when the flush policy says so (sync
        flush), else the readable end (written; committed, with a staging writer)."""
        if self.visible_after_flush:
            return self.flushed_where
        return self.commit_log.max_offset

    def appended(self, end: int) -> None:
        """After an append: publish the written and visible ends, wake the loops."""
        self.checkpoint.note_appended(end)
        if self._append_channel.publish(end, self.confirm_offset()) and self._staged:
            self.flush_client.wake_if_idle()  # wakeCommitWhenPutMessage
        self._wake_dispatch()

    def _wake_dispatch(self) -> None:
        if self.supervisor is not None:
            # Publish before reading the idle flag: see the handshake in dispatch_worker.
            if self._dispatch_channel.idle:
                self.supervisor.wake()
            return
        thread = self.dispatch_thread
        if thread is not None and not thread.wake.is_set():
            thread.wake.set()

    def wake_committer(self) -> None:
        """A writer waits for pool buffers under the put lock: publish what this append has
        written so far (whole segments the committer may now finish), then wake it."""
        self.channels.append.publish_written(self.commit_log.segments.contiguous_end())
        self.flush_client.wake()

    def failing(self) -> str | None:
        """Why the dispatch or flush loop cannot do its work now, or None."""
        sup = self.supervisor
        if sup is not None:
            if sup.gave_up is not None:
                return sup.gave_up
            if self.channels.dispatch.fails:
                return self.channels.dispatch.note
        elif self.dispatch_thread is not None:
            if self.dispatch_thread.exception is not None:
                return self.dispatch_loop.error
            if self.dispatch_loop.failing is not None:
                return self.dispatch_loop.failing
        return self.flush_client.failing()

    # -- following the flush loop (its listener) ---------------------------------------------
    def on_flush_progress(self, committed: int, flushed: int, failed: bool) -> None:
        if self._staged:
            self.writer.on_committed(committed)
        if flushed > self.flushed_where:
            self.flushed_where = flushed
            # Recovery treats damage below this offset as bit rot, not a torn tail.
            self.checkpoint.confirm_phy_offset = flushed
            end, store_ts = self.tail.last_append
            if flushed >= end and store_ts:
                self.checkpoint.physic_msg_timestamp = store_ts
        if failed and not self.state.running_flags & NOT_WRITEABLE:
            self.state.running_flags |= NOT_WRITEABLE  # as RocketMQ after a failed force
        self.channels.append.publish_confirmed(self.confirm_offset())
        self._wake_dispatch()

    def tick(self) -> None:
        """Once a second: metadata; every ``cleanup.interval_ms``: the cleanup decision."""
        if self.state.closed:
            return
        scheduler = self.scheduler
        began = scheduler.monotonic()
        self._watch_lock()
        self.flush_metadata()
        scheduler.ran("metadata", began)
        if self.supervisor is None:  # the derived files were this process's to force
            scheduler.ran("derived_flush", began)
        now = scheduler.monotonic()
        if now >= self._next_cleanup:
            self._next_cleanup = now + self.config.cleanup.interval_ms / 1000.0
            self.run_cleanup()
            scheduler.ran("cleanup", now)

    def _watch_lock(self) -> None:
        """Said once: the store's directory or lock file changed under the writer. ``abort``
        is made sure of now, for a crash before the close (which leaves no clean marker)."""
        if self.store_lock is None or self.lock_changed is not None:
            return
        changed = self.store_lock.intact()
        if changed:
            self.lock_changed = changed
            log.error("store %s: %s while this writer has it open; it will not be closed "
                      "cleanly, so that its next open recovers it in full", self.root, changed)
            self.store_lock.mark_unclean()

    def flush_metadata(self) -> None:
        """Persist consume queues and the checkpoint, so an abnormal recovery can start near
        the end instead of at the first segment."""
        if self.supervisor is not None:  # the dispatch worker owns and flushes the queues
            self.checkpoint.logics_msg_timestamp = self.channels.dispatch.logics_ts
            self.checkpoint.index_msg_timestamp = self.channels.dispatch.index_ts
            self.checkpoint.flush()
            return
        logics = self.checkpoint.logics_msg_timestamp
        self._flush_derived()
        self.checkpoint.flush(logics_msg_timestamp=logics)

    # -- cleanup -------------------------------------------------------------------------------
    def run_cleanup(self) -> None:
        """Step 1 of the cleanup job (``mqstore.runtime.cleanup``), by the policy's decision."""
        cfg = self.config.cleanup
        decision = self.cleanup_policy.decide(self.clock(), cleanup.disk_used_ratio(self.root))
        self._apply_disk_state(decision.disk_full)
        if not decision.delete:
            return
        removed = self.delete_expired(decision.reserved_ms, cfg.max_segments_per_run,
                                      decision.keep_from_phys)
        if removed:
            log.info("cleanup removed %d commit-log segment(s); the log now starts at %d%s",
                     len(removed), self.commit_log.min_offset,
                     "" if decision.reserved_ms else " (disk too full: oldest first)")

    def _apply_disk_state(self, full: bool | None) -> None:
        state = self.state
        if full and not state.running_flags & DISK_FULL:
            log.error("disk of %s is %s: puts refused until cleanup frees space", self.root,
                      describe_watermark(self.config.cleanup.disk_warning_ratio))
            state.running_flags |= DISK_FULL
        elif full is False and state.running_flags & DISK_FULL:
            state.running_flags &= ~DISK_FULL

    def delete_expired(self, reserved_ms: int, max_segments: int,
                       keep_from_phys: int = -1) -> list[str]:
        """Delete expired segments (none holding bytes at or above ``keep_from_phys``), then
        have the dispatch loop's process drop the derived files below the new minimum;
        returns the deleted commit-log paths."""
        with self._cleanup_lock:
            with self.tail.lock:
                segs = self.commit_log.segments.segments
                count = cleanup.expired_count(self.commit_log, self.clock(), reserved_ms,
                                              max_segments, keep_from_phys)
                if count:
                    # Queues stop offering the units first, then the records go: a reader
                    # never sees a min offset whose record was already deleted.
                    for cq in list(self.view.consume_queues.values()):
                        cq.correct_min_offset(segs[count].start)
                removed = self.commit_log.segments.drop_first(count)
            if removed:
                self._drop_derived(self.commit_log.min_offset)
            return removed

    def _drop_derived(self, min_phys: int) -> None:
        ch = self.channels.cleanup
        ch.min_phys = min_phys
        if self.supervisor is None:  # this process owns the derived files
            cleanup.drop_derived(self.view, self.dispatchers, self.hooks, min_phys)
            ch.dropped = min_phys
            return
        deadline = time.monotonic() + CLEANUP_ACK_TIMEOUT_S
        while ch.dropped < min_phys and time.monotonic() < deadline:
            if self.supervisor.gave_up is not None:
                return
            self.supervisor.wake()
            wait_and_drain(self.supervisor.progress_r, 0.01)  # the worker pokes once it acks
        if ch.dropped < min_phys:
            log.warning("the dispatch worker has not dropped the files below %d within %.0f "
                        "s; it will when it can", min_phys, CLEANUP_ACK_TIMEOUT_S)

    # -- waiting -------------------------------------------------------------------------------
    def wait_dispatched(self, timeout: float) -> None:
        if self._staged and not self.visible_after_flush:
            self.flush_client.commit_now()
        target = self.confirm_offset()
        if self.supervisor is not None:
            self._wake_dispatch()
            failure = self.supervisor.take_failure()
            if failure is not None:
                raise WorkerError(failure)
            # ``started``: the worker's own dispatchers have caught up with what the log held
            # when it started (one built only there may resume earlier than the store saw).
            if self.supervisor.wait_dispatched(target, timeout, until_started=True):
                return
            failure = self.supervisor.take_failure()
            if failure is not None:
                raise WorkerError(failure)
            reached = self.channels.dispatch.dispatched
        elif self.dispatch_loop.wait(target, timeout):
            return
        else:
            if self.dispatch_loop.error:
                raise RuntimeError(self.dispatch_loop.error)
            reached = self.dispatch_loop.dispatched
        stuck = self.failing()
        raise TimeoutError(
            f"dispatch reached commit-log offset {reached}, not {target}, within {timeout} s"
            + (f": {stuck}" if stuck else ""))

    def dispatched(self) -> int:
        if self.supervisor is not None:
            return self.channels.dispatch.dispatched
        return self.dispatch_loop.dispatched

    def worker_status(self) -> dict:
        sup = self.supervisor
        if sup is None:
            return {"mode": self.config.dispatch.worker, "alive": self.dispatch_thread is not None
                    and self.dispatch_thread.is_alive(), "failing": self.failing()}
        return {"mode": "process", "alive": sup.alive(), "pid": sup.process.pid,
                "restarts": sup.restarts, "failures": list(sup.failures),
                "dispatched": self.channels.dispatch.dispatched, "failing": self.failing(),
                "gave_up": sup.gave_up is not None}

    # -- stopping ------------------------------------------------------------------------------
    def stop(self, last_end: int) -> bool:
        """The shutdown protocol; True when everything written was dispatched and flushed
        and no loop failed (the store then closes cleanly)."""
        self.flush_client.stop()  # final commit and flush; the loop is gone after
        if self.supervisor is not None:
            self._wake_dispatch()
            self.supervisor.wait_dispatched(self.confirm_offset(), DISPATCH_CATCH_UP_S)
            self.supervisor.stop()
            lag = self.confirm_offset() - self.channels.dispatch.dispatched
            healthy = self.failing() is None
        else:
            try:
                if self.dispatch_thread.is_alive():
                    self.dispatch_loop.wait(self.confirm_offset(), DISPATCH_CATCH_UP_S)
            finally:
                self.dispatch_thread.stop()
            # Whatever the thread left (it ends early when the store was dropped).
            self.dispatch_loop.run_until(self.confirm_offset())
            lag = self.dispatch_loop.behind_bytes()
            healthy = self.dispatch_thread.exception is None
            self.view.flush_queues()
            self.manifest.update(self.view.consume_queues, final=True)
        self.flush_metadata()
        return lag == 0 and healthy and self.flushed_where >= last_end

    def kill(self) -> None:
        """End the loops abruptly, as the death of the store process would."""
        self.flush_client.kill()
        if self.dispatch_thread is not None:
            self.dispatch_thread.stop()
        if self.supervisor is not None:
            self.supervisor.kill()

    def abort_start(self) -> None:
        """Undo a start that failed part way (the open raises the failure itself)."""
        for stop in (self.flush_client.stop,
                     self.dispatch_thread.stop if self.dispatch_thread is not None else None,
                     self.supervisor.stop if self.supervisor is not None else None):
            if stop is not None:
                try:
                    stop()
                except Exception:
                    log.exception("stopping a loop of a store whose open failed")

    def close_writer(self, last_end: int) -> None:
        """Close the writer once the flush loop is gone (it reads the pool). Acknowledged
        records may still be only in the transient pool (a close cut short, the flush loop
        failing): the pool then stays for the next open to write back (``salvage_pool``)."""
        if self._staged:
            drained = self.channels.closed or self.channels.flush.committed >= last_end
            self.writer.close(keep_staged=not drained)
        else:
            self.writer.close()

    def close_channels(self) -> None:
        self.channels.close()
        if self.wakeup is not None:
            self.wakeup.close()
            self.wakeup = None


class _Listener:
    """The flush client's listener, holding the runtime weakly (no cycle through the store:
    a store its program dropped is still collected and closed)."""

    def __init__(self, runtime: Runtime) -> None:
        self._runtime = weakref.ref(runtime)

    def on_flush_progress(self, committed: int, flushed: int, failed: bool) -> None:
        runtime = self._runtime()
        if runtime is not None:
            runtime.on_flush_progress(committed, flushed, failed)

    def tick(self) -> None:
        runtime = self._runtime()
        if runtime is not None:
            runtime.tick()


def _call(method: weakref.WeakMethod) -> None:
    bound = method()
    if bound is not None:
        bound()

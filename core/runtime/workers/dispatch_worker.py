"""The dispatch loop as a worker process (started by the supervisor).

The worker maps the commit log read-only, owns the consume queues and the dispatchers' files
(key index, third-party index builders) and publishes its position in shared memory. It builds
its own plugin manager from the plugin names in the config, so third-party dispatchers and
``after_dispatch`` hooks run here. See NOTE [ Shutdown ] in ``supervisor``.
"""

from __future__ import annotations

import logging
import os
import time

from mqstore.runtime import cleanup
from mqstore.config import StoreConfig, parse_delay_levels
from mqstore.plugin_api.contracts import WRITER
from mqstore.dispatch.derived_flush import DerivedFlush
from mqstore.dispatch.loop import DispatchLoop, TagsCoder
from mqstore.dispatch.dispatchers import Dispatchers
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.plugin_api.manager import PluginHooks, make_plugin_manager
from mqstore.plugin_api.recovery_report import RecoveryReport
from mqstore.storage.meta_file import read_meta
from mqstore.storage.store_lock import hold_worker_lock, release_worker_lock
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.consume_queue import load_consume_queues
from mqstore.storage.mapped_budget import MappedBudget
from mqstore.storage.queue_manifest import ManifestKeeper
from mqstore.view.directory_view import DirectoryView
from mqstore.scheduler import Scheduler
from mqstore.uninterrupted import parent_alive, worker_signals
from mqstore.runtime.workers import shm
from mqstore.runtime.workers.pipes import poke, wait_and_drain
from mqstore.runtime.workers.wakeup import open_wakeup

log = logging.getLogger(__name__)
IDLE_WAIT_S = 0.05  # wait between checks for stop / parent death while idle
NAP_PERIOD_S = 0.05  # after its last work the worker naps dispatch.interval_ms at a time...
FLUSH_INTERVAL_S = 1.0  # consume queues are forced to disk this often, as RocketMQ does
# After a pass that caught up, the worker naps this many times the CPU the pass took (at
# least dispatch.interval_ms, at most NAP_MOST_S): a pass has fixed costs (~0.1-0.3 ms of
# Python and numpy, whatever its size), so a steady trickle of puts dispatched one record per
# pass would cost a fifth of a CPU; this way the fixed costs take at most 1/20 of one, and a
# record waits at most NAP_MOST_S longer to become visible.
NAP_PER_PASS = 19
NAP_MOST_S = 0.01


def nap_after_pass(spent_s: float, interval_s: float) -> float:
    """How long the worker naps after a pass that caught up and took ``spent_s`` of CPU:
    ``NAP_PER_PASS`` times that, but never less than ``dispatch.interval_ms`` and never more
    than ``NAP_MOST_S`` unless the interval itself says so."""
    return max(interval_s, min(NAP_MOST_S, spent_s * NAP_PER_PASS))


class _SharedCheckpoint:
    """The checkpoint fields dispatch owns, kept in the dispatch channel for the store to
    persist."""

    def __init__(self, channel: shm.DispatchChannel) -> None:
        self._ch = channel

    logics_msg_timestamp = property(lambda self: self._ch.logics_ts,
                                    lambda self, v: setattr(self._ch, "logics_ts", v))
    index_msg_timestamp = property(lambda self: self._ch.index_ts,
                                   lambda self, v: setattr(self._ch, "index_ts", v))


def _view(root: str, config: StoreConfig, channels: shm.Channels, clock, abnormal: bool,
          hooks: PluginHooks, trusted_end: int) -> DirectoryView:
    """The worker's own view of the store: its maps, its consume queues (it writes them)."""
    meta = read_meta(root) or {}
    # The store process recorded the sizes in mqstore.json before starting this worker.
    commit_log = CommitLog(os.path.join(root, "commitlog"), None, read_only=True,
                           known_bytes=meta.get("commit_log_segment_bytes"))
    commit_log.load()
    _forget_growing_tail(commit_log.segments)
    cq_bytes = meta.get("consume_queue_file_bytes") or round_file_bytes(
        config.consume_queue.file_units * CQ_UNIT_SIZE)
    mapped = MappedBudget(config.consume_queue.max_mapped_files)
    queues = load_consume_queues(root, cq_bytes, read_only=False,
                                 known_bytes=meta.get("consume_queue_file_bytes"), budget=mapped)
    return DirectoryView(
        root, config, clock=clock, hash_kind=meta.get("hash", "java"), commit_log=commit_log,
        checkpoint=_SharedCheckpoint(channels.dispatch),
        # commit_log_end: where the store's recovery left the log (or, for a restarted worker,
        # where it stands now): dispatchers resume no later than there.
        recovery_report=RecoveryReport(abnormal=abnormal, trusted_end=trusted_end,
                                       commit_log_end=channels.append.written),
        cq_file_bytes=cq_bytes,
        consume_queues=queues, filters=hooks.filters, writes_queues=True,
        manifest=ManifestKeeper(root), mapped=mapped)


def _forget_growing_tail(segments) -> None:
    """Let go of a last segment mapped shorter than the segment size: the store process is
    creating it (a first put may run while this worker starts, and the file grows while its
    blocks are reserved; any short file found at the open was extended before this worker
    started). Mapped as it stood, its end would hide every record past it for good; the
    next ``refresh`` maps it once it is whole."""
    last = segments.segments[-1] if segments.segments else None
    if last is not None and last.size < segments.segment_bytes:
        segments.segments = segments.segments[:-1]
        last.close()


def _after_dispatch(view, hook):
    """New queues go into the manifest as soon as their first units are written."""
    def after(batch) -> None:
        view.manifest.write_marked(view.consume_queues)
        hook(batch)
    return after


def run(root: str, config: StoreConfig, channels: shm.Channels, wake_r, progress_w,
        parent_pid: int, restarted: bool, clock, scheduler: Scheduler) -> None:
    """Worker entry point (``multiprocessing`` target)."""
    worker_signals()
    lock_fds = hold_worker_lock(root)
    try:
        os.set_blocking(progress_w.fileno(), False)
        _run(root, config, channels, wake_r, progress_w, parent_pid, restarted, clock,
             scheduler)
    finally:
        channels.close()
        release_worker_lock(lock_fds)


def _run(root, config, channels, wake_r, progress_w, parent_pid, restarted, clock,
         scheduler) -> None:
    ch = channels.dispatch
    hooks = PluginHooks(make_plugin_manager(
        modules=config.plugins.modules, disable=config.plugins.disable,
        load_entry_points=config.plugins.load_entry_points))
    # A restarted worker finds the files as its predecessor left them, not as the marker
    # described them: only the first one may take the open's trusted end.
    view = _view(root, config, channels, clock, restarted or bool(channels.append.abnormal),
                 hooks, -1 if restarted else channels.append.trusted_end)
    dispatched = ch.dispatched
    for cq in view.consume_queues.values():
        if not restarted:
            # The store process recovered them just now (or trusted a clean close's marker):
            # each ends at its last valid unit, zeros after, so the files say where.
            cq.restore(*cq.tail())
            continue
        cq.recover()  # loaded files count as full until their units are checked
        # A killed predecessor may have left units past its published position.
        cq.truncate_to_phys(dispatched)
    dispatchers = Dispatchers(hooks.dispatchers, view, WRITER)
    start = max(min([dispatched, *dispatchers.resume_offsets()]), 0)
    loop = DispatchLoop(view.commit_log, dispatchers,
                        TagsCoder(view.string_hash, parse_delay_levels(config.store.message_delay_levels)),
                        lambda: channels.append.confirmed, start,
                        batch_bytes=config.dispatch.batch_bytes,
                        after_dispatch=_after_dispatch(view, hooks.after_dispatch))
    wakeup = open_wakeup(root)
    flush_derived = DerivedFlush(root, view, dispatchers, view.manifest,
                                 lambda: loop.last_mark, lambda: channels.flush.flushed)
    try:
        _Serving(view, loop, dispatchers, hooks, channels, wakeup, flush_derived,
                 scheduler).serve(wake_r, progress_w, parent_pid,
                                  config.dispatch.interval_ms / 1000.0)
    finally:
        if wakeup is not None:
            wakeup.close()
        flush_derived()  # on a clean stop the flush worker has flushed everything first
        view.manifest.update(view.consume_queues, final=True)
        dispatchers.close()
        view.close()
        poke(progress_w)


class _Serving:
    """The worker's loop over the parts ``_run`` built: map new segments, flush its files once
    a second, follow cleanup, dispatch and publish, report failures, and sleep when idle."""

    def __init__(self, view, loop, dispatchers, hooks, channels: shm.Channels, wakeup,
                 flush_derived: DerivedFlush, scheduler: Scheduler) -> None:
        self.view = view
        self.loop = loop
        self.dispatchers = dispatchers
        self.hooks = hooks
        self.channels = channels
        self.ch = channels.dispatch
        self.wakeup = wakeup
        self.flush_derived = flush_derived
        self.scheduler = scheduler

    def serve(self, wake_r, progress_w, parent_pid: int, nap_s: float) -> None:
        ch, loop, confirmed_of = self.ch, self.loop, self.channels.append
        # An open waits until this worker has dispatched what the log held (from where its own
        # dispatchers need it: a dispatcher built only here may resume earlier than the store
        # saw).
        opened_end = confirmed_of.confirmed
        next_flush = self.scheduler.monotonic() + FLUSH_INTERVAL_S
        last_work = time.monotonic()
        while not ch.stop:
            began = time.thread_time()  # the pass's CPU includes these per-look checks
            if not parent_alive():
                log.error("store process %d is gone; dispatch worker exits", parent_pid)
                return
            self._map_new_segments()
            next_flush = self._flush_files_if_due(next_flush)
            _follow_cleanup(self.view, self.dispatchers, self.hooks, self.channels.cleanup,
                            progress_w)
            if not ch.started and loop.dispatched >= opened_end:
                # Every record the log held at the open has its unit: the offsets the queues
                # gave out before and lost get fillers (NOTE [ Offset floors ]).
                self.view.hold_floors(self.view.manifest.floors())
                ch.started = 1
                poke(progress_w)
            seen = confirmed_of.confirmed
            if loop.run_once():
                self._publish(progress_w)
                last_work = time.monotonic()
                if loop.dispatched < seen:
                    continue  # the pass stopped at batch_bytes: the rest is waiting
                # Caught up with what it saw: nap before looking again, as RocketMQ's reput
                # thread does after every pass, and long enough that the next pass has several
                # records to share its fixed costs. Records put during the pass wait for the
                # nap too: under a stream of single puts one lands during nearly every pass,
                # and going on at once would dispatch them one or two a pass.
                time.sleep(nap_after_pass(time.thread_time() - began, nap_s))
                continue
            if loop.error:
                raise RuntimeError(loop.error)
            if loop.failing is not None:
                # The store refuses puts while this is set (they would never become readable).
                ch.note = loop.failing
                ch.fails = loop.failures
                poke(progress_w)
                wait_and_drain(wake_r, loop.retry_pause_s())
                continue
            # ...without announcing idleness, so a steady stream of puts costs producers no
            # wake-up each (RocketMQ's reput thread naps 1 ms the same way); only a longer
            # quiet spell goes to the sleep a put must interrupt.
            if time.monotonic() - last_work < NAP_PERIOD_S:
                time.sleep(nap_s)
                continue
            self._idle(wake_r)

    def _map_new_segments(self) -> None:
        segs = self.view.commit_log.segments
        if not segs.segments or segs.segments[-1].end <= self.channels.append.confirmed:
            if segs.refresh():
                for seg in segs.segments:  # bounded by the confirmed end, not by positions
                    seg.wrote = seg.size

    def _flush_files_if_due(self, next_flush: float) -> float:
        """Once a second: the files dispatch derives (``derived_flush``); returns when
        next."""
        now = self.scheduler.monotonic()
        if now < next_flush:
            return next_flush
        self.flush_derived()
        self.scheduler.ran("derived_flush", now)
        return now + FLUSH_INTERVAL_S

    def _publish(self, progress_w) -> None:
        """A batch went in: publish the position, wake long polls, clear a failure."""
        ch, dispatched = self.ch, self.loop.dispatched
        if dispatched > ch.dispatched:
            ch.dispatched = dispatched
            if self.wakeup is not None:  # after publishing: NOTE [ Long polling ]
                self.wakeup.notify()
        if ch.fails:
            ch.fails = 0
        poke(progress_w)

    def _idle(self, wake_r) -> None:
        """Idle handshake: announce, drain, re-check, sleep. A producer publishes the
        confirmed end before it reads the idle flag, so either it sees the flag and wakes us,
        or we see its new end here and do not sleep."""
        ch, channels = self.ch, self.channels
        ch.idle = 1
        wait_and_drain(wake_r, 0)
        if (channels.append.confirmed <= self.loop.dispatched
                and channels.cleanup.min_phys <= channels.cleanup.dropped):
            wait_and_drain(wake_r, IDLE_WAIT_S)
        ch.idle = 0


def _follow_cleanup(view, dispatchers, hooks, channel: shm.CleanupChannel, progress_w) -> None:
    """Step 2 of cleanup (``mqstore.runtime.cleanup``), then the acknowledgement."""
    min_phys = channel.min_phys
    if min_phys <= channel.dropped:
        return
    view.commit_log.segments.refresh(prune=True)  # let go of the deleted segments' maps
    cleanup.drop_derived(view, dispatchers, hooks, min_phys)
    channel.dropped = min_phys
    poke(progress_w)

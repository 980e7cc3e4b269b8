"""The dispatch loop as a worker process (spawned by the supervisor).

The worker maps the commit log read-only, owns the consume queues and the dispatchers' files
(key index, third-party index builders) and publishes its position in shared memory. It builds
its own plugin manager from the plugin names in the config, so third-party dispatchers and
``after_dispatch`` hooks run here. See NOTE [ Shutdown ] in ``supervisor``.
"""

from __future__ import annotations

import logging
import os
import threading
import time

from mqstore.config import StoreConfig, parse_delay_levels
from mqstore.dispatch import DispatchLoop, TagsCoder
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.hashing import string_hasher
from mqstore.message import StoredMessage
from mqstore.plugins_manager import PluginHooks, make_plugin_manager
from mqstore.recovery import RecoveryReport
from mqstore.storage.checkpoint import hold_worker_lock, read_meta
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.consume_queue import ConsumeQueue, load_consume_queues
from mqstore.storage.cq_ext import open_ext
from mqstore.storage.queue_manifest import ManifestKeeper
from mqstore.subscriptions import Subscriptions
from mqstore.uninterrupted import terminate_requested, worker_signals
from mqstore.workers import shm
from mqstore.workers.pipes import poke, wait_and_drain

log = logging.getLogger("mqstore.workers.dispatch")
IDLE_WAIT_S = 0.05  # wait between checks for stop / parent death while idle
NAP_PERIOD_S = 0.05  # after its last work the worker naps dispatch.interval_ms at a time...
FLUSH_INTERVAL_S = 1.0  # consume queues are forced to disk this often, as RocketMQ does


class _SharedCheckpoint:
    """The checkpoint fields dispatch owns, kept in shared memory for the store to persist."""

    def __init__(self, positions: shm.SharedPositions) -> None:
        self._p = positions

    logics_msg_timestamp = property(lambda self: self._p[shm.LOGICS_TS],
                                    lambda self, v: self._p.__setitem__(shm.LOGICS_TS, v))
    index_msg_timestamp = property(lambda self: self._p[shm.INDEX_TS],
                                   lambda self, v: self._p.__setitem__(shm.INDEX_TS, v))


class WorkerHost:
    """What dispatchers see of "the store" inside the worker process."""

    read_only = False
    dispatch_role = "writer"

    def __init__(self, root: str, config: StoreConfig, positions: shm.SharedPositions,
                 abnormal: bool) -> None:
        self.root = root
        self.config = config
        self.positions = positions
        meta = read_meta(root) or {}
        self.hash_kind = meta.get("hash", "java")
        self.string_hash = string_hasher(self.hash_kind)
        self.checkpoint = _SharedCheckpoint(positions)
        self.recovery_report = RecoveryReport(abnormal=abnormal)
        # The store process recorded the sizes in mqstore.json before starting this worker.
        self.commit_log = CommitLog(os.path.join(root, "commitlog"), None, read_only=True,
                                    known_bytes=meta.get("commit_log_segment_bytes"))
        self.commit_log.load()
        self._cq_bytes = meta.get("consume_queue_file_bytes") or round_file_bytes(
            config.consume_queue.file_units * CQ_UNIT_SIZE)
        self._cq_lock = threading.Lock()
        self.consume_queues = load_consume_queues(
            root, self._cq_bytes, read_only=False,
            known_bytes=meta.get("consume_queue_file_bytes"))
        self.consume_queue_exts: dict = {}
        self.subscriptions = Subscriptions(root)
        self.manifest = ManifestKeeper(root)

    @staticmethod
    def clock() -> int:
        return time.time_ns() // 1_000_000

    def consume_queue(self, topic: str, queue_id: int, create: bool = False):
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        if cq is None and create:
            cq = self.consume_queues[key] = ConsumeQueue(self.root, topic, queue_id, self._cq_bytes)
            self.manifest.mark()
        return cq

    def consume_queue_ext(self, topic: str, queue_id: int, create: bool = False):
        key = (topic, queue_id)
        ext = self.consume_queue_exts.get(key)
        if ext is None:
            ext = open_ext(self.root, topic, queue_id, self.config.consume_queue.ext_file_bytes,
                           read_only=False, create=create)
            if ext is not None:
                self.consume_queue_exts[key] = ext
        return ext

    def message_at(self, phys_offset: int):
        head = self.commit_log.read(phys_offset, 4)
        size = int.from_bytes(head, "big", signed=True) if head is not None else 0
        raw = self.commit_log.read(phys_offset, size) if size > 0 else None
        try:
            return StoredMessage.from_bytes(bytes(raw)) if raw is not None else None
        except ValueError:
            return None


def _after_dispatch(host, hook):
    """New queues go into the manifest as soon as their first units are written."""
    def after(batch) -> None:
        host.manifest.write_marked(host.consume_queues)
        hook(batch)
    return after


def run(root: str, config: StoreConfig, positions_name: str, wake_r, progress_w,
        parent_pid: int, restarted: bool) -> None:
    """Worker entry point (``multiprocessing`` target)."""
    worker_signals()
    lock_fd = hold_worker_lock(root)
    positions = shm.SharedPositions(positions_name)
    try:
        os.set_blocking(progress_w.fileno(), False)
        _run(root, config, positions, wake_r, progress_w, parent_pid, restarted)
    finally:
        positions.close()
        os.close(lock_fd)


def _run(root, config, positions, wake_r, progress_w, parent_pid, restarted) -> None:
    host = WorkerHost(root, config, positions, abnormal=restarted or bool(positions[shm.ABNORMAL]))
    dispatched = positions[shm.DISPATCHED]
    for cq in host.consume_queues.values():
        cq.recover()  # loaded files count as full until their units are checked
        if restarted:  # a killed predecessor may have left units past its published position
            cq.truncate_to_phys(dispatched)
    hooks = PluginHooks(make_plugin_manager(
        modules=config.plugins.modules, disable=config.plugins.disable,
        load_entry_points=config.plugins.load_entry_points))
    dispatchers = [d for d in (f(host) for _n, f in hooks.dispatchers.items()) if d is not None]
    resume = [d.resume_offset() for d in dispatchers if hasattr(d, "resume_offset")]
    start = max(min([dispatched, *resume]), 0)
    loop = DispatchLoop(host.commit_log, dispatchers,
                        TagsCoder(host.string_hash, parse_delay_levels(config.store.message_delay_levels)),
                        lambda: positions[shm.CONFIRMED], start,
                        batch_bytes=config.dispatch.batch_bytes,
                        after_dispatch=_after_dispatch(host, hooks.after_dispatch))
    min_phys = positions[shm.MIN_PHYS]
    manifest = host.manifest
    next_flush = time.monotonic() + FLUSH_INTERVAL_S
    nap_s = config.dispatch.interval_ms / 1000.0
    last_work = time.monotonic()
    try:
        while not positions[shm.STOP] and not terminate_requested():
            if os.getppid() != parent_pid:
                log.error("store process %d is gone; dispatch worker exits", parent_pid)
                return
            segs = host.commit_log.segments
            if not segs.segments or segs.segments[-1].end <= positions[shm.CONFIRMED]:
                if segs.refresh():
                    for seg in segs.segments:  # bounded by CONFIRMED, not by positions
                        seg.wrote = seg.size
            now = time.monotonic()
            if now >= next_flush:
                next_flush = now + FLUSH_INTERVAL_S
                for cq in list(host.consume_queues.values()):
                    cq.flush()
                manifest.update(host.consume_queues)
            if positions[shm.MIN_PHYS] > min_phys:
                min_phys = positions[shm.MIN_PHYS]
                for d in dispatchers:
                    if hasattr(d, "after_cleanup"):
                        d.after_cleanup(min_phys)
            if loop.run_once():
                if loop.dispatched > positions[shm.DISPATCHED]:
                    positions[shm.DISPATCHED] = loop.dispatched
                if positions[shm.DISPATCH_FAILS]:
                    positions[shm.DISPATCH_FAILS] = 0
                poke(progress_w)
                last_work = time.monotonic()
                continue
            if loop.error:
                raise RuntimeError(loop.error)
            if loop.failing is not None:
                # The store refuses puts while this is set (they would never become readable).
                positions.set_note(shm.DISPATCH_NOTE, loop.failing)
                positions[shm.DISPATCH_FAILS] = loop.failures
                poke(progress_w)
                wait_and_drain(wake_r, loop.retry_pause_s())
                continue
            # ...without announcing idleness, so a steady stream of puts costs producers no
            # wake-up each (RocketMQ's reput thread naps 1 ms the same way); only a longer
            # quiet spell goes to the sleep a put must interrupt.
            if time.monotonic() - last_work < NAP_PERIOD_S:
                time.sleep(nap_s)
                continue
            # Idle handshake: announce, drain, re-check, sleep. A producer publishes CONFIRMED
            # before it reads DISPATCH_IDLE, so either it sees the flag and wakes us, or we see
            # its new CONFIRMED here and do not sleep.
            positions[shm.DISPATCH_IDLE] = 1
            wait_and_drain(wake_r, 0)
            if positions[shm.CONFIRMED] <= loop.dispatched:
                wait_and_drain(wake_r, IDLE_WAIT_S)
            positions[shm.DISPATCH_IDLE] = 0
    finally:
        for cq in host.consume_queues.values():
            cq.flush()
        manifest.update(host.consume_queues, final=True)
        for ext in host.consume_queue_exts.values():
            ext.flush()
            ext.close()
        for d in dispatchers:
            d.close()
        poke(progress_w)

"""Opening a store directory: files, recovery, the parts and the loops, in that order.

Recovery (commit log, then consume queues) runs here, before any loop exists; its re-dispatch
is the dispatch loop's job (``Runtime.start``), and the open waits for it.
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace

from mqstore.append.appender import Appender, ReadOnlyAppender
from mqstore.append.settings import AppendSettings, PutStrategies
from mqstore.append.tail import AppendTail
from mqstore.plugin_api.contracts import FOLLOWER, READER, STAGING_WRITER, WRITER
from mqstore.dispatch.dispatchers import Dispatchers
from mqstore.format.cq_unit import CQ_UNIT_SIZE, round_file_bytes
from mqstore.format.hosts import parse_host
from mqstore.plugin_api.manager import build_hooks
from mqstore.append.pool_writer import MapWriter, TransientPoolWriter, salvage_pool
from mqstore.read.pull import PullLimits
from mqstore.read.reader import Reader
from mqstore.lifecycle import offset_floor
from mqstore.lifecycle.recovery import RecoveryReport, durable_end, mend_range, recover
from mqstore.lifecycle.rejoin import apply_cut
from mqstore.config import StoreConfig
from mqstore.errors import ConfigError, CorruptStateError
from mqstore.mirror.replica_state import read_state
from mqstore.replication import Replication, slave_acks
from mqstore.roles import RoleState
from mqstore.running_flags import NOT_WRITEABLE, StoreState
from mqstore.runtime.loops import Runtime
from mqstore.runtime.schedule import ScheduleService
from mqstore.runtime.timers import Timers
from mqstore.config import parse_delay_levels
from mqstore.scheduler import Scheduler, system_scheduler
from mqstore.storage import clean_marker
from mqstore.storage import store_id as ids
from mqstore.storage.abort_file import abort_exists, create_abort
from mqstore.storage.checkpoint import Checkpoint
from mqstore.storage.commit_log import CommitLog
from mqstore.storage.consume_queue import load_consume_queues
from mqstore.storage.epoch_file import EpochFile
from mqstore.storage.mapped_budget import MappedBudget
from mqstore.storage.queue_floor import offsets_without_message
from mqstore.storage.queue_manifest import ManifestKeeper, read_entries
from mqstore.storage.queue_progress import read_queued, remove_queued
from mqstore.storage.role_file import read_role
from mqstore.storage.shared_segment import path_segment_name, store_segment_name, unlink_segment
from mqstore.storage.store_lock import StoreLock
from mqstore.lifecycle.parts import StoreParts
from mqstore.lifecycle.store_meta import load_meta, settle_meta, settle_record_crc
from mqstore.view.directory_view import DirectoryView
from mqstore.runtime.workers import shm

log = logging.getLogger(__name__)

COMMIT_LOG_DIR = "commitlog"
DEFAULT_PHYSICAL_MEMORY = 24 << 30  # RocketMQ's fallback when total RAM is unknown


def _physical_memory() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return DEFAULT_PHYSICAL_MEMORY


class Opener:
    """Opens a store directory: files, recovery, the parts, the loops; returns the parts
    (``StoreParts``). A failed open leaves the directory as it found it: no threads, no
    workers, no lock."""

    def __init__(self, state: StoreState, config: StoreConfig, clock,
                 scheduler: Scheduler = system_scheduler) -> None:
        """``state``: the open/closed state and flags the store's parts share."""
        self.state = state
        self.root = state.root
        self.config = config
        self.clock = clock
        self.parts = StoreParts(config, clock, scheduler)
        self.channels: shm.Channels | None = None  # a writer's shared positions, once made

    def open(self) -> StoreParts:
        parts, state = self.parts, self.state
        # The one plugin manager of this open, and the names the config picks among its
        # plugins checked, before anything touches the directory.
        parts.hooks = build_hooks(self.config)
        if state.read_only:
            if not os.path.isdir(self.root):
                raise FileNotFoundError(f"store directory {self.root!r} does not exist")
        else:
            os.makedirs(self.root, exist_ok=True)
            parts.lock = StoreLock(self.root)
            parts.lock.acquire()
        try:
            if not state.read_only:
                _refuse_an_unpromoted_slave(self.root, self.config)
            self._files()
            self._recover()
            self._parts()
            if not state.read_only:
                self._start()
        except BaseException as exc:
            if parts.runtime is not None:
                parts.runtime.abort_start()
            elif self.channels is not None:
                self.channels.close()  # the runtime that would own them was never built
            parts.release_files()
            parts.unlock()
            _note_recovery(exc, parts.recovery_report)
            raise
        state.closed = False
        return parts

    def _files(self) -> None:
        """Commit log, consume queues and the store's recorded settings."""
        parts, config, ro = self.parts, self.config, self.state.read_only
        # Taken (for writing: removed, durably) before any file changes, so a crash from here
        # on never finds a marker describing files this open went on to change.
        self.marker, self.marker_problem = clean_marker.take(self.root, remove=not ro)
        meta, meta_problem = load_meta(self.root)
        # Sizes the store was written with win over the configured ones, which apply to new
        # stores; a read-only store with no segment yet learns the size from the first one.
        parts.commit_log = CommitLog(os.path.join(self.root, COMMIT_LOG_DIR),
                                     None if ro else config.commit_log.segment_bytes,
                                     read_only=ro, on_warning=log.warning,
                                     known_bytes=meta.get("commit_log_segment_bytes"))
        self.notes = notes = parts.commit_log.load()
        identity = None
        if not ro:
            # A killed store leaves its shared memory behind: its transient pool may hold
            # acknowledged records its files lack (see NOTE [ Shutdown ]); reclaim both.
            store_id, moved = ids.claim(self.root, meta)
            if moved:
                notes.append(moved)
            notes += salvage_pool(self.root, store_id, parts.commit_log.segments)
            if store_id:
                unlink_segment(store_segment_name(store_id, shm.POSITIONS_SEGMENT))
            unlink_segment(path_segment_name(self.root, shm.POSITIONS_SEGMENT))
            identity = ids.settled(self.root, store_id)
        cq_bytes = meta.get("consume_queue_file_bytes") or round_file_bytes(
            config.consume_queue.file_units * CQ_UNIT_SIZE)
        self.mapped = MappedBudget(config.consume_queue.max_mapped_files)
        self.queues = load_consume_queues(
            self.root, cq_bytes, read_only=ro, on_warning=log.warning, notes=notes,
            known_bytes=meta.get("consume_queue_file_bytes"), budget=self.mapped)
        self.meta = settle_meta(self.root, meta, meta_problem, commit_log=parts.commit_log,
                                consume_queues=self.queues.values(),
                                configured_hash=config.store.hash,
                                configured_cq_bytes=cq_bytes, read_only=ro, notes=notes,
                                hash_explicit="hash" in config.store.model_fields_set,
                                identity=identity)
        parts.hash_kind = self.meta["hash"]
        if self.meta.get("record_crc_since") is not None:
            # What the store's writers recorded, for recovery to hold records to; settled
            # again (and bounded for a reader) once the log's end is known.
            parts.commit_log.crc_range = (self.meta["record_crc_since"], 1 << 62)
        parts.checkpoint = Checkpoint(self.root, read_only=ro)
        # The role a run-time promotion or demotion recorded wins over store.role.
        self.role_record, self.role_problem = (None, None) if ro else read_role(self.root)
        if self.role_problem:
            notes.append(self.role_problem)
        parts.epochs = EpochFile(self.root, read_only=ro)
        if parts.epochs.problem:
            notes.append(parts.epochs.problem)

    def _recover(self) -> None:
        parts, ro = self.parts, self.state.read_only
        self.abnormal = abort_exists(self.root)
        entries, manifest_problem = read_entries(self.root)
        self.manifest = ManifestKeeper(self.root, entries)
        if manifest_problem:
            self.notes.append(manifest_problem)
        self.cut = self._rejoin()
        if self.cut:  # NOTE [ Rejoining ]: the cut lowered the manifest's entries
            entries = dict(self.manifest.recorded)
        known_queues = {key: (first, end) for key, (first, end, _phys) in entries.items()}
        queued, queued_problem = read_queued(self.root)
        if queued_problem:
            self.notes.append(f"{queued_problem}; ignored")
        # NOTE [ Offset floors ]: what the store recorded of each queue's end, raised by
        # recovery to what the queues held before it cut any unit.
        self.durable = durable_end(parts.checkpoint, self.abnormal)
        floors = offset_floor.recorded(entries, self.marker, self.durable)
        report: RecoveryReport = recover(
            parts.commit_log, list(self.queues.values()), parts.checkpoint,
            abnormal=self.abnormal, check_crc=self.config.commit_log.check_crc_on_recover,
            read_only=ro, known_queues=known_queues, marker=self._usable_marker(),
            queued=queued, floors=floors,
            hold=None if ro else lambda: self._settle_floors(floors, write=True))
        report.notes[:0] = self.notes
        parts.recovery_report = report
        # What each queue holds now: units the open's dispatch writes from here on are
        # rebuilt ones (and the offsets they find without a message are reported).
        self.recovered = {key: cq.max_offset for key, cq in self.queues.items()}
        self.holding = False
        if not ro:
            self._floors(floors, report)
            # After a cut the index files name records past the log's end: the dispatch worker
            # must take that end before anything is appended (NOTE [ Rejoining ]).
            self.holding = self.holding or self.cut
        if not ro and queued is not None and report.redispatch_from < queued.phys_offset:
            remove_queued(self.root)  # units rebuilt below it are not on disk yet
        if not ro:
            # A slave's records are its master's, with or without the record CRC as the
            # master wrote them: none can be required to carry it.
            record_crc = (self.config.commit_log.record_crc
                          and self.starting_role != "slave")
            self.meta = settle_record_crc(self.root, self.meta, record_crc,
                                          parts.commit_log.max_offset)
        since = self.meta.get("record_crc_since")
        parts.commit_log.crc_range = None if since is None else (
            since, parts.commit_log.max_offset if ro else 1 << 62)
        if not parts.commit_log.segments.segments:
            self.queues.clear()
        if not ro:
            # What recovery kept or mended is on disk before anything new is acknowledged.
            for seg in parts.commit_log.segments.segments:
                if seg.end > report.scan_from:
                    seg.force()
            parts.checkpoint.confirm_phy_offset = parts.commit_log.max_offset
            parts.checkpoint.note_appended(parts.commit_log.max_offset)

    @property
    def starting_role(self) -> str:
        """The role this open starts in: the recorded one (``role.json``), else
        ``store.role``."""
        record = getattr(self, "role_record", None)
        return record.role if record is not None else self.config.store.role

    def _rejoin(self) -> bool:
        """A cut ``role.json`` names, applied before recovery (NOTE [ Rejoining ])."""
        record = self.role_record
        if self.state.read_only or record is None or record.cut is None:
            return False
        cut = record.cut
        report = apply_cut(self.root, self.parts.commit_log, self.queues,
                           self.parts.checkpoint, self.manifest, self.parts.epochs, record)
        self.role_record = replace(record, cut=None)
        self.marker = None  # it describes the files before the cut
        self.notes.append(
            f"rejoined master {cut.master} (epoch {cut.epoch}): the commit log was cut at "
            f"{cut.at}; [{report['from']}, {report['to']}) ({report['bytes']} bytes, "
            f"{report['records']} records) kept in quarantine/{report['file']}, reported in "
            f"quarantine/{report['file']}.json; state files set aside in "
            f"{report['set_aside']['directory']}")
        log.warning("rejoin: %s", self.notes[-1])
        return True

    def _role(self) -> RoleState:
        """The role this store starts in (``mqstore.roles``)."""
        config, record = self.config, self.role_record
        role = self.starting_role
        master = record.master if record is not None else config.server.ha_master
        fenced = None
        if role != "slave":
            if self.role_problem:
                fenced = (f"the recorded role cannot be trusted ({self.role_problem}): puts "
                          f"are refused until `mqstore role promote` or `demote` records one")
            elif config.server.ha_peers:
                fenced = ("the peers in server.ha_peers are not checked yet: a master takes "
                          "puts once replication has started and found no newer master")
        return RoleState(role, master=master, epoch=self.parts.epochs.last_epoch, fenced=fenced)

    def _floors(self, floors: dict, report: RecoveryReport) -> None:
        """Add what committed consumer offsets show (up to what the lost bytes could have
        held) and settle the floors into the manifest when a queue is below one, for the
        writer of the consume queues (NOTE [ Offset floors ])."""
        if not self.parts.commit_log.segments.segments:
            self.manifest.settle({})  # the store starts over: no queue, no floor
            return
        lost = offset_floor.lost_bytes(report, self.parts.checkpoint, self.marker)
        if lost:
            claims, problem = offset_floor.claimed(self.root)
            if problem:
                report.notes.append(problem)
            if any(end > max(floors.get(key, 0), self.recovered.get(key, 0))
                   for key, end in claims.items()):
                # What dispatch will give the queues back: the records it reads again.
                held = offset_floor.queue_ends(self.parts.commit_log, min(
                    report.scan_from, report.redispatch_from), report.commit_log_end)
                for key, end in self.recovered.items():
                    held[key] = max(held.get(key, 0), end)
                report.notes += offset_floor.add_claims(floors, claims, held, lost)
        self.holding = any(floor > self.recovered.get(key, 0) for key, floor in floors.items())
        self._settle_floors(floors, write=self.holding, held=self.recovered)

    def _settle_floors(self, floors: dict, *, write: bool, held: dict | None = None) -> None:
        """Raise the manifest's entries to the floors (durably) when ``write``; and when a
        queue holds less (by ``held``) than its entry says and that end lies past the durable
        end (a torn tail's, never acknowledged), lower the entry: the writer of the queues
        would give it fillers."""
        keeper = self.manifest
        settled = dict(keeper.recorded)
        lowered = False
        for key in keeper.recorded.keys() | floors.keys():
            first, end, phys = keeper.recorded.get(key, (-1, 0, -1))
            floor = floors.get(key, 0)
            if held is not None and phys > self.durable and end > held.get(key, 0):
                lowered = True
            elif floor <= end:
                continue
            if first < 0 and key in self.queues:
                found = self.queues[key].first_phys()
                first = -1 if found is None else found
            settled[key] = (first, max(floor, (held or {}).get(key, 0)), -1)
        if write or lowered:
            keeper.settle(settled)

    def _usable_marker(self) -> dict | None:
        """The clean-shutdown marker, unless what it cannot know rules it out already."""
        why = self.marker_problem
        if self.marker is not None:
            if self.abnormal:
                why = "the abort file is there (the last exit was not clean)"
            elif self.config.index.enabled and not self.marker["index"]["active"]:
                why = "the key index was not active when the store closed"
            else:
                return self.marker
        if why is not None:
            self.notes.append(f"clean-shutdown marker {clean_marker.MARKER_FILE} not trusted: "
                              f"{why}; full recovery")
        return None

    def _parts(self) -> None:
        """What appends leave, the view, the dispatchers of this process's role, the shared
        positions of a writer, the reader."""
        parts, config, ro = self.parts, self.config, self.state.read_only
        in_process = not ro and config.dispatch.worker == "thread"
        # Where the log ends now, and (from the re-dispatch on) each queue's next offset.
        self.tail = AppendTail(parts.commit_log.max_offset,
                               parts.checkpoint.physic_msg_timestamp)
        parts.view = view = DirectoryView(
            self.root, config, clock=self.clock, hash_kind=parts.hash_kind,
            commit_log=parts.commit_log, checkpoint=parts.checkpoint,
            recovery_report=parts.recovery_report,
            cq_file_bytes=self.meta["consume_queue_file_bytes"], consume_queues=self.queues,
            filters=parts.hooks.filters, writes_queues=in_process, manifest=self.manifest,
            known_queues=self.tail.queue_offsets, mapped=self.mapped)
        parts.store_host = parse_host(config.store.store_host)
        role = parts.role = self._role()
        self.role = READER if ro else (WRITER if in_process else FOLLOWER)
        parts.dispatchers = Dispatchers(parts.hooks.dispatchers, view, self.role)
        memory = (config.get.physical_memory_bytes if config.get.physical_memory_bytes is not None
                  else _physical_memory())
        check = config.get.offset_check_in_slave
        limits = PullLimits(config.get, memory, lambda: role.is_slave and not check)
        if not ro:
            self.channels = shm.Channels.create(
                store_segment_name(self.meta[ids.ID_KEY], shm.POSITIONS_SEGMENT))
        parts.reader = Reader(self.state, view, limits, parts.dispatchers,
                              self._follow_limit())
        parts.appender = ReadOnlyAppender(self.state)
        if ro:
            self.state.running_flags |= NOT_WRITEABLE

    def _follow_limit(self):
        """How far this process's consume-queue views may advance (None: it writes them):
        a reader follows the log's tail, a follower what the dispatch worker published."""
        if self.state.read_only:
            return self.parts.commit_log.follow_tail
        if self.role == FOLLOWER:
            assert self.channels is not None
            return lambda ch=self.channels.dispatch: ch.dispatched
        return lambda: None

    def _start(self) -> None:
        """Writer, selector, flush policy, the loops; recovery's re-dispatch first."""
        parts, config, hooks = self.parts, self.config, self.parts.hooks
        assert self.channels is not None
        factory = hooks.writers.get(config.writer.kind)
        if factory is STAGING_WRITER:
            # As RocketMQ's transient pool, a master's only: a slave's copies are readable
            # (and acknowledged) once copied.
            factory = MapWriter if self.starting_role == "slave" else TransientPoolWriter
        runtime = parts.runtime = Runtime(
            state=self.state, config=config, view=parts.view, dispatchers=parts.dispatchers,
            hooks=hooks, writer_factory=factory,
            flush_factory=hooks.flush_policies.get(config.flush.policy),
            channels=self.channels, tail=self.tail, store_lock=parts.lock, clock=self.clock,
            manifest=self.manifest, store_id=self.meta[ids.ID_KEY], scheduler=parts.scheduler)
        acks = slave_acks(config, parts.role)
        selector = hooks.queue_selectors.get(config.queue_select.selector)(
            config, parts.view.string_hash)
        parts.appender = Appender(
            state=self.state, commit_log=parts.commit_log, writer=runtime.writer,
            settings=AppendSettings.of(config, parts.store_host),
            strategies=PutStrategies(selector, runtime.flush_policy, hooks, acks),
            loops=runtime, tail=self.tail, topics=parts.view.topics, clock=self.clock,
            role=parts.role)
        parts.replication = Replication(self.root, config, parts.commit_log, parts.appender,
                                        acks, parts.role, parts.epochs)
        report = parts.recovery_report
        commit_log = parts.commit_log
        start = max(min([report.redispatch_from, *parts.dispatchers.resume_offsets()]),
                    commit_log.min_offset)
        if start < report.scan_from:
            mend_range(commit_log, start, report.scan_from,
                       check_crc=config.commit_log.check_crc_on_recover, read_only=False,
                       report=report)
        start = _outside_quarantine(start, report)
        create_abort(self.root)
        report.redispatch_bytes, report.redispatch_seconds = runtime.start(
            start, report.abnormal, report.trusted_end, hold=self.holding)
        self.tail.queue_offsets.update(self._queue_offsets())
        self._report_lost_offsets(report)
        if (not parts.role.is_slave and not parts.epochs.entries
                and not self.config.coordination.etcd_endpoints):
            # A master's first epoch (RocketMQ's changeToMaster): from its log's end on. Under
            # coordination its first election gives it one (``store.roles``).
            parts.epochs.append(1, commit_log.max_offset)
            parts.role.change(epoch=1)
        self._declare_topics()  # once every queue recovery re-dispatched is known
        parts.schedule = ScheduleService(
            root=self.root, reader=parts.reader, commit_log=commit_log,
            appender=parts.appender, put_ctx=parts.appender.put_ctx,
            delays_ms=parse_delay_levels(config.store.message_delay_levels), clock=self.clock,
            role=parts.role, dispatched=runtime.dispatched,
            timers=Timers(self.root, parts.reader, commit_log, parts.appender.put_ctx,
                          config.store.timer_precision_ms,
                          config.store.timer_max_delay_sec * 1000))  # started once open

    def _declare_topics(self) -> None:
        """The topics the deployment declares (``topics.declare``), made as declared in
        ``config/topics.json``. A damaged file is reported and left alone: the store opens,
        and its puts are refused naming the file until it is repaired (a full disk: the
        store opens, and the next open declares them)."""
        try:
            changes = self.parts.view.topics.declare(self.config.topics.declare)
        except (CorruptStateError, OSError) as exc:
            self.parts.recovery_report.notes.append(f"declared topics not applied: {exc}")
            log.error("declared topics not applied: %s", exc)
            return
        for line in changes:
            log.info("topics.declare: %s", line)

    def _report_lost_offsets(self, report: RecoveryReport) -> None:
        """The offsets the open's dispatch left without a message, in queues it rebuilt or
        gave fillers (NOTE [ Offset floors ])."""
        if report.trusted_end >= 0 and not self.holding:
            return  # nothing was rebuilt
        reader = self.parts.reader
        for key in sorted(self.parts.view.consume_queues):
            cq = reader.queue(*key)
            begin = self.recovered.get(key, 0)
            if cq is None or cq.max_offset <= begin:
                continue
            runs = offsets_without_message(cq, begin, after_first=key not in self.recovered)
            if runs:
                report.queue_offsets_lost[f"{key[0]}/{key[1]}"] = runs

    def _queue_offsets(self) -> dict:
        """Each queue's next offset, now that dispatch has caught up; queues also stop
        offering units below the first stored record."""
        reader, parts = self.parts.reader, self.parts
        reader.discover_queues()
        offsets = {}
        min_phys = parts.commit_log.min_offset
        for key in list(parts.view.consume_queues):
            cq = reader.queue(*key)
            cq.correct_min_offset(min_phys)
            offsets[key] = cq.max_offset
        return offsets


def _outside_quarantine(start: int, report: RecoveryReport) -> int:
    """Where dispatch may start: a dispatcher may resume at a record this recovery has just
    quarantined (the key index at its last entry's record), and the middle of a quarantine
    record is no record at all; the region's start is."""
    for q in report.quarantined:
        if q.offset < start < q.offset + q.length:
            return q.offset
    return start


def _note_recovery(exc: BaseException, report: RecoveryReport | None) -> None:
    """An open that fails after its recovery changed the files says what it changed: the
    next open finds them mended and has nothing left to report."""
    if report is None or report.clean:
        return
    done = [f"quarantined [{q.offset}, {q.offset + q.length}) ({q.reason})"
            + (f", the original bytes in {q.saved_to}" if q.saved_to else "")
            for q in report.quarantined]
    done += [f"recreated {path}" for path in report.recreated_segments]
    if report.truncated_bytes:
        done.append(f"cut {report.truncated_bytes} bytes at {report.commit_log_end}")
    done += [f"cut {n} unit(s) of {queue}"
             for queue, n in sorted(report.consume_queue_units_dropped.items())]
    if done:
        exc.add_note("the open had recovered the store before it failed: " + "; ".join(done))


def _refuse_an_unpromoted_slave(root: str, config: StoreConfig) -> None:
    """ConfigError when a slave's directory is opened as a master by ``store.role`` alone:
    it would take puts in its master's epoch (a returning master would not learn it was
    replaced) on its own consumer state, not the master's it holds in its state mirror, so
    every group would receive again what it had acknowledged. Nothing is changed."""
    if config.store.role == "slave" or read_role(root)[0] is not None:
        return
    if read_state(root)[0].get("complete") is None:
        return
    raise ConfigError(
        f"store {root!r} is a slave's directory (its state mirror, replica/, holds a "
        f"complete snapshot of its master's state), but store.role is "
        f"{config.store.role!r}: opened as a master by the configuration alone it would keep "
        f"its master's epoch and serve its own consumer offsets, pop state and topics "
        f"(every group would receive again what it had acknowledged). Promote it instead: "
        f"`mqstore role promote --server HOST:PORT` while it runs, or `mqstore role promote "
        f"-c CONFIG {root}` while it is stopped, then start it; or set store.role: slave")

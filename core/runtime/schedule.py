"""The schedule: RocketMQ 4.x's ``ScheduleMessageService`` (and RocketMQ 5's timers,
``runtime.timers``), a thread of the writer process.

Each delay level is one queue of ``SCHEDULE_TOPIC_XXXX`` (``format.schedule``), in the order
its messages are due (a level's delay is fixed, and store times never go backwards). Every
tick the thread reads each level's queue from its progress on, takes the messages due by the
store clock (never one before its deliver time: the tags code), writes their copies to their
real topics in one put (``Appender.put_copies``), and then records the new progress in
``config/delayOffset.json`` (``storage.delay_offsets``), which the state mirror ships to
slaves. A deliver time further ahead than its level's delay (the clock went back) is due now,
as RocketMQ corrects it. A schedule record naming no real topic is passed over and logged, as
RocketMQ drops it; a put refused is tried again at the next tick.

It runs on a master only: a slave's schedule is its master's (the copies come through the
log), and a promoted slave's runs once the parts are rebuilt on the installed mirror.

NOTE [ Exactly-once delivery ]
~~~~~~~~~~~~~~~~~~~~~~~~~~~~~~
RocketMQ persists its progress every 10 s, so a broker killed meanwhile delivers again what it
delivered since. mqstore records the progress after every put of copies, and a kill between
the put and the record is repaired at the next start: ``delayOffset.json`` carries
``mqstoreCountedBelow``, the log's end when it was written, below which every copy is counted.
At start the thread reads the records from there to the end of the log, and each copy it finds
(a record of a real topic whose properties carry the ``DELAY``, ``REAL_TOPIC`` and ``REAL_QID``
of its own topic and queue) that is the copy of the next message of its level (same
properties, body CRC and born time) advances that level. Copies of one level are put in queue
order and a put is all or nothing, so the count is exact: nothing is delivered twice, and
nothing is lost (the progress never passes a message whose copy is not in the log). A file
without the key (a RocketMQ broker's) is trusted as it is. While nothing is due the bound is
moved up to the log's end every ``IDLE_PERSIST_S``, so a start reads little; a file without
the bound (none yet, or a RocketMQ broker's) gets one before the first put of copies.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

import numpy as np

from mqstore.append.delays import NotACopy, copy_of
from mqstore.append.encoding import Rejected
from mqstore.format.delay_offsets import DelayOffsets
from mqstore.format.properties import PROPERTY_DELAY, decode_properties, find_property
from mqstore.format.record import SCAN_BLANK, SCAN_OK, scan_record
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.schedule import (
    PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, SCHEDULE_TOPIC, level_of_queue, queue_of_level,
)
from mqstore import log_limit
from mqstore.runtime.ticking import MasterTicker
from mqstore.runtime.timers import Timers
from mqstore.storage.delay_offsets import read_delay_offsets, write_delay_offsets

log = logging.getLogger(__name__)
# What repeats every tick while it lasts (a refused put, a damaged file): one line a minute.
log_limit.limit(log, level=logging.WARNING)

TICK_S = 0.1  # RocketMQ's DELAY_FOR_A_WHILE: how often a level with nothing due looks again
RETRY_S = 1.0  # after a refused put or a failure
IDLE_PERSIST_S = 10.0  # RocketMQ's flushDelayOffsetInterval
MAX_PER_LEVEL = 1024  # copies of one level per put
SCAN_SPAN = 4 << 20
_DELAY = PROPERTY_DELAY.encode()


class ScheduleService:
    """Delivers due delayed messages of one writable store (see the module docstring)."""

    def __init__(self, *, root: str, reader, commit_log, appender, put_ctx,
                 delays_ms: list[int], clock: Callable[[], int], role,
                 dispatched: Callable[[], int], timers: Timers) -> None:
        """``timers``: RocketMQ 5's timers, delivered by this thread too."""
        self.root = root
        self.reader = reader
        self.commit_log = commit_log
        self.appender = appender
        self.put_ctx = put_ctx
        self.delays_ms = list(delays_ms)
        self.clock = clock
        self.role = role
        self.dispatched = dispatched
        self.timers = timers
        self.table: dict[int, int] = {}
        self.extra: dict = {}
        self.counted_below = 0
        self.recovered = False
        self.delivered = 0
        self.recovered_copies = 0
        self.ticks = 0  # ticks run to their end (a test waits for one past a clock change)
        self._bounded = False  # the file on disk has mqstore's bound
        self._recover_end: int | None = None
        self._persisted_at = time.monotonic()
        self._ticker = MasterTicker(
            "mqstore-schedule", lambda: self.run_once() >= MAX_PER_LEVEL, role=role,
            on_slave=self._on_slave, log=log, what=f"schedule of {root}", tick_s=TICK_S,
            retry_s=RETRY_S)

    # -- the thread ---------------------------------------------------------------------------
    def start(self) -> None:
        self._ticker.start()

    def stop(self) -> None:
        """End the thread; its progress is on disk after every put already."""
        self._ticker.stop()

    def _on_slave(self) -> None:
        self.recovered = False  # a master again reads the file anew

    # -- one tick -----------------------------------------------------------------------------
    def run_once(self) -> int:
        """Deliver what is due now; the most copies of one level put (0: none)."""
        if not self.recovered:
            if not self.recover():
                return 0
        now = self.clock()
        copies, advanced, most = [], {}, 0
        queues = self.reader.queue_ids(SCHEDULE_TOPIC)  # one directory listing a tick
        for level in [level_of_queue(q) for q in queues if q < len(self.delays_ms)]:
            took, nxt = self._due(level, now, copies)
            if nxt != self.table.get(level, 0):
                advanced[level] = nxt
            most = max(most, took)
        levels = len(copies)
        self.timers.take_in()
        taken = self.timers.take_due(now, MAX_PER_LEVEL, copies)
        most = max(most, len(taken))
        if copies:
            if not self._bounded and levels:  # a kill after the put must find where to look
                self._persist()
            if not self.timers.bounded and len(taken):
                self.timers.persist(self.appender.last_append[0])
            result = self.appender.put_copies(copies)
            if not result.status.stored:
                log.warning("schedule of %s: delivering %d message(s) refused (%s: %s); "
                            "trying again", self.root, len(copies), result.status.value,
                            result.error)
                self._ticker.pause(RETRY_S)
                return 0
            self.delivered += levels
        if len(taken):
            self.timers.delivered_now(taken, now)
            self.timers.persist(self.appender.last_append[0])
        if advanced:
            self.table.update(advanced)
            self._persist()
        elif time.monotonic() - self._persisted_at >= IDLE_PERSIST_S:
            self._persisted_at = time.monotonic()
            if self.commit_log.max_offset > self.counted_below and self._has_schedule():
                self._persist()
            if self.timers.in_use():
                self.timers.persist(self.appender.last_append[0])
        self.ticks += 1
        return most

    def _due(self, level: int, now: int, copies: list) -> tuple[int, int]:
        """Append the copies of the messages of ``level`` due at ``now``; returns how many
        and the level's next offset."""
        offset = self.table.get(level, 0)
        batch = self.reader.read(SCHEDULE_TOPIC, queue_of_level(level), offset,
                                 MAX_PER_LEVEL)
        if batch is None:
            return 0, offset
        if not len(batch):
            # An offset below what the queue still holds moves up to it (RocketMQ's
            # correction); one past its end stays.
            nxt = batch.next_begin_offset
            return 0, nxt if offset < batch.min_offset and nxt > offset else offset
        codes = batch.tags_codes
        due = (codes <= now) | (codes > now + self.delays_ms[level - 1])
        waiting = np.flatnonzero(~due)
        took = int(waiting[0]) if len(waiting) else len(codes)
        for i in range(took):
            try:
                copies.append(copy_of(batch.message(i), self.put_ctx))
            except (NotACopy, Rejected, LookupError, ValueError) as exc:
                log.error("schedule of %s: level %d offset %d dropped: %s", self.root, level,
                          int(batch.queue_offsets[i]), exc)
        if took < len(codes):
            return took, int(batch.queue_offsets[took])
        return took, int(batch.next_begin_offset)

    def _persist(self) -> None:
        self.counted_below = max(self.counted_below, self.appender.last_append[0])
        write_delay_offsets(self.root, DelayOffsets(dict(self.table), self.counted_below,
                                                    self.extra))
        self._persisted_at = time.monotonic()
        self._bounded = True

    def _has_schedule(self) -> bool:
        return bool(self.table) or bool(self.reader.queue_ids(SCHEDULE_TOPIC))

    # -- recovery (NOTE [ Exactly-once delivery ]) ------------------------------------------------
    def recover(self) -> bool:
        """Read the progress and count the copies past its bound; False while dispatch has
        not yet reached the log's end (the schedule's own queues must be whole)."""
        if self._recover_end is None:  # the log's end when this run began: copies of this
            self._recover_end = self.commit_log.max_offset  # run can only come after it
        end = self._recover_end
        if self.dispatched() < end:
            return False
        self._recover_end = None
        doc = read_delay_offsets(self.root) or DelayOffsets()
        self.table, self.extra = dict(doc.table), dict(doc.extra)
        found = 0
        if doc.counted_below is not None:
            found = self._count_copies(max(doc.counted_below, self.commit_log.min_offset), end)
        self.counted_below = end if doc.counted_below is not None or found else 0
        self._bounded = doc.counted_below is not None  # else written before the first put
        self.timers.recover(lambda start: _records(
            self.commit_log, max(start, self.commit_log.min_offset), end))
        self.recovered = True
        self.recovered_copies = found + self.timers.recovered
        if found:
            log.warning("schedule of %s: %d delivered message(s) were not yet counted in "
                        "%s (the writer stopped between delivering and recording); counted "
                        "now, not delivered again", self.root, found, "delayOffset.json")
            self._persist()
        return True

    def _count_copies(self, start: int, end: int) -> int:
        found = 0
        for head in _records(self.commit_log, start, end):
            if head.topic == SCHEDULE_TOPIC or find_property(head.properties, _DELAY) is None:
                continue
            level = self._copy_level(head)
            matched = self._matched(level, head) if level else None
            if matched is not None:
                self.table[level] = matched + 1
                found += 1
        return found

    def _copy_level(self, head) -> int:
        """The level whose copy ``head`` may be, or 0."""
        props = _props(head.properties)
        if (props.get(PROPERTY_REAL_TOPIC) != head.topic
                or props.get(PROPERTY_REAL_QID) != str(head.queue_id)):
            return 0
        text = props.get(PROPERTY_DELAY, "")
        if not text.isdecimal() or not 0 < int(text) <= len(self.delays_ms):
            return 0
        return int(text)

    def _matched(self, level: int, head) -> int | None:
        """The queue offset of the next undelivered message of ``level`` when ``head`` is its
        copy (messages the schedule drops, naming no real topic, passed over), else None."""
        copy = self.reader.message_at(head.phys_offset)
        offset = self.table.get(level, 0)
        for _ in range(MAX_PER_LEVEL):
            batch = self.reader.read(SCHEDULE_TOPIC, queue_of_level(level), offset, 1)
            if copy is None or batch is None or not len(batch):
                return None
            source = batch.message(0)
            try:
                copy_of(source, self.put_ctx)
            except (Rejected, ValueError):  # NotACopy among them
                offset = int(batch.next_begin_offset)  # dropped by the run that stopped
                continue
            same = (copy.body_crc == source.body_crc
                    and copy.born_timestamp == source.born_timestamp
                    and _without_crc(copy.properties) == _without_crc(source.properties))
            return int(batch.queue_offsets[0]) if same else None
        return None

    # -- what /metrics and stats show ---------------------------------------------------------
    def status(self) -> dict:
        """``running`` (recovered, on a master), the number of ``levels``, each level's next
        ``offsets`` and ``pending`` messages (levels with some), copies ``delivered`` and ``recovered`` (found uncounted at
        start), ``ticks`` run."""
        return {"running": self.recovered, "levels": len(self.delays_ms),
                "offsets": dict(self.table),
                "pending": self.pending() if self.recovered else {},
                "timers_pending": self.timers.pending() if self.recovered else 0,
                "delivered": self.delivered + self.timers.delivered,
                "recovered": self.recovered_copies, "ticks": self.ticks}

    def pending(self) -> dict[int, int]:
        """Each level's messages not yet delivered."""
        out = {}
        for queue_id in self.reader.queue_ids(SCHEDULE_TOPIC):
            level = level_of_queue(queue_id)
            behind = self.reader.max_offset(SCHEDULE_TOPIC, queue_id) - self.table.get(level, 0)
            if behind > 0:
                out[level] = behind
        return out


def _props(block: bytes) -> dict[str, str]:
    return decode_properties(block.decode("utf-8", "replace"))


def _without_crc(props: dict) -> dict:
    return {k: v for k, v in props.items() if k != PROPERTY_CRC32}


def _records(commit_log, start: int, end: int):
    """The heads of the intact records in ``[start, end)``."""
    pos = start
    while pos < end:
        span = commit_log.read_span(pos, min(SCAN_SPAN, end - pos))
        if not span:
            return
        at = 0
        while at < len(span):
            kind, size, head = scan_record(span, at, len(span), False)
            if kind == SCAN_OK:
                yield head
                at += size
            elif kind == SCAN_BLANK:
                at = len(span)
                seg = commit_log.segments.find(pos)
                pos = (seg.start + commit_log.segment_bytes) if seg is not None else end
                break
            else:
                break  # cut at the span's end: read again from this record
        else:
            pos += at
            continue
        if kind != SCAN_BLANK:
            if at == 0:
                return  # a record that is not one: recovery has dealt with damage already
            pos += at

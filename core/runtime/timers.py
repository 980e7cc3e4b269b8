"""RocketMQ 5's timers for the schedule thread (``runtime.schedule``): messages of
``rmq_sys_wheel_timer`` delivered to their real topics at their time.

RocketMQ 5's ``TimerMessageStore`` reads the timer topic's queue into a timer log (52 bytes a
message) and a wheel of one slot a second over a week (16 bytes a slot, about 10 MB), both
files, and moves its read pointer over the wheel. mqstore keeps the same index in memory, as
two arrays (due time, commit-log offset: 16 bytes a pending message), filled from the timer
queue as dispatch writes it, and one small progress file (``format.timer_progress``): how far
the queue was taken in, and the time up to which everything due was delivered. A start reads
the queue back from the last units that can still be pending (stored at most
``store.timer_max_delay_sec`` before that time), so the arrays are rebuilt, not stored: nothing
derived can disagree with the log.

A message is due at the end of its ``TIMER_OUT_MS`` step (``TIMER_OUT_MS`` + the precision):
never before the time asked for, at most one step after it. RocketMQ delivers a wheel slot
when its read pointer passes the slot's start, up to a step early.

Exactly once, as the delay levels (NOTE [ Exactly-once delivery ] in ``runtime.schedule``):
the progress carries ``countedBelow``; at start the copies found past it (records of a real
topic carrying ``TIMER_OUT_MS`` and ``REAL_TOPIC``/``REAL_QID`` of their own topic and queue)
cancel the pending messages they are copies of (same properties, body CRC, born time).
"""

from __future__ import annotations

import logging
from collections import Counter

import numpy as np

from mqstore.append.delays import NotACopy, copy_of
from mqstore.append.encoding import Rejected
from mqstore.format.properties import decode_properties, find_property
from mqstore.format.record import unpack_record
from mqstore.format.record_crc import PROPERTY_CRC32
from mqstore.format.schedule import (
    PROPERTY_REAL_QID, PROPERTY_REAL_TOPIC, PROPERTY_TIMER_OUT_MS, TIMER_TOPIC,
)
from mqstore.format.timer_progress import TimerProgress
from mqstore.storage.timer_progress import read_timer_progress, write_timer_progress

log = logging.getLogger(__name__)
READ_UNITS = 4096  # timer-queue units taken in per look
_EMPTY = np.empty(0, dtype=np.int64)
_OUT = PROPERTY_TIMER_OUT_MS.encode()


class Timers:
    """The pending timed messages of one store, in memory; their progress on disk."""

    def __init__(self, root: str, reader, commit_log, put_ctx, precision_ms: int,
                 max_delay_ms: int) -> None:
        self.root = root
        self.reader = reader
        self.commit_log = commit_log
        self.put_ctx = put_ctx
        self.precision_ms = precision_ms
        self.max_delay_ms = max_delay_ms
        self.due = _EMPTY
        self.phys = _EMPTY
        self.read_time = 0
        self.queue_offset = 0
        self.bounded = False
        self.delivered = 0
        self.recovered = 0  # copies found uncounted at start
        self._cancelled = 0

    # -- start ------------------------------------------------------------------------------
    def recover(self, scan) -> None:
        """Rebuild the index from the progress file and the timer queue; ``scan(start)``:
        the records (``RecordHead``s) from commit-log offset ``start`` to the log's end, of
        which the timers' copies cancel their sources."""
        progress = read_timer_progress(self.root) or TimerProgress()
        self.read_time, taken = progress.read_time_ms, progress.queue_offset
        self.bounded = progress.counted_below is not None
        cancel: Counter = Counter()
        if self.bounded:
            cancel.update(self._copy_key(h) for h in scan(progress.counted_below)
                          if h.topic != TIMER_TOPIC)
            cancel.pop(None, None)
        start = 0
        if self.read_time:
            start = min(taken, self.reader.offset_by_time(
                TIMER_TOPIC, 0, self.read_time - self.max_delay_ms - self.precision_ms))
        self.due, self.phys, self.queue_offset = _EMPTY, _EMPTY, start
        self._cancelled = 0
        while self._take_in(cancel, taken):
            pass
        self.recovered = self._cancelled
        self.queue_offset = max(self.queue_offset, taken)

    def _copy_key(self, head):
        props = decode_properties(head.properties.decode("utf-8", "replace"))
        if (PROPERTY_TIMER_OUT_MS not in props or props.get(PROPERTY_REAL_TOPIC) != head.topic
                or props.get(PROPERTY_REAL_QID) != str(head.queue_id)):
            return None
        copy = self.reader.message_at(head.phys_offset)
        return None if copy is None else _key(copy)

    # -- taking in new units ------------------------------------------------------------------
    def take_in(self) -> int:
        """Index the timer-queue units dispatch wrote since the last look; how many."""
        if not self.queue_offset and not self.reader.queue_ids(TIMER_TOPIC):
            return 0  # no timed message yet: no read of a queue that is not there
        return self._take_in(None, 0)

    def _take_in(self, cancel: Counter | None, taken: int) -> int:
        batch = self.reader.read(TIMER_TOPIC, 0, self.queue_offset, READ_UNITS)
        if batch is None or not len(batch):
            if batch is not None and batch.next_begin_offset > self.queue_offset and \
                    self.queue_offset < batch.min_offset:
                self.queue_offset = batch.next_begin_offset
            return 0
        due, phys = [], []
        read = self.commit_log.read
        for i, (at, size) in enumerate(zip(batch.phys_offsets.tolist(), batch.sizes.tolist())):
            out = _timer_out(read(at, size))
            if out is None:
                log.error("timers of %s: %s offset %d has no TIMER_OUT_MS: passed over",
                          self.root, TIMER_TOPIC, int(batch.queue_offsets[i]))
                continue
            when = out + self.precision_ms
            offset = int(batch.queue_offsets[i])
            if cancel is not None:
                if offset < taken and when <= self.read_time:
                    continue  # delivered before the progress was recorded
                key = _key(batch.message(i))
                if cancel[key] > 0:  # delivered, not yet recorded (a kill)
                    cancel[key] -= 1
                    self._cancelled += 1
                    continue
            due.append(when)
            phys.append(int(batch.phys_offsets[i]))
        self.due = np.concatenate((self.due, np.asarray(due, dtype=np.int64)))
        self.phys = np.concatenate((self.phys, np.asarray(phys, dtype=np.int64)))
        self.queue_offset = int(batch.next_begin_offset)
        return len(batch)

    # -- delivering ---------------------------------------------------------------------------
    def take_due(self, now: int, most: int, copies: list) -> np.ndarray:
        """Append the copies of up to ``most`` messages due at ``now`` (earliest first);
        returns their positions in the index, for ``delivered``."""
        due = np.flatnonzero(self.due <= now)
        if len(due) > most:
            due = due[np.argsort(self.due[due], kind="stable")[:most]]
        for i in due.tolist():
            msg = self.reader.message_at(int(self.phys[i]))
            try:
                if msg is None:
                    raise LookupError(f"no record at commit-log offset {int(self.phys[i])}")
                copies.append(copy_of(msg, self.put_ctx))
            except (NotACopy, Rejected, LookupError, ValueError) as exc:
                log.error("timers of %s: a timed message dropped: %s", self.root, exc)
        return due

    def delivered_now(self, taken: np.ndarray, now: int) -> None:
        """``taken`` (positions ``take_due`` gave) were delivered: out of the index, and the
        read time moved up to where everything due is delivered."""
        keep = np.ones(len(self.due), dtype=bool)
        keep[taken] = False
        self.delivered += len(taken)
        self.due, self.phys = self.due[keep], self.phys[keep]
        left = self.due[self.due <= now]
        self.read_time = max(self.read_time, int(left.min()) - 1 if len(left) else now)

    def persist(self, counted_below: int) -> None:
        write_timer_progress(self.root, TimerProgress(self.read_time, self.queue_offset,
                                                      counted_below))
        self.bounded = True

    def pending(self) -> int:
        return len(self.due) + max(0, self.reader.max_offset(TIMER_TOPIC, 0)
                                   - self.queue_offset)

    def in_use(self) -> bool:
        return self.queue_offset > 0 or bool(self.reader.queue_ids(TIMER_TOPIC))


def _timer_out(raw) -> int | None:
    """``TIMER_OUT_MS`` of the record ``raw`` (checked bytes from a pull), or None."""
    if raw is None:
        return None
    try:
        lay = unpack_record(raw)
    except ValueError:
        return None
    value = find_property(bytes(raw[lay.props_at:lay.props_at + lay.props_len]), _OUT)
    if value is None or not value.isdigit():
        return None
    return int(value)


def _key(msg) -> tuple:
    props = tuple(sorted((k, v) for k, v in msg.properties.items() if k != PROPERTY_CRC32))
    return msg.born_timestamp, msg.body_crc, props

"""``Appender.put``: one message, one record, prepared, written and answered without the
columns, arrays, lists and callbacks a batch needs (``Appender._put``'s ``kind`` for it).
The same records, queue offsets and answers as a batch of that one message."""

from __future__ import annotations

import numpy as np

from mqstore.append import delays, encoding, transactions
from mqstore.append.placement import Refused
from mqstore.format.schedule import SCHEDULE_TOPIC
from mqstore.format.transaction import HALF_TOPIC
from mqstore.message import BatchPutResult, Message, PutResult, PutStatus
from mqstore.storage.commit_log import BlockTooLargeError
from mqstore.storage.transient_pool import PoolExhaustedError
from mqstore.uninterrupted import shield

_KEPT_AS_PUT = (SCHEDULE_TOPIC, HALF_TOPIC)  # a record of these put as one stays as put


class Single:
    """``put``: one message, one record; no columns and no arrays unless a hook wants them."""

    many = False

    @staticmethod
    def refused(status: PutStatus, reason: str) -> PutResult:
        return PutResult(status, error=reason)

    @staticmethod
    def hook_messages(message: Message) -> list[Message]:
        return [message]

    @staticmethod
    def prepare(app: Appender, message: Message):
        p = encoding.prepare(message, app.put_ctx)
        app._check_fits(p.size, None)  # before any topic is created
        counts = app._write_queues_of(p.topic, p.queue_id)
        queues = app.queues_per_topic if counts is None else counts
        if p.queue_id is None:
            p.queue_id = encoding.check_queue_id(app.selector.select(message, queues))
            if counts is not None and p.queue_id >= queues:
                raise app._chosen_wrongly(p.topic, p.queue_id, queues, None)
        if message.properties and p.topic not in _KEPT_AS_PUT and (
                transactions.is_half_message(message)):  # docs/transactions.md
            p = transactions.to_half(p, message, app.put_ctx)  # PREPARED or not
            app._check_fits(p.size, None)
        elif p.queued and (p.delay or message.properties) and p.topic != SCHEDULE_TOPIC:
            p = Single.scheduled(app, p, message)  # a schedule record put as one stays
        return p

    @staticmethod
    def scheduled(app: Appender, p, message: Message):
        """A delayed or timed message as its record in the schedule's topic (docs/delays.md)."""
        settings = app.settings
        if p.delay and settings.max_delay_level:
            p = delays.to_schedule(p, message, app.put_ctx, settings.max_delay_level)
        elif delays.is_timed_message(message):
            p = delays.to_timer(p, message, app.put_ctx, app.clock(),
                                settings.timer_max_delay_ms, settings.timer_precision_ms)
        else:
            return p
        app._check_fits(p.size, None)
        return p

    @staticmethod
    def rejected(rej: encoding.Rejected) -> tuple[BatchPutResult, PutResult]:
        return (BatchPutResult.rejected(rej.status, rej.reason, 0),
                PutResult(rej.status, error=rej.reason))

    @staticmethod
    def append(app: Appender, p) -> tuple[int, tuple[int, int, int]]:
        """The record's end, and ``(queue offset, commit-log offset, store time)``."""
        written = _write_one(app, p)
        return written[1] + p.size, written

    @staticmethod
    def answer(app: Appender, p, written: tuple[int, int, int], status: PutStatus) -> PutResult:
        qoff, phys, now = written
        queue_id = p.queue_id if p.answer_queue_id is None else p.answer_queue_id
        return PutResult(status, queue_id, qoff, phys, p.size,
                         f"{app.msg_id_prefix}{phys:016X}", now)

    @staticmethod
    def hook_result(app: Appender, r: PutResult) -> BatchPutResult:
        return BatchPutResult(r.status, np.array([r.queue_id]), np.array([r.queue_offset]),
                              np.array([r.phys_offset]), np.array([r.size]),
                              r.store_timestamp, app.store_host)


def _write_one(app: Appender, p) -> tuple[int, int, int]:
    """``Appender._append`` for one record (the plan ``p``): the same steps without the
    lists, blocks and callbacks a batch needs. Returns ``(queue offset, commit-log offset,
    store time)``."""
    log = app.commit_log
    writer = app.writer
    shield.enter()  # NOTE [ Uninterrupted puts ]
    try:
        with app.lock:
            now = app.store_time_in_lock()
            try:
                key = (p.topic, p.queue_id) if p.queued else None
                base = app.queue_offsets.get(key, 0) if p.queued else 0
                try:
                    seg = log.reserve_locked(p.size, writer)
                except (OSError, BlockTooLargeError, PoolExhaustedError) as exc:
                    raise Refused(str(exc)) from None
                phys = seg.start + seg.wrote
                try:
                    record = encoding.encode_single(p, app.store_host, p.queue_id, base,
                                                    phys, now, app.put_ctx.record_crc)
                except BaseException:
                    log.abandon_locked([seg], writer)
                    raise
                # From here on only copies and assignments: nothing can fail half way.
                writer.write(seg, record)
                if key is not None:
                    app.queue_offsets[key] = base + 1
                app._appended_messages += 1
                app._appended_bytes += p.size
                end = seg.start + seg.wrote
                tail = app.tail
                tail.end, tail.store_ts = end, now
            finally:
                app.begin_in_lock = 0
        app.appended(end)
    finally:
        shield.leave()
    return base, phys, now


__all__ = ["Single"]

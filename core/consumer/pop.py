"""The pop consumer: RocketMQ 5's SimpleConsumer model, independent of any transport.

``pop`` hands out up to ``max_msgs`` messages (and, with ``max_bytes``, no more bytes of records
than that, the first message whatever its size) of a topic, taken from all its queues in turn (as
RocketMQ's broker pops: each queue fills what room is left, the first queue rotating from pop
to pop, so every queue leads in turn), each invisible to other pops for
``invisible_ms`` and carrying a receipt handle. ``ack(handle)`` ends a delivery, and
``ack([handle, ...])`` ends many in one step, with one result per handle;
``change_invisible_duration(handle, ms)`` moves its deadline and hands out a new handle (the
old one goes stale). A message not acknowledged by its deadline is delivered again, first in
the next pop, with ``delivery_attempt`` + 1 and a new handle. Deadlines are on the store clock.

A handle stays good until its delivery ends: acknowledged, delivered again, or given a new
invisible time. One that is over raises ``StaleReceiptHandleError`` (saying why); one this
store never handed out, ``ReceiptHandleError`` (RocketMQ's INVALID_RECEIPT_HANDLE). The format
is in ``receipt_handles``.

State: NOTE [ Pop journal ] (``pop_journal``): each pop, ack batch and change is one record
appended under a short exclusive flock to the topic and group's journal, which a checkpoint
compacts now and then; so it survives restarts and SIGKILL (a message is delivered again only
if it was not acknowledged, never lost), and pops from several processes never hand out one
message twice while it is in flight. A queue new to a pop group starts at the group's
committed offset (``config/consumerOffset.json``) when it has one, else by ``consume_from``.

Attempts: a message is delivered at most the group's ``retryMaxTimes`` + 1 times
(``consumer.group_configs``); when its invisible time passes after the last of them, the next
pop sends it to ``%DLQ%<group>`` (``consumer.dead_letters``) instead of delivering it again.

NOTE [ Dead-lettering exactly once ]
    A dead letter is a put to the commit log and a change of the pop state, two files that
    cannot change in one step. Under the journal's exclusive flock, in this order:
      1. a ``DEAD`` record naming the message and the commit log's end before the put;
      2. the dead letter's put (``Appender.put_copies``);
      3. a ``DONE`` record ending the message's delivery.
    Killed before 1, the message is still in flight and due: the next pop starts over. Killed
    after 1, the state keeps the message in flight, marked ``DEAD`` (the journal, and the
    checkpoint's ``dead`` map when compacted): the next pop, before writing, looks in the log
    from the recorded end for the group's dead letter of that message (``DeadLetters.find``:
    its ``DLQ_ORIGIN_TOPIC`` and ``DLQ_ORIGIN_MESSAGE_ID``), and writes it only if it is not
    there, then ``DONE``. The log is read, not the DLQ's consume queue, which may lag the put.
    So each message is either still pending or in the DLQ once. Only a store that can write
    dead-letters; a read-only one leaves exhausted messages in flight for the writer.

Descriptors: each topic and group's journal holds two (journal and lock) while open, and a
process keeps at most ``consumer.max_open_pop_states`` of them open, the least recently used
released first (``PopJournal.release``: the next use reopens and reloads, re-checking the
journal's inode), never one in use. When the process runs out of descriptors all the others are
released and the call is tried once more before the error goes to the caller.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import threading
import time
from collections import OrderedDict

from mqstore.append.encoding import Rejected
from mqstore.consumer import fifo, names
from mqstore.consumer.errors import ReceiptHandleError, StaleReceiptHandleError
from mqstore.consumer.messages import ConsumedMessage
from mqstore.consumer.pop_journal import PopJournal
from mqstore.consumer.receipt_handles import make_handle, parse_handle
from mqstore.consumer.dead_letters import message_id
from mqstore.format.pop_record import DEAD, DONE, INFLIGHT, NEXT
from mqstore import log_limit
from mqstore.message import GetStatus

__all__ = ["PoppedMessage", "PopConsumer", "make_handle", "parse_handle", "POP_CONSUME_FROM"]

MAX_WAIT_SLICE_S = 1.0  # deadlines are on the store clock: look again at least this often
_NOTHING_NEW = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)
POP_CONSUME_FROM = (names.FIRST, names.LAST, names.MAX)
_EMPTY: dict = {}
_DUE_ROUNDS = 8  # looks past dead-lettered messages for ones to deliver again, per pop
_DEAD_BATCH = 256  # due messages one look takes, so exhausted ones go in batches
log = logging.getLogger(__name__)
log_limit.limit(log, level=logging.WARNING)  # a store refusing writes fails every pop


class PoppedMessage(ConsumedMessage):
    """A popped message: a ``ConsumedMessage`` with its ``receipt_handle``,
    ``delivery_attempt`` (1 on the first delivery) and ``invisible_until_ms`` (store clock)."""

    __slots__ = ("receipt_handle", "delivery_attempt", "invisible_until_ms")

    def __init__(self, topic, queue_id, batch, row, handle, attempt, until) -> None:
        super().__init__(topic, queue_id, batch, row)
        self.receipt_handle = handle
        self.delivery_attempt = attempt
        self.invisible_until_ms = until


_OUT_OF_DESCRIPTORS = (errno.EMFILE, errno.ENFILE)


def _out_of_descriptors(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in _OUT_OF_DESCRIPTORS


class PopConsumer:
    def __init__(self, service) -> None:
        self._service = service
        self._max_open = service.config.max_open_pop_states
        self._journals: OrderedDict = OrderedDict()  # (topic, group) -> PopJournal, LRU first
        self._users: dict = {}  # (topic, group) -> calls using its journal now
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _using(self, topic: str, group: str):
        """The journal of ``topic`` and ``group``, kept open (not released) while in use."""
        key = (topic, group)
        with self._lock:
            journal = self._journals.get(key)
            if journal is None:
                journal = self._journals[key] = PopJournal(
                    self._service.root, topic, group, fsync=self._service.config.commit_fsync)
            else:
                self._journals.move_to_end(key)
            self._users[key] = self._users.get(key, 0) + 1
            idle = self._idle(len(self._journals) - self._max_open)
        for other in idle:
            other.release()
        try:
            yield journal
        finally:
            with self._lock:
                users = self._users.pop(key) - 1
                if users:
                    self._users[key] = users

    def _idle(self, count: int) -> list:
        """Take up to ``count`` journals nobody uses out of the table, least recent first
        (the lock held); the caller releases them."""
        out = []
        for key in list(self._journals):
            if len(out) >= count:
                break
            if key not in self._users:
                out.append(self._journals.pop(key))
        return out

    def _retrying(self, call, *args):
        """``call(*args)``; when the process is out of descriptors, release every journal not
        in use and try once more (nothing was written: a failed open comes before any
        record)."""
        try:
            return call(*args)
        except OSError as exc:
            if not _out_of_descriptors(exc):
                raise
            with self._lock:
                idle = self._idle(len(self._journals))
            for journal in idle:
                journal.release()
            return call(*args)

    @property
    def open_states(self) -> int:
        """Topic and group states in the table now (each open one holds two descriptors)."""
        return len(self._journals)

    # -- pop ------------------------------------------------------------------------------
    def pop(self, group, topic, max_msgs, invisible_ms, *, expression=None,
            expression_type="TAG", wait_ms=0, consume_from=names.LAST,
            max_bytes=None) -> list[PoppedMessage]:
        names.check_group(group)
        names.check_topic(topic)
        names.check_int("max_msgs", max_msgs, 1)
        names.check_int("invisible_ms", invisible_ms, 0)
        if max_bytes is not None:
            names.check_int("max_bytes", max_bytes, 1)
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or not wait_ms >= 0:
            raise ValueError(f"wait_ms {wait_ms!r} must be a number >= 0")
        if consume_from not in POP_CONSUME_FROM:
            raise ValueError(f"consume_from {consume_from!r} must be one of "
                             f"{', '.join(map(repr, POP_CONSUME_FROM))} for pops")
        store = self._service.store
        if expression is not None:
            store.compile_filter(expression, expression_type)
        wakeup = self._service.wakeup()
        deadline = time.monotonic() + wait_ms / 1000.0
        # A queue that appears while this pop waits starts at its first message, even for a
        # group starting "last": what was put there came after the pop began.
        queues = store.queue_ids(topic)
        existing = set(queues)
        while True:
            seen = wakeup.sequence()  # NOTE [ Long polling ]
            got, next_due_ms = self._retrying(
                self._pop_once, store, group, topic, queues, _Room(max_msgs, max_bytes),
                invisible_ms, expression, expression_type, consume_from, existing)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            slice_s = MAX_WAIT_SLICE_S if next_due_ms is None else max(
                0.001, min(MAX_WAIT_SLICE_S, (next_due_ms - store.clock()) / 1000.0))
            wakeup.wait(seen, min(left, slice_s))
            queues = store.queue_ids(topic)

    def _pop_once(self, store, group, topic, queues, room, invisible_ms, expression,
                  expression_type, consume_from, existing):
        with self._using(topic, group) as journal:
            return self._pop_with(journal, store, group, topic, queues, room, invisible_ms,
                                  expression, expression_type, consume_from, existing)

    def _pop_with(self, journal, store, group, topic, queues, room, invisible_ms,
                  expression, expression_type, consume_from, existing):
        picked: list = []  # (queue, batch, row, attempt, delivery, queue offset)
        with journal.changing() as state:
            now = store.clock()
            until = now + invisible_ms
            first_delivery = delivery = state.next_delivery(now)
            rows: list = []  # the record: format.pop_record.ENTRY tuples
            # Deliveries that ran out come back first, oldest deadline first (a FIFO group's
            # in queue order); those whose attempts are used up go to the dead-letter queue.
            config = self._service.group_configs.get(group)
            orderly = config.orderly
            taken, kept = self._due(journal, state, store, group, topic, now, room.msgs,
                                    config.max_attempts, orderly)
            try:
                for i, (q, o, attempt, old) in enumerate(taken):
                    batch = store.read(topic, q, o, 1, verify=True)
                    if batch is None:  # the store is not readable now: they wait
                        state.requeue(taken[i:])
                        taken = taken[:i]
                        break
                    if not len(batch) or int(batch.queue_offsets[0]) != o:
                        rows.append((DONE, q, o, 0, old, 0, 0))  # its record is gone
                        continue
                    if not room.take(int(batch.sizes[0])):  # past max_bytes: they wait
                        state.requeue(taken[i:])
                        taken = taken[:i]
                        break
                    rows.append((INFLIGHT, q, o, until, delivery, attempt + 1, 0))
                    picked.append((q, batch, 0, attempt + 1, delivery, o))
                    delivery += 1
                rotate = state.rotate
                if queues and not room.full:
                    first = rotate % len(queues)
                    rotate = first + 1
                    order = queues[first:] + queues[:first]
                    under_way = bool(state.next) or journal.has_history()
                    start = _Start(self._service, store, topic, group, consume_from,
                                   under_way, existing)
                    positions: dict = {}  # queue -> next offset, as this pop leaves it
                    # One read per queue that has messages: splitting a pop into shares of
                    # every queue costs a read's fixed cost per share.
                    for q in order:
                        if room.full:
                            break
                        if orderly and fifo.busy(state, q):  # NOTE [ FIFO groups ]
                            continue
                        delivery = self._take_new(
                            store, state, topic, group, q, room, until, delivery, picked,
                            rows, expression, expression_type, start, positions)
                    rows += [(NEXT, q, o, 0, 0, 0, 0) for q, o in positions.items()
                             if o != state.next.get(q)]
                if rows:
                    last = delivery - 1 if delivery > first_delivery else state.delivery
                    journal.append(rows, rotate, last)
                else:
                    state.rotate = rotate  # nothing to record: the rotation is a hint
            except BaseException:
                state.requeue(taken)
                raise
            finally:
                state.requeue(kept)
            next_due = None if picked else state.next_due()  # only a waiting pop needs it
        out = [PoppedMessage(topic, q, batch, row, make_handle(topic, group, q, o, attempt, d),
                             attempt, until)
               for q, batch, row, attempt, d, o in picked]
        return out, next_due

    def _due(self, journal, state, store, group, topic, now, limit, max_attempts,
             orderly=False):
        """Up to ``limit`` deliveries that ran out and may be delivered again, and those this
        process must leave in flight (to ``requeue`` once the pop is decided): the ones whose
        attempts are used up are dead-lettered here, or, in a process that cannot write
        (a read-only store), left for the writer. ``orderly``: a FIFO group's, in queue
        order, holding back those behind an older message still in flight (NOTE [ FIFO
        groups ])."""
        dead = self._service.store.dead_letters
        out: list = []
        kept: list = []
        chosen: set = set()  # FIFO: (queue, offset) in out
        size = limit  # the first look takes what the pop may hand out, as before attempts
        for _round in range(_DUE_ROUNDS):
            taken = state.take_due(now, size)
            if not taken:
                break
            spent = [t for t in taken if t[2] >= max_attempts or (t[0], t[1]) in state.dead]
            again = [t for t in taken if t[2] < max_attempts and (t[0], t[1]) not in state.dead]
            if spent:
                if dead is None:
                    kept += spent
                else:
                    kept += self._bury(journal, state, store, dead, group, topic, spent)
            held: list = []
            if orderly:  # after burying: a dead-lettered message no longer holds its queue
                again, held = fifo.in_order(state, again, chosen)
                kept += held
            room = limit - len(out)
            out += again[:room]
            kept += again[room:]  # beyond this pop's room: due still, for the next
            if not spent and not held:
                break  # what was due is taken: the pop's room is full or none is left
            if len(out) >= limit:
                break
            size = max(limit - len(out), _DEAD_BATCH)  # past exhausted ones, in batches
        if orderly:
            out.sort(key=lambda t: (t[0], t[1]))
        return out, kept

    @staticmethod
    def _bury(journal, state, store, dead, group, topic, items) -> list:
        """Dead-letter ``items`` (``(queue, offset, attempt, delivery)``, exclusive flock
        held) in one put: NOTE [ Dead-lettering exactly once ]. Returns those left in flight
        (their record could not be read or their dead letters written now: the next pop
        tries again)."""
        log_from = dead.log_end()
        begun = [(DEAD, q, o, log_from, d, 0, 0) for q, o, _a, d in items
                 if (q, o) not in state.dead]
        resumed = {(q, o): state.dead[(q, o)] for q, o, _a, _d in items if (q, o) in state.dead}
        if begun:
            journal.append(begun, state.rotate, state.delivery)
        done, left, burying = [], [], []  # burying: (item, stored)
        for item in items:
            q, o, _attempt, d = item
            batch = store.read(topic, q, o, 1, verify=True)
            if batch is None:
                left.append(item)
            elif not len(batch) or int(batch.queue_offsets[0]) != o:
                done.append((DONE, q, o, 0, d, 0, 0))  # its record is gone
            else:
                burying.append((item, batch.message(0)))
        try:
            if resumed:  # a crash may have come after their put: never a second one
                there = dead.found(group, topic, {message_id(m) for (q, o, _a, _d), m in burying
                                                  if (q, o) in resumed}, min(resumed.values()))
                burying, already = ([b for b in burying if message_id(b[1]) not in there],
                                    [b for b in burying if message_id(b[1]) in there])
                done += [(DONE, q, o, 0, d, 0, 0) for (q, o, _a, d), _m in already]
            if burying:
                dead.put_many(group, [(m, attempt) for (_q, _o, attempt, _d), m in burying])
            done += [(DONE, q, o, 0, d, 0, 0) for (q, o, _a, d), _m in burying]
        except (OSError, ValueError, Rejected) as exc:
            log.warning("dead-lettering %d message(s) of %s for group %s failed (%s); they "
                        "stay in flight and are tried again", len(burying), topic, group, exc)
            left += [item for item, _m in burying]
        if done:
            journal.append(done, state.rotate, state.delivery)
        return left

    def dead_letter(self, handle: str) -> None:
        """Send the message of ``handle`` (its current delivery) to the group's dead-letter
        queue now, ending its delivery (gRPC's ForwardMessageToDeadLetterQueue); raises as
        ``ack`` does for a handle that is not current, and OSError when this store cannot
        write it."""
        topic, group, q, offset, attempt, delivery = parse_handle(handle)
        dead = self._service.store.dead_letters
        if dead is None:
            raise OSError("this store is read-only: dead letters are written by the store's "
                          "writer")
        self._retrying(self._dead_letter, topic, group, handle, q, offset, attempt, delivery,
                       dead)

    def _dead_letter(self, topic, group, handle, q, offset, attempt, delivery, dead) -> None:
        with self._current(topic, group, handle, q, offset, attempt, delivery) as (journal, state):
            if self._bury(journal, state, self._service.store, dead, group, topic,
                          [(q, offset, attempt, delivery)]):
                raise OSError(f"the message of receipt handle {handle!r} could not be "
                              f"dead-lettered now; it stays in flight")

    @contextlib.contextmanager
    def _current(self, topic, group, handle, q, offset, attempt, delivery):
        """The journal and its state, changing (under the exclusive flock), when ``handle``
        names the current delivery of its message; else raises why it does not, as ``ack``."""
        with self._using(topic, group) as journal:
            if not journal.exists():
                raise _never_popped(handle, topic, group)
            with journal.changing() as state:
                error = _check(state, handle, q, offset, attempt, delivery, ())
                if error is not None:
                    raise error
                yield journal, state

    @staticmethod
    def _take_new(store, state, topic, group, q, room, until, delivery, picked, rows,
                  expression, expression_type, start, positions) -> int:
        """Pop never-popped messages of queue ``q`` while ``room`` lasts (from
        ``positions[q]``, which it moves on); returns the next delivery number."""
        offset = positions.get(q)
        if offset is None:
            offset = state.next.get(q)
            if offset is None:
                offset = start.offset(q)
        while not room.full:
            batch = store.read(topic, q, offset, room.msgs, expression=expression,
                               expression_type=expression_type, group=group,
                               max_total_bytes=room.bytes)
            if batch is None:
                break
            offsets, sizes = batch.queue_offsets.tolist(), batch.sizes.tolist()
            for row, o in enumerate(offsets):
                if not room.take(sizes[row]):  # past max_bytes: the rest stays for later
                    positions[q] = o
                    return delivery
                rows.append((INFLIGHT, q, o, until, delivery, 1, 0))
                picked.append((q, batch, row, 1, delivery, o))
                delivery += 1
            moved = batch.next_begin_offset
            if batch.status in _NOTHING_NEW or moved == offset:
                offset = moved
                break
            offset = moved
        positions[q] = offset
        return delivery

    # -- ack and change of invisible time -------------------------------------------------
    def ack(self, handles):
        """One handle: None, or raise why it cannot be acknowledged. A list (or tuple) of
        handles: one result per handle, in order: None (acknowledged) or the
        ``ReceiptHandleError`` saying why not."""
        if isinstance(handles, (list, tuple)):
            return self._ack_many(handles)
        error = self._ack_many([handles])[0]
        if error is not None:
            raise error
        return None

    def _ack_many(self, handles) -> list:
        results: list = [None] * len(handles)
        by_state: dict = {}
        for i, handle in enumerate(handles):
            try:
                parsed = parse_handle(handle)
            except ReceiptHandleError as exc:
                results[i] = exc
                continue
            by_state.setdefault(parsed[:2], []).append((i, handle, parsed[2:]))
        for (topic, group), items in by_state.items():
            self._retrying(self._ack_state, topic, group, items, results)
        return results

    def _ack_state(self, topic, group, items, results) -> None:
        """Acknowledge ``items`` of one topic and group in one record; results in place."""
        with self._using(topic, group) as journal:
            if not journal.exists():
                for i, handle, _ in items:
                    results[i] = _never_popped(handle, topic, group)
                return
            with journal.changing() as state:
                acked: set = set()
                done = []
                inflight = state.inflight
                for i, handle, (q, o, attempt, d) in items:
                    now = inflight.get(q, _EMPTY).get(o)
                    if now is None or now[2] != d or (q, o) in acked:  # not the current one
                        results[i] = _check(state, handle, q, o, attempt, d, acked)
                    else:
                        acked.add((q, o))
                        done.append((DONE, q, o, 0, d, 0, 0))
                if done:
                    journal.append(done, state.rotate, state.delivery)

    def change_invisible_duration(self, handle: str, invisible_ms: int) -> str:
        topic, group, q, offset, attempt, delivery = parse_handle(handle)
        names.check_int("invisible_ms", invisible_ms, 0)
        return self._retrying(self._change, topic, group, handle, q, offset, attempt, delivery,
                              invisible_ms)

    def _change(self, topic, group, handle, q, offset, attempt, delivery, invisible_ms) -> str:
        with self._current(topic, group, handle, q, offset, attempt, delivery) as (journal, state):
            now = self._service.store.clock()
            new = state.next_delivery(now)
            journal.append([(INFLIGHT, q, offset, now + invisible_ms, new, attempt, 0)],
                           state.rotate, new)
        return make_handle(topic, group, q, offset, attempt, new)

    # -- the state as a whole -------------------------------------------------------------
    def remove(self, topic: str, group: str) -> None:
        """Forget a group's pop state (its files go)."""
        with self._using(topic, group) as journal:
            journal.remove()

    def close(self) -> None:
        with self._lock:
            journals, self._journals = list(self._journals.values()), OrderedDict()
        for journal in journals:
            journal.close()


class _Room:
    """What a pop may still hand out: ``msgs`` messages and ``bytes`` bytes of records (None:
    no byte limit); the first message goes whatever its size."""

    __slots__ = ("msgs", "bytes", "taken")

    def __init__(self, msgs: int, max_bytes: int | None) -> None:
        self.msgs, self.bytes, self.taken = msgs, max_bytes, 0

    @property
    def full(self) -> bool:
        return self.msgs <= 0 or (self.bytes is not None and self.taken > 0 and self.bytes <= 0)

    def take(self, size: int) -> bool:
        """Count a message of ``size`` bytes in; False (nothing counted) when it does not
        fit."""
        if self.bytes is not None:
            if self.taken and size > self.bytes:
                return False
            self.bytes -= size
        self.msgs -= 1
        self.taken += 1
        return True


class _Start:
    """Where a queue new to the group starts (decided under the flock, so every process
    agrees): the group's committed offset there, else by ``consume_from``."""

    def __init__(self, service, store, topic, group, consume_from, under_way, existing):
        self._service, self._store = service, store
        self._topic, self._group = topic, group
        self._consume_from, self._under_way, self._existing = consume_from, under_way, existing
        self._committed = None

    def offset(self, q: int) -> int:
        if self._committed is None:
            self._committed = self._service.offsets.offsets(self._topic, self._group)
        if q in self._committed:
            return self._committed[q]
        store, topic = self._store, self._topic
        low = store.min_offset(topic, q)
        if (self._consume_from == names.FIRST or self._under_way
                or q not in self._existing):
            return low
        high = store.max_offset(topic, q)
        if self._consume_from == names.MAX:
            # RocketMQ 5's ConsumeInitMode.MAX with initPopOffsetByCheckMsgInMem: from the
            # start while the queue's first message is still stored, else its last message.
            return 0 if low == 0 else max(high - 1, low)
        return high


def _never_popped(handle, topic, group) -> ReceiptHandleError:
    return ReceiptHandleError(f"receipt handle {handle!r}: group {group!r} has popped nothing "
                              f"from topic {topic!r}")


def _check(state, handle, q, offset, attempt, delivery, acked):
    """None when the handle is the current delivery of its message, else the error saying
    why it is not."""
    nxt = state.next.get(q)
    if nxt is None or offset >= nxt:
        return ReceiptHandleError(f"receipt handle {handle!r}: queue {q} offset {offset} was "
                                  f"never popped by this group")
    now = state.inflight.get(q, {}).get(offset)
    if now is None or (q, offset) in acked:
        return StaleReceiptHandleError(f"receipt handle {handle!r} is stale: the message at "
                                       f"queue {q} offset {offset} was acknowledged")
    if now[2] != delivery:
        why = (f"was delivered again (attempt {now[0]})" if now[0] != attempt else
               "got a new invisible time, which handed out a new handle")
        return StaleReceiptHandleError(f"receipt handle {handle!r} is stale: the message at "
                                       f"queue {q} offset {offset} {why}")
    return None

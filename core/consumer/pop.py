"""The pop consumer: RocketMQ 5's SimpleConsumer model, independent of any transport.

``pop`` hands out up to ``max_msgs`` messages of a topic, taken from all its queues (a fair
share of each, the first queue rotating from pop to pop), each invisible to other pops for
``invisible_ms`` and carrying a receipt handle. ``ack(handle)`` ends a delivery;
``change_invisible_duration(handle, ms)`` moves its deadline and hands out a new handle (the
old one goes stale). A message not acknowledged by its deadline is delivered again, first in
the next pop, with ``delivery_attempt`` + 1 and a new handle. Deadlines are on the store clock.

A handle stays good until its delivery ends: acknowledged, delivered again, or given a new
invisible time. One that is over raises ``StaleReceiptHandleError`` (saying why); one this
store never handed out, ``ReceiptHandleError`` (RocketMQ's INVALID_RECEIPT_HANDLE). Handles are
``mq1:<topic>:<group>:<queue>:<offset>:<attempt>:<delivery>``, opaque to callers.

State: ``pop_state`` (one locked JSON file per topic and group, rewritten by every pop, ack and
change), so it survives restarts and SIGKILL: a message is delivered again only if it was not
acknowledged, never lost. A queue new to a pop group starts at the group's committed offset
(``config/consumerOffset.json``) when it has one, else by ``consume_from``: ``"first"``,
``"last"``, or ``"max"``, where RocketMQ 5's proxy starts a new group (``max_start``).
"""

from __future__ import annotations

import math
import os
import time

from mqstore.consumer import names
from mqstore.consumer.errors import ReceiptHandleError, StaleReceiptHandleError
from mqstore.consumer.messages import ConsumedMessage
from mqstore.consumer.pop_state import open_state
from mqstore.message import GetStatus

HANDLE_PREFIX = "mq1"
MAX_WAIT_SLICE_S = 1.0  # deadlines are on the store clock: look again at least this often
_NOTHING_NEW = (GetStatus.OFFSET_OVERFLOW_ONE, GetStatus.NO_MESSAGE_IN_QUEUE)


class PoppedMessage(ConsumedMessage):
    """A popped message: a ``ConsumedMessage`` with its ``receipt_handle``,
    ``delivery_attempt`` (1 on the first delivery) and ``invisible_until_ms`` (store clock)."""

    __slots__ = ("receipt_handle", "delivery_attempt", "invisible_until_ms")

    def __init__(self, topic, queue_id, batch, row, handle, attempt, until) -> None:
        super().__init__(topic, queue_id, batch, row)
        self.receipt_handle = handle
        self.delivery_attempt = attempt
        self.invisible_until_ms = until


def make_handle(topic, group, queue_id, offset, attempt, delivery) -> str:
    return f"{HANDLE_PREFIX}:{topic}:{group}:{queue_id}:{offset}:{attempt}:{delivery}"


def parse_handle(handle: object) -> tuple[str, str, int, int, int, int]:
    parts = handle.split(":") if isinstance(handle, str) else []
    try:
        if len(parts) != 7 or parts[0] != HANDLE_PREFIX:
            raise ValueError
        topic, group = names.check_topic(parts[1]), names.check_group(parts[2])
        q, offset, attempt, delivery = (int(p) for p in parts[3:])
        if min(q, offset, attempt, delivery) < 0:
            raise ValueError
    except ValueError:
        raise ReceiptHandleError(
            f"receipt handle {handle!r} is not one this store hands out (they read "
            f"{HANDLE_PREFIX}:<topic>:<group>:<queue>:<offset>:<attempt>:<delivery>)") from None
    return topic, group, q, offset, attempt, delivery


def max_start(store, topic: str, queue_id: int) -> int:
    """Where RocketMQ 5's proxy starts a queue new to a pop group (ConsumeInitMode.MAX with
    initPopOffsetByCheckMsgInMem): at 0 while the queue still holds its first message, else
    at its last message, so a consumer started after a producer gets what was sent."""
    low, high = store.min_offset(topic, queue_id), store.max_offset(topic, queue_id)
    return 0 if low == 0 else max(low, high - 1)


class PopConsumer:
    def __init__(self, service) -> None:
        self._service = service
        self._states: dict = {}

    def _state(self, topic: str, group: str):
        key = (topic, group)
        state = self._states.get(key)
        if state is None:
            state = self._states[key] = open_state(self._service.root, topic, group,
                                                   fsync=self._service.config.commit_fsync)
        return state

    # -- pop ------------------------------------------------------------------------------
    def pop(self, group, topic, max_msgs, invisible_ms, *, expression=None,
            expression_type="TAG", wait_ms=0, consume_from=names.LAST) -> list[PoppedMessage]:
        names.check_group(group)
        names.check_topic(topic)
        names.check_int("max_msgs", max_msgs, 1)
        names.check_int("invisible_ms", invisible_ms, 0)
        if isinstance(wait_ms, bool) or not isinstance(wait_ms, (int, float)) or not wait_ms >= 0:
            raise ValueError(f"wait_ms {wait_ms!r} must be a number >= 0")
        if consume_from not in (names.FIRST, names.LAST, names.MAX):
            raise ValueError(f"consume_from {consume_from!r} must be 'first', 'last' or 'max' "
                             f"for pops")
        store = self._service.store
        if expression is not None:
            store.view.compile_filter(expression, expression_type)
        wakeup = self._service.wakeup()
        deadline = time.monotonic() + wait_ms / 1000.0
        # A queue that appears while this pop waits starts at its first message, even for a
        # group starting "last": what was put there came after the pop began.
        existing = set(store.queue_ids(topic))
        while True:
            seen = wakeup.sequence()  # NOTE [ Long polling ]
            got, next_due_ms = self._pop_once(store, group, topic, max_msgs, invisible_ms,
                                              expression, expression_type, consume_from,
                                              existing)
            left = deadline - time.monotonic()
            if got or left <= 0:
                return got
            slice_s = MAX_WAIT_SLICE_S if next_due_ms is None else max(
                0.001, min(MAX_WAIT_SLICE_S, (next_due_ms - store.clock()) / 1000.0))
            wakeup.wait(seen, min(left, slice_s))

    def _pop_once(self, store, group, topic, max_msgs, invisible_ms, expression,
                  expression_type, consume_from, existing):
        queues = store.queue_ids(topic)
        committed = self._service.offsets.offsets(topic, group)
        picked: list = []  # (queue, batch, row, attempt, delivery, invisible until)

        def change(doc: dict):
            now = store.clock()
            until = now + invisible_ms
            qs = doc.setdefault("queues", {})
            under_way = bool(qs)  # before this pop adds queues: the group popped before
            changed = False
            # Deliveries that ran out come back first, oldest deadline first.
            due = sorted((v[1], int(q), int(o)) for q, e in qs.items()
                         for o, v in e.get("inflight", {}).items() if v[1] <= now)
            for _at, q, o in due:
                if len(picked) >= max_msgs:
                    break
                inflight = qs[str(q)]["inflight"]
                batch = store.read(topic, q, o, 1, verify=True)
                changed = True
                if batch is None or not len(batch) or int(batch.queue_offsets[0]) != o:
                    del inflight[str(o)]  # its record is gone (cleanup): nothing to deliver
                    continue
                doc["delivery"] += 1
                attempt = inflight[str(o)][0] + 1
                inflight[str(o)] = [attempt, until, doc["delivery"]]
                picked.append((q, batch, 0, attempt, doc["delivery"], until))
            if queues and len(picked) < max_msgs:
                first = doc.get("rotate", 0) % len(queues)
                doc["rotate"] = first + 1
                order = queues[first:] + queues[:first]
                share = math.ceil((max_msgs - len(picked)) / len(order))
                for limit in (share, max_msgs):  # a fair share of each queue, then the rest
                    for q in order:
                        room = min(limit, max_msgs - len(picked))
                        if room > 0:
                            start = (names.FIRST if under_way or q not in existing
                                     else consume_from)
                            changed |= self._take_new(store, doc, qs, topic, group, q, room,
                                                      until, picked, expression,
                                                      expression_type, committed, start)
            upcoming = [v[1] for e in qs.values() for v in e.get("inflight", {}).values()]
            return changed, min(upcoming) if upcoming else None

        next_due = self._state(topic, group).update(change)
        out = [PoppedMessage(topic, q, batch, row, make_handle(
                   topic, group, q, int(batch.queue_offsets[row]), attempt, delivery),
                   attempt, until)
               for q, batch, row, attempt, delivery, until in picked]
        return out, next_due

    def _take_new(self, store, doc, qs, topic, group, q, room, until, picked, expression,
                  expression_type, committed, start) -> bool:
        """Pop up to ``room`` never-popped messages of queue ``q`` (a queue new to the group
        starts at its committed offset, else where ``start`` says); True if the state
        moved."""
        entry = qs.get(str(q))
        changed = False
        if entry is None:
            if q in committed:
                offset = committed[q]
            elif start == names.FIRST:
                offset = store.min_offset(topic, q)
            elif start == names.MAX:
                offset = max_start(store, topic, q)
            else:
                offset = store.max_offset(topic, q)
            entry = qs[str(q)] = {"offset": offset, "inflight": {}}
            changed = True
        taken = 0
        while taken < room:
            offset = entry["offset"]
            batch = store.read(topic, q, offset, room - taken, expression=expression,
                               expression_type=expression_type, group=group)
            if batch is None:
                break
            for row in range(len(batch)):
                doc["delivery"] += 1
                entry["inflight"][str(int(batch.queue_offsets[row]))] = [1, until,
                                                                         doc["delivery"]]
                picked.append((q, batch, row, 1, doc["delivery"], until))
            taken += len(batch)
            moved = batch.next_begin_offset
            if moved != offset:
                entry["offset"] = moved
                changed = True
            if batch.status in _NOTHING_NEW or moved == offset:
                break
        return changed

    # -- ack and change of invisible time -------------------------------------------------
    def ack(self, handle: str) -> None:
        topic, group, q, offset, attempt, delivery = parse_handle(handle)

        def change(doc: dict):
            inflight = self._current(doc, handle, q, offset, attempt, delivery)
            del inflight[str(offset)]
            return True, None
        self._update(topic, group, handle, change)

    def change_invisible_duration(self, handle: str, invisible_ms: int) -> str:
        topic, group, q, offset, attempt, delivery = parse_handle(handle)
        names.check_int("invisible_ms", invisible_ms, 0)
        store = self._service.store

        def change(doc: dict):
            inflight = self._current(doc, handle, q, offset, attempt, delivery)
            doc["delivery"] += 1
            inflight[str(offset)] = [attempt, store.clock() + invisible_ms, doc["delivery"]]
            return True, make_handle(topic, group, q, offset, attempt, doc["delivery"])
        return self._update(topic, group, handle, change)

    def _update(self, topic, group, handle, change):
        state = self._state(topic, group)
        if not os.path.exists(state.path):
            raise ReceiptHandleError(f"receipt handle {handle!r}: group {group!r} has popped "
                                     f"nothing from topic {topic!r}")
        return state.update(change)

    @staticmethod
    def _current(doc, handle, q, offset, attempt, delivery) -> dict:
        """The in-flight table holding this delivery, or the error saying why it is over."""
        entry = (doc.get("queues") or {}).get(str(q))
        if entry is None or offset >= entry.get("offset", 0):
            raise ReceiptHandleError(f"receipt handle {handle!r}: queue {q} offset {offset} "
                                     f"was never popped by this group")
        inflight = entry.get("inflight", {})
        now = inflight.get(str(offset))
        if now is None:
            raise StaleReceiptHandleError(f"receipt handle {handle!r} is stale: the message "
                                          f"at queue {q} offset {offset} was acknowledged")
        if now[2] != delivery:
            why = (f"was delivered again (attempt {now[0]})" if now[0] != attempt else
                   "got a new invisible time, which handed out a new handle")
            raise StaleReceiptHandleError(f"receipt handle {handle!r} is stale: the message "
                                          f"at queue {q} offset {offset} {why}")
        return inflight

    def forget(self, topic: str, group: str) -> None:
        state = self._states.pop((topic, group), None)
        if state is not None:
            state.close()

    def close(self) -> None:
        for state in self._states.values():
            state.close()
        self._states.clear()

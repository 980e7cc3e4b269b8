"""FIFO consumer groups: which of a pop's due deliveries keep each queue in order.

NOTE [ FIFO groups ]
    A group whose config says ``consumeMessageOrderly`` (RocketMQ 5's FIFO consumer group) pops
    each queue in order, as RocketMQ's orderly pop does:
      * a queue with any message in flight to the group (popped, neither acknowledged nor
        dead-lettered) hands out nothing newer: the pop passes over it for new messages;
      * when in-flight messages run out of invisible time they are delivered again, in queue
        order, attempt + 1, and only those with no older message of their queue still in
        flight and not delivered in the same pop (an older one whose invisible time was
        extended holds the newer ones back);
      * one whose attempts are used up goes to ``%DLQ%<group>`` as for any group, which ends
        its delivery, and the queue moves on.
    Everything is decided from the pop state (``pop_state``) under the journal's exclusive
    flock, so pops from several processes never hold messages of one queue at once, and a
    restart (SIGKILL included) keeps the order: the in-flight messages are in the journal.
    Non-FIFO groups never come here.
"""

from __future__ import annotations

__all__ = ["in_order", "busy"]


def busy(state, q: int) -> bool:
    """Whether queue ``q`` has a message in flight (so a FIFO pop takes nothing new there)."""
    return bool(state.inflight.get(q))


def in_order(state, items: list, chosen: set) -> tuple[list, list]:
    """Split due ``items`` (``(queue, offset, attempt, delivery)``) into those a FIFO pop may
    deliver again now and those it holds back, each in queue order. ``chosen``: the
    ``(queue, offset)`` this pop already delivers again; the ones allowed here join it."""
    by_queue: dict[int, list] = {}
    for item in items:
        by_queue.setdefault(item[0], []).append(item)
    ok: list = []
    held: list = []
    for q, mine in sorted(by_queue.items()):
        mine.sort(key=lambda item: item[1])
        wanted = {item[1] for item in mine}
        # The offsets of q in flight, oldest first, up to the first one not delivered again:
        # everything newer waits for it.
        limit = None
        for o in sorted(state.inflight.get(q, ())):
            if o not in wanted and (q, o) not in chosen:
                limit = o
                break
        for item in mine:
            if limit is None or item[1] < limit:
                ok.append(item)
                chosen.add((q, item[1]))
            else:
                held.append(item)
    return ok, held

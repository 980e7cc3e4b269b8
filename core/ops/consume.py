"""``mqstore consume``: a consumer group's messages, committed exactly as far as they were printed.

A poll's messages go to a printer that says how many of them it got out; the group then
commits that far and no further (after every poll, so a long ``--follow`` killed outright
delivers again at most one poll): a message printed is committed, one not printed (the output
closed under it) is not, because the consumer is first moved back to it. A stop request
(SIGINT, SIGTERM: ``stop_on_signals``) is looked at between polls, and a following poll waits
at most ``WAIT_SLICE_MS`` at a time, so a stop never cuts a poll or its printing in half.

``--no-commit`` peeks (``store.peek``): it reads from the group's committed offsets (where
the group has none, from where a new instance would start) without joining the group, so the
group's live instances keep their queues, and it writes nothing: no membership files, no start
offsets, no commits (``consumer.peek``).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

POLL_MAX = 256  # messages per poll: one table, or this many JSON lines, per commit
WAIT_SLICE_MS = 200  # a following poll's longest wait, so a stop is seen this soon
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@dataclass(frozen=True)
class ConsumeRequest:
    group: str
    topic: str
    expression: str | None = None
    expression_type: str = "TAG"
    consume_from: str = "last"
    consume_timestamp: int | None = None
    limit: int | None = None
    """Stop after this many messages (None: when caught up, or never with ``follow``)."""
    follow: bool = False
    commit: bool = True


Printer = Callable[[Sequence], int]
"""Prints a poll's messages in order; returns how many it got out (fewer: the output is
gone and consuming stops)."""


def consume(store, request: ConsumeRequest, emit: Printer, stop: threading.Event) -> int:
    """Consume ``request.topic`` as ``request.group`` from ``store``, handing each poll's
    messages to ``emit``; returns how many were printed (and, unless peeking, committed)."""
    if not request.commit:
        with store.peek(request.group, request.topic, request.expression,
                        request.expression_type, consume_from=request.consume_from,
                        consume_timestamp=request.consume_timestamp) as peek:
            return _loop(peek, request, emit, stop)
    # Commits are made here, after printing, and only that far: no auto-commit.
    with store.consumer(request.group, request.topic, request.expression,
                        request.expression_type, consume_from=request.consume_from,
                        consume_timestamp=request.consume_timestamp,
                        auto_commit=False) as consumer:
        return _loop(consumer, request, emit, stop)


def _loop(reader, request: ConsumeRequest, emit: Printer, stop: threading.Event) -> int:
    """Polls ``reader`` (a group consumer, or a peek when not committing) and prints."""
    total = 0
    wait_ms = WAIT_SLICE_MS if request.follow else 0
    while not stop.is_set():
        want = POLL_MAX if request.limit is None else min(POLL_MAX, request.limit - total)
        if want <= 0:
            break
        messages = list(reader.poll(want, timeout_ms=wait_ms))
        printed = emit(messages) if messages else 0
        total += printed
        if request.commit:
            if printed < len(messages):
                _rewind(reader, messages[printed:])
            # Also after an empty poll: it may have passed over messages the subscription
            # filters out, which are never to be printed (a no-op when nothing moved).
            reader.commit()
        if printed < len(messages) or not (messages or request.follow):
            break  # the output is gone, or (not following) caught up
    return total


def _rewind(consumer, unprinted: Sequence) -> None:
    """Move each queue back to its first message not printed, so the commit stops there. A
    poll's messages come queue by queue in offset order: the first seen is the lowest."""
    first: dict[int, int] = {}
    for m in unprinted:
        first.setdefault(m.queue_id, m.queue_offset)
    for queue_id, offset in first.items():
        consumer.seek(queue_id, offset)


@contextlib.contextmanager
def stop_on_signals(signals=STOP_SIGNALS) -> Iterator[threading.Event]:
    """An event SIGINT and SIGTERM set instead of interrupting (so no poll or commit is cut
    short); the previous handlers come back when the block ends."""
    stop = threading.Event()
    previous = {signum: signal.signal(signum, lambda _signum, _frame: stop.set())
                for signum in signals}
    try:
        yield stop
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)

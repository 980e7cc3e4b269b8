"""ReceiveMessage: a pop across the topic's queues, with long polling, answered as a stream.

The queue a request names is ignored beyond its topic: the Python SimpleConsumer picks a random
queue for every receive, and a server popping only that queue strands messages in the others.
The Apache proxy pops every queue of the topic on the named broker; so does this (there is one
broker).

Long polling: pop; when nothing came, wait for dispatch to make messages visible (``longpoll``)
or for the next look at redeliveries (a delivery's invisible time runs out on the store clock,
which no wake-up announces: ``REDELIVERY_CHECK_S``), and pop again, until the poll time is up.
The poll time is what the client asks (``long_polling_timeout``), at most
``server.grpc_max_long_polling_ms``, and ends ``DEADLINE_MARGIN_S`` before the call's deadline
so the answer arrives before the client gives up (it allows request_timeout + await_duration).
A stopping endpoint ends every poll at once with what it has.

The stream: one ``status`` (OK, or MESSAGE_NOT_FOUND when the poll found nothing), then one
response per message, then ``delivery_timestamp``. A refused request answers only its status.
"""

from __future__ import annotations

import logging
import time

from mqstore.endpoint.pops import Pops, filter_of
from mqstore.endpoint.protocol import Code, service_pb2
from mqstore.endpoint.resources import group_name, topic_to_read
from mqstore.endpoint.status import EndpointError, ok, status
from mqstore.endpoint.wire import now_timestamp, to_wire

log = logging.getLogger(__name__)

MAX_BATCH = 32  # RocketMQ's pop hands out at most 32 messages
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # the proxy's maxInvisibleTimeMills
DEADLINE_MARGIN_S = 0.5
REDELIVERY_CHECK_S = 1.0
Response = service_pb2.ReceiveMessageResponse


def check_invisible(ms: int, minimum: int) -> int:
    if not minimum <= ms <= MAX_INVISIBLE_MS:
        raise EndpointError(Code.ILLEGAL_INVISIBLE_TIME, (
            f"invisible duration {ms} ms must be {minimum}..{MAX_INVISIBLE_MS} ms (at least "
            f"server.grpc_min_invisible_ms, at most 12 hours)"))
    return ms


class Receiver:
    def __init__(self, topics, pops: Pops, waiter, min_invisible_ms: int,
                 max_long_polling_ms: int) -> None:
        self._topics = topics
        self._pops = pops
        self._waiter = waiter
        self._min_invisible_ms = min_invisible_ms
        self._max_poll_s = max_long_polling_ms / 1000.0

    def poll_seconds(self, request, time_remaining: float | None) -> float:
        poll = self._max_poll_s
        if request.HasField("long_polling_timeout"):
            poll = min(poll, max(0.0, request.long_polling_timeout.ToMilliseconds() / 1000.0))
        if time_remaining is not None:
            if time_remaining < DEADLINE_MARGIN_S:
                raise EndpointError(Code.ILLEGAL_POLLING_TIME, (
                    f"the call's deadline leaves {time_remaining:.3f} s, not enough to poll "
                    f"(at least {DEADLINE_MARGIN_S} s)"))
            poll = min(poll, time_remaining - DEADLINE_MARGIN_S)
        return poll

    async def receive(self, request, time_remaining: float | None) -> list:
        """The messages of one receive, as wire messages (refusals raise EndpointError)."""
        group = group_name(request.group)
        topic = topic_to_read(request.message_queue.topic)
        self._topics.for_receive(topic)
        if not 1 <= request.batch_size <= MAX_BATCH:
            raise EndpointError(Code.BAD_REQUEST, f"batch size {request.batch_size} must be "
                                                  f"1..{MAX_BATCH} (RocketMQ pops at most "
                                                  f"{MAX_BATCH} messages)")
        invisible_ms = check_invisible(request.invisible_duration.ToMilliseconds(),
                                       self._min_invisible_ms)
        expression, kind = filter_of(request.filter_expression)
        self._pops.check_filter(expression, kind)
        poll_s = self.poll_seconds(request, time_remaining)
        deadline = time.monotonic() + poll_s
        waiter = self._waiter
        while True:
            seen = waiter.sequence()  # NOTE [ Long polling ]
            popped = self._pops.pop(group, topic, request.batch_size, invisible_ms, expression,
                                    kind)
            left = deadline - time.monotonic()
            if popped or left <= 0 or waiter.stopped:
                break
            await waiter.wait(seen, min(left, REDELIVERY_CHECK_S))
        out = []
        for m in popped:
            try:
                out.append(to_wire(m, m.receipt_handle, m.delivery_attempt))
            except (LookupError, ValueError) as exc:  # its record went (cleanup) or is damaged
                log.warning("not delivering %r (it comes back after its invisible time): %s",
                            m, exc)
        return out


def responses(messages: list, now_ms: int) -> list:
    """The stream of a receive's answer, in the order the clients read it."""
    head = Response(status=ok() if messages else status(Code.MESSAGE_NOT_FOUND,
                                                        "no new message"))
    return [head, *(Response(message=m) for m in messages),
            Response(delivery_timestamp=now_timestamp(now_ms))]


def refusal(code: int, message: str) -> list:
    return [Response(status=status(code, message))]


__all__ = ["Receiver", "responses", "refusal", "check_invisible", "MAX_BATCH",
           "MAX_INVISIBLE_MS"]

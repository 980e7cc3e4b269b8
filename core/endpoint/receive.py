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

What a receive holds is bounded (NOTE [ Unwritten bytes ] in ``backlog``): each pop first asks
the backlog for room and pops no more bytes than that, and what it hands out stays charged
until the stream is done; a stream whose peer stops reading for ``server.grpc_write_stall_ms``
has its connection closed (``write``). A group new to the store counts against its client
host's allowance (``creations``), and a filter is compiled off the event loop
(``Pops.check_filter``).

The stream: one ``status`` (OK, or MESSAGE_NOT_FOUND when the poll found nothing), then one
response per message, then ``delivery_timestamp``. A refused request answers only its status.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field

from mqstore.endpoint import connections
from mqstore.endpoint.backlog import Backlog
from mqstore.endpoint.pops import Pops, filter_of
from mqstore.endpoint.protocol import Code, service_pb2
from mqstore.endpoint.renewals import Renewals
from mqstore.endpoint.resources import group_name, topic_to_read
from mqstore.endpoint.status import EndpointError, ok, status
from mqstore.endpoint.wire import now_timestamp, to_wire

log = logging.getLogger(__name__)

MAX_BATCH = 32  # RocketMQ's pop hands out at most 32 messages
MAX_INVISIBLE_MS = 12 * 3600 * 1000  # the proxy's maxInvisibleTimeMills
DEADLINE_MARGIN_S = 0.5
REDELIVERY_CHECK_S = 1.0
POP_CHUNK_BYTES = 4 << 20  # most record bytes one pop of a receive reads
Response = service_pb2.ReceiveMessageResponse


def check_invisible(ms: int, minimum: int) -> int:
    if not minimum <= ms <= MAX_INVISIBLE_MS:
        raise EndpointError(Code.ILLEGAL_INVISIBLE_TIME, (
            f"invisible duration {ms} ms must be {minimum}..{MAX_INVISIBLE_MS} ms (at least "
            f"server.grpc_min_invisible_ms, at most 12 hours)"))
    return ms


@dataclass
class Handed:
    """What a receive hands out: wire messages, charged ``charged`` bytes to ``peer``; for a
    push consumer's receive (``auto_renew``), ``renew`` says the endpoint renews them for
    ``client_id`` once written (NOTE [ Auto-renewed deliveries ] in ``renewals``)."""

    peer: str
    client_id: str = ""
    messages: list = field(default_factory=list)
    charged: int = 0
    renew: bool = False

    def deliveries(self) -> list[tuple[str, int]]:
        """``(receipt handle, attempt)`` of what it hands out."""
        return [(m.system_properties.receipt_handle, m.system_properties.delivery_attempt)
                for m in self.messages]


class Receiver:
    """``server``: the config section; ``local_port``: the port the endpoint listens on (a
    stalled peer's connection is found by it)."""

    def __init__(self, topics, pops: Pops, waiter, server, backlog: Backlog, creations,
                 local_port: int, renewals: Renewals) -> None:
        self._topics = topics
        self._pops = pops
        self._waiter = waiter
        self._min_invisible_ms = server.grpc_min_invisible_ms
        self._max_poll_s = server.grpc_max_long_polling_ms / 1000.0
        self.stall_s = server.grpc_write_stall_ms / 1000.0
        self.local_port = local_port
        self.backlog = backlog
        self._creations = creations
        self.renewals = renewals

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

    async def receive(self, request, time_remaining: float | None, handed: Handed) -> None:
        """The messages of one receive into ``handed``, charged to its peer as they are popped
        (refusals raise EndpointError: what ``handed`` holds then stays charged until the
        call is done, never handed out: it comes back at its invisible time)."""
        peer = handed.peer
        group = group_name(request.group)
        topic = topic_to_read(request.message_queue.topic)
        self._topics.for_receive(topic)
        if not 1 <= request.batch_size <= MAX_BATCH:
            raise EndpointError(Code.BAD_REQUEST, f"batch size {request.batch_size} must be "
                                                  f"1..{MAX_BATCH} (RocketMQ pops at most "
                                                  f"{MAX_BATCH} messages)")
        invisible_ms = self._invisible_ms(request, handed)
        expression, kind = filter_of(request.filter_expression)
        poll_s = self.poll_seconds(request, time_remaining)
        await self._pops.check_filter(expression, kind)
        self._creations.group(peer, topic, group)
        deadline = time.monotonic() + poll_s
        waiter = self._waiter
        while True:
            seen = waiter.sequence()  # NOTE [ Long polling ]
            self.backlog.admit(peer)  # no await from here to the charge
            self._pop_into(handed, group, topic, request.batch_size, invisible_ms, expression,
                           kind)
            left = deadline - time.monotonic()
            if handed.messages or left <= 0 or waiter.stopped:
                return
            await waiter.wait(seen, min(left, REDELIVERY_CHECK_S))

    def _invisible_ms(self, request, handed: Handed) -> int:
        """A push consumer's receive (``auto_renew``, its client named) is renewed by the
        endpoint and pops for ``server.grpc_push_invisible_ms`` whatever it asks, as the
        proxy's; any other takes the duration it asks (within bounds)."""
        if request.auto_renew and handed.client_id:
            self.renewals.check_room(handed.client_id)
            handed.renew = True
            return self.renewals.invisible_ms
        return check_invisible(request.invisible_duration.ToMilliseconds(),
                               self._min_invisible_ms)

    def _pop_into(self, handed: Handed, group: str, topic: str, batch_size: int,
                  invisible_ms: int, expression: str | None, kind: str) -> None:
        """Pop up to ``batch_size`` messages into ``handed`` (wire messages, charged as
        converted), at most the backlog's room of bytes (one message at least), in pops of
        at most POP_CHUNK_BYTES: a pop reads its messages' bodies into one buffer, which
        lives until every one of them is converted, so big messages come a few at a time."""
        backlog, peer = self.backlog, handed.peer
        biggest = 0  # a pop always takes one message: another only with room for the biggest
        while len(handed.messages) < batch_size:
            room = backlog.room(peer)
            if handed.messages and room < biggest:
                return
            chunk = max(1, min(room, POP_CHUNK_BYTES))
            popped = self._pops.pop(group, topic, batch_size - len(handed.messages),
                                    invisible_ms, expression, kind, chunk)
            sizes = [m.size for m in popped]
            biggest = max([biggest, *sizes])
            self._convert(handed, popped)
            if sum(sizes) * 2 < chunk:  # not cut short by the chunk: the topic has no more
                return

    def _convert(self, handed: Handed, popped: list) -> None:
        """Wire messages of ``popped``, charged to the receive (NOTE [ Unwritten bytes ])."""
        popped.reverse()
        while popped:  # each message (and the record it decoded) goes once converted
            m = popped.pop()
            try:
                wire = to_wire(m, m.receipt_handle, m.delivery_attempt)
            except (LookupError, ValueError) as exc:  # its record went (cleanup) or is damaged
                log.warning("not delivering %r (it comes back after its invisible time): %s",
                            m, exc)
                continue
            size = wire.ByteSize()
            handed.messages.append(wire)
            handed.charged += size
            self.backlog.charge(handed.peer, size)

    async def answer(self, context, handed: Handed | None, responses: list) -> bool:
        """Write a receive's ``responses``; what ``handed`` charged stays charged until the
        call is done (NOTE [ Unwritten bytes ])."""
        if handed is not None and handed.charged:
            backlog, peer, charged = self.backlog, handed.peer, handed.charged
            if context.done():
                backlog.release(peer, charged)
            else:
                context.add_done_callback(lambda _call: backlog.release(peer, charged))
        return await write(context, responses, self.stall_s, self.local_port)


async def write(context, responses: list, stall_s: float, local_port: int) -> bool:
    """Write ``responses`` in order; False when the peer stopped reading for ``stall_s`` (its
    connection is then closed: NOTE [ Unwritten bytes ]) or went away."""
    for i, response in enumerate(responses):
        responses[i] = None  # once written gRPC holds its copy: ours goes
        task = asyncio.ensure_future(context.write(response))
        del response
        task.add_done_callback(_retrieved)  # a write that fails after we gave up is no news
        try:
            done, _pending = await asyncio.wait((task,), timeout=stall_s)
        finally:
            if not task.done():  # the call was cancelled under us
                task.cancel()
        if not done:
            peer = context.peer()
            closed = connections.close(peer, local_port)
            log.warning("a receive's stream to %s took nothing for %.0f s: %s; what it had "
                        "not sent comes back at its invisible time", peer, stall_s,
                        "closed its connection" if closed else
                        "gave it up (its connection was not found)")
            if not closed:
                task.cancel()
            await asyncio.wait((task,))
        if task.cancelled() or task.exception() is not None:
            return False
    return True


def _retrieved(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


def responses(messages: list, now_ms: int) -> list:
    """The stream of a receive's answer, in the order the clients read it. Takes the
    messages out of ``messages`` (a response holds a copy of its message: two would hold
    every message twice)."""
    out = [Response(status=ok() if messages else status(Code.MESSAGE_NOT_FOUND,
                                                        "no new message"))]
    messages.reverse()
    while messages:
        out.append(Response(message=messages.pop()))
    out.append(Response(delivery_timestamp=now_timestamp(now_ms)))
    return out


def refusal(code: int, message: str) -> list:
    return [Response(status=status(code, message))]


__all__ = ["Receiver", "Handed", "responses", "refusal", "write", "check_invisible",
           "MAX_BATCH", "MAX_INVISIBLE_MS"]

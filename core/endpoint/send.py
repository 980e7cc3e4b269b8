"""SendMessage: the messages of a request stored all-or-nothing, with other requests' in one
put.

The request's messages are checked and converted first (``wire.to_store``: a bad topic, tag,
key, property or message id, an empty or oversized body refuse the whole request with the
proxy's code). Then ``PutBatcher`` stores them with the requests of other RPCs in one
``put_batch`` (one ``put`` for a lone message). A put is all-or-nothing for the whole group,
so a message the store refuses on its own (the batch result names it) refuses only its
request, and the other requests are put again without it; a refusal of the store itself
(disk full, a flush timeout) answers every request of the group. Each message gets its entry:
the put's status, the client's message id and the message's queue offset (what a RocketMQ
broker answers as the offset). An RPC is answered only once its group's put returned: OK is
a stored message.

Under a flush policy that makes puts wait for the disk (``flush.policy: sync``) a group is the
requests of one turn of the event loop, put on a thread, so that groups share a flush (group
commit) instead of queueing on the loop. Under ``async`` groups are put on the loop itself:

NOTE [ Send groups ]
A put has fixed costs (checks, the put lock, publishing the new end, the answer) that, paid
once per RPC between gRPC's own work on every other RPC, cost more than the messages
themselves: a client with many sends in flight keeps the endpoint busy with puts of one
message while its own requests queue up in gRPC. So a group is put once the requests stop
coming:

  * a lone request (a client that waits for each answer) goes at the next turn of the loop,
    as before, with whatever else arrived in that turn;
  * once a group held several requests, sends are streaming in: the next group waits until
    no request came for ``GROUP_GAP_S`` (0.5 ms), at most ``GROUP_WINDOW_S`` (2 ms) after
    its first, or until it holds ``GROUP_MOST_REQUESTS``; ``QUIET_GROUPS`` groups of one
    request in a row end the stream.

Measured with the official Python client and 256 sends in flight on a loaded 2-core machine,
groups then hold 5 to 10 requests and the endpoint's CPU per send falls by a third; the
client's too, as its answers come back in bursts (benchmarks/README.md). The cost is latency:
while sends stream in, each waits up to 2 ms more for its answer.

The endpoint picks the queue, as the proxy does (a request names none): FIFO messages (with a
message group) by a hash of the group, so a group's messages stay in one queue in order;
others by the store's queue selector.
"""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor

from mqstore.endpoint import wire
from mqstore.endpoint.protocol import Code, service_pb2
from mqstore.endpoint.resources import full_name, topic_to_write
from mqstore.endpoint.status import EndpointError, ok, put_status
from mqstore.endpoint.transactions import transaction_id
from mqstore.hashing import java_string_hash
from mqstore.message import PutStatus

NON_WAITING_FLUSH = "async"  # the one built-in policy whose puts never wait for the disk
PUT_THREADS = 16  # batches waiting for a flush at once
# NOTE [ Send groups ]
GROUP_GAP_S = 0.0005  # a streaming group goes once no request came for this long...
GROUP_WINDOW_S = 0.002  # ...or this long after its first request...
GROUP_MOST_REQUESTS = 256  # ...or when it holds this many
QUIET_GROUPS = 4  # groups of one request in a row that end a stream


def put_request(store, messages: list) -> tuple:
    """Store one request's messages in one put: ``(status, error, queue offsets)``; raises the
    EndpointError refusing it."""
    try:
        if len(messages) == 1:
            r = store.put(messages[0])
            return r.status, r.error, [r.queue_offset]
        r = store.put_batch(messages)
    except ValueError as exc:  # what the checks let through, the store refuses
        raise EndpointError(Code.BAD_REQUEST, str(exc)) from None
    return r.status, r.error, r.queue_offsets.tolist()


def put_all(store, requests: list[list]) -> list:
    """Store every request's messages in one put; per request ``(status, error, queue
    offsets)``, or the EndpointError refusing it."""
    if len(requests) == 1:
        try:
            return [put_request(store, requests[0])]
        except EndpointError as exc:
            return [exc]
    flat = [m for messages in requests for m in messages]
    try:
        r = store.put_batch(flat)
    except ValueError as exc:  # what the checks let through, the store refuses
        if len(requests) == 1:
            return [EndpointError(Code.BAD_REQUEST, str(exc))]
        return [put_all(store, [messages])[0] for messages in requests]
    if r.error_index is not None and len(requests) > 1:
        first = 0
        for k, messages in enumerate(requests):
            if first <= r.error_index < first + len(messages):
                others = put_all(store, requests[:k] + requests[k + 1:])
                return others[:k] + [(r.status, r.error, [])] + others[k:]
            first += len(messages)
    offsets = r.queue_offsets.tolist()
    out, first = [], 0
    for messages in requests:
        out.append((r.status, r.error, offsets[first:first + len(messages)]))
        first += len(messages)
    return out


class PutBatcher:
    """Puts the requests of one moment together. Loop thread only.

    With a ``pool`` (puts that wait for the disk) a group is the requests of one loop turn,
    put on one of its threads. Without one the group is put on the loop itself, and while
    sends stream in a group gathers them for a little longer (NOTE [ Send groups ]).
    """

    def __init__(self, store, pool: ThreadPoolExecutor | None = None, *,
                 gap_s: float = 0.0, window_s: float = 0.0,
                 most: int = GROUP_MOST_REQUESTS) -> None:
        self._store = store
        self._pool = pool
        self._gap_s = gap_s
        self._window_s = window_s
        self._most = most
        self._pending: list[tuple[list, asyncio.Future]] = []
        self._due: asyncio.Handle | None = None  # the pending group's flush (or look)
        self._first = self._last = 0.0  # loop times the pending group's first and last came
        self._singles = QUIET_GROUPS  # groups of one request in a row: no stream after a few

    async def put(self, messages: list):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        pending = self._pending
        if self._gap_s and self._singles < QUIET_GROUPS:
            self._last = now = loop.time()
            if not pending:
                self._first = now
                self._due = loop.call_at(now + min(self._gap_s, self._window_s), self._look,
                                         loop)
        elif not pending:
            self._due = loop.call_soon(self._flush, loop)
        pending.append((messages, future))
        if len(pending) >= self._most:
            self._due.cancel()
            self._flush(loop)
        result = await future
        if isinstance(result, EndpointError):
            raise result
        return result

    def _look(self, loop) -> None:
        """The group goes once no request came for ``gap_s``, or it is ``window_s`` old."""
        due = min(self._last + self._gap_s, self._first + self._window_s)
        if loop.time() < due:
            self._due = loop.call_at(due, self._look, loop)
        else:
            self._flush(loop)

    def _flush(self, loop) -> None:
        pending, self._pending = self._pending, []
        self._singles = self._singles + 1 if len(pending) == 1 else 0
        requests = [messages for messages, _future in pending]
        if self._pool is None:
            try:
                results = put_all(self._store, requests)
            except Exception as exc:  # noqa: BLE001 - every caller gets the failure
                self._fail(pending, exc)
                return
            self._answer(pending, results)
            return
        done = loop.run_in_executor(self._pool, put_all, self._store, requests)
        done.add_done_callback(lambda f: self._fail(pending, f.exception())
                               if f.exception() is not None
                               else self._answer(pending, f.result()))

    @staticmethod
    def _answer(pending, results) -> None:
        for (_messages, future), result in zip(pending, results):
            if not future.done():  # its caller may have gone (the client cancelled)
                future.set_result(result)

    @staticmethod
    def _fail(pending, exc: BaseException) -> None:
        for _messages, future in pending:
            if not future.done():
                future.set_exception(exc)


# The usual answer, one message stored: copied and filled in, which costs a third of building it.
_STORED_ONE = service_pb2.SendMessageResponse(status=ok(),
                                              entries=[service_pb2.SendResultEntry(status=ok())])


class Sender:
    def __init__(self, store, topics, config, creations) -> None:
        self._store = store
        self._topics = topics
        self._creations = creations  # a send that creates a topic counts against its host
        self._max_body = config.commit_log.max_message_bytes
        self._max_delay_ms = config.store.timer_max_delay_sec * 1000
        self._auto_v2 = config.commit_log.auto_v2_on_long_topic
        self._pool = None
        if config.flush.policy != NON_WAITING_FLUSH:
            self._pool = ThreadPoolExecutor(PUT_THREADS, thread_name_prefix="mqstore-grpc-put")
            self._batcher = PutBatcher(store, self._pool)
        else:
            self._batcher = PutBatcher(store, gap_s=GROUP_GAP_S, window_s=GROUP_WINDOW_S)

    def messages(self, request, peer: str) -> list:
        if not request.messages:
            raise EndpointError(Code.MESSAGE_CORRUPTED, "no message to send")
        born_host = wire.peer_host(peer)
        topics = self._topics
        out = []
        for m in request.messages:
            topic = topic_to_write(full_name(m.topic), self._auto_v2)
            exists = topics.for_send(topic)
            msg = wire.to_store(m, topic, born_host, self._max_body)
            deliver = wire.delivery_ms(msg)
            if deliver is not None:
                self._check_delivery(deliver)
            if not exists:
                self._creations.topic(peer, topic)
            group = m.system_properties.message_group
            if group:
                queues = topics.queues(topic) or range(topics.queues_per_topic)
                msg.queue_id = queues[(java_string_hash(group) & 0x7FFFFFFF) % len(queues)]
            out.append(msg)
        return out

    def _check_delivery(self, deliver: int) -> None:
        """The proxy's check: no further ahead than the store's timers go."""
        ahead = deliver - self._store.clock()
        if ahead > self._max_delay_ms:
            raise EndpointError(Code.ILLEGAL_DELIVERY_TIME, (
                f"delivery_timestamp is {ahead} ms ahead; the most is {self._max_delay_ms} "
                f"ms (store.timer_max_delay_sec)"))

    async def _put(self, messages: list):
        """Timed messages are put one by one (a batch may not hold them); the rest grouped."""
        if all(wire.delivery_ms(m) is None for m in messages):
            return await self._batcher.put(messages)
        out = [None, None, []]
        for m in messages:
            if self._pool is None:
                put, error, offsets = put_request(self._store, [m])
            else:
                put, error, offsets = await asyncio.get_running_loop().run_in_executor(
                    self._pool, put_request, self._store, [m])
            if out[0] is None or out[0] is PutStatus.PUT_OK:
                out[0], out[1] = put, error
            out[2] += offsets
        return tuple(out)

    async def _put_halves(self, request, messages: list) -> service_pb2.SendMessageResponse:
        """Transactions' halves, put one by one (a batch may not hold them); each entry
        carries its transaction id (``endpoint.transactions``)."""
        entries, head = [], None
        for wire_msg, m in zip(request.messages, messages):
            if self._pool is None:
                r = self._store.put(m)
            else:
                r = await asyncio.get_running_loop().run_in_executor(self._pool,
                                                                     self._store.put, m)
            if r.status.stored:
                self._topics.created(m.topic)
            one = put_status(r.status, r.error)
            head = one if head is None or head.code == Code.OK else head
            entry = service_pb2.SendResultEntry(status=one,
                                                message_id=wire_msg.system_properties.message_id)
            if r.status is PutStatus.PUT_OK:
                entry.offset = r.queue_offset
                entry.transaction_id = transaction_id(self._store.store_host, r.phys_offset)
            entries.append(entry)
        return service_pb2.SendMessageResponse(status=head, entries=entries)

    async def send(self, request, peer: str) -> service_pb2.SendMessageResponse:
        messages = self.messages(request, peer)
        if any(m.properties.get(wire.TRANSACTION_PREPARED) == "true" for m in messages):
            return await self._put_halves(request, messages)
        put, error, offsets = await self._put(messages)
        if put.stored:
            for m in messages:
                self._topics.created(m.topic)
        if put is PutStatus.PUT_OK and len(offsets) == 1:
            response = service_pb2.SendMessageResponse()
            response.CopyFrom(_STORED_ONE)
            entry = response.entries[0]
            entry.message_id = request.messages[0].system_properties.message_id
            entry.offset = offsets[0]
            return response
        head = put_status(put, error)
        entry = service_pb2.SendResultEntry
        if put is PutStatus.PUT_OK:
            entries = [entry(status=head, message_id=m.system_properties.message_id, offset=o)
                       for m, o in zip(request.messages, offsets)]
        else:
            entries = [entry(status=head, message_id=m.system_properties.message_id)
                       for m in request.messages]
        return service_pb2.SendMessageResponse(status=head, entries=entries)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


__all__ = ["Sender", "PutBatcher", "put_all", "put_request"]

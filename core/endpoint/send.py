"""SendMessage: the messages of a request stored all-or-nothing, with other requests' in one
put.

The request's messages are checked and converted first (``wire.to_store``: a bad topic, tag,
key, property or message id, an empty or oversized body refuse the whole request with the
proxy's code). Then they are stored in one put (``put`` for one message, ``put_batch`` for
more), all or nothing. Each message gets its entry: the put's status, the client's message id
and the message's queue offset (what a RocketMQ broker answers as the offset).

Under ``flush.policy: async`` the put runs on the event loop, inside the RPC's own handler: it
takes some tens of microseconds, and handing it anywhere else would cost more than it does.

Under a flush policy that makes puts wait for the disk (``sync``) the puts run on threads, so
that they share a flush (group commit) instead of queueing on the event loop, and
``PutBatcher`` gathers the requests that arrive in one turn of the loop (a client with many
sends in flight, several clients) into one ``put_batch`` and one wait. A put is all-or-nothing
for the whole batch, so a message the store refuses on its own (the batch result names it)
refuses only its request, and the other requests are put again without it; a refusal of the
store itself (disk full, a flush timeout) answers every request of the batch.

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
from mqstore.endpoint.status import EndpointError, put_status
from mqstore.hashing import java_string_hash
from mqstore.message import PutStatus

NON_WAITING_FLUSH = "async"  # the one built-in policy whose puts never wait for the disk
PUT_THREADS = 16  # batches waiting for a flush at once


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
    """Puts the requests of one event-loop turn together, on a thread of ``pool`` (puts that
    wait for the disk). Loop thread only."""

    def __init__(self, store, pool: ThreadPoolExecutor) -> None:
        self._store = store
        self._pool = pool
        self._pending: list[tuple[list, asyncio.Future]] = []

    async def put(self, messages: list):
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush, loop)
        self._pending.append((messages, future))
        result = await future
        if isinstance(result, EndpointError):
            raise result
        return result

    def _flush(self, loop) -> None:
        pending, self._pending = self._pending, []
        requests = [messages for messages, _future in pending]
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


class Sender:
    def __init__(self, store, topics, config) -> None:
        self._store = store
        self._topics = topics
        self._max_body = config.commit_log.max_message_bytes
        self._pool = self._batcher = None
        if config.flush.policy != NON_WAITING_FLUSH:
            self._pool = ThreadPoolExecutor(PUT_THREADS, thread_name_prefix="mqstore-grpc-put")
            self._batcher = PutBatcher(store, self._pool)

    def messages(self, request, peer: str) -> list:
        if not request.messages:
            raise EndpointError(Code.MESSAGE_CORRUPTED, "no message to send")
        born_host = wire.peer_host(peer)
        topics = self._topics
        out = []
        for m in request.messages:
            topic = topic_to_write(full_name(m.topic))
            topics.for_send(topic)
            msg = wire.to_store(m, topic, born_host, self._max_body)
            group = m.system_properties.message_group
            if group:
                queues = topics.queues(topic) or range(topics.queues_per_topic)
                msg.queue_id = queues[(java_string_hash(group) & 0x7FFFFFFF) % len(queues)]
            out.append(msg)
        return out

    async def send(self, request, peer: str) -> service_pb2.SendMessageResponse:
        messages = self.messages(request, peer)
        if self._batcher is None:
            put, error, offsets = put_request(self._store, messages)
        else:
            put, error, offsets = await self._batcher.put(messages)
        if put.stored:
            for m in messages:
                self._topics.created(m.topic)
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

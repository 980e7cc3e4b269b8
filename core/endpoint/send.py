"""SendMessage: every message of a request in one put, all-or-nothing.

The request's messages are checked and converted first (``wire.to_store``: a bad topic, tag,
key, property or message id, an empty or oversized body refuse the whole request with the
proxy's code), then stored with one ``put`` (one message: the store's fast path) or one
``put_batch``. Each message gets its entry: the put's status, the client's message id and the
message's queue offset (what a RocketMQ broker answers as the offset).

The endpoint picks the queue, as the proxy does (a request names none): FIFO messages (with a
message group) by a hash of the group, so a group's messages stay in one queue in order;
others by the store's queue selector. Under a flush policy that makes puts wait for the disk
(``flush.policy: sync``) a put runs on a thread, so concurrent sends share the flush (group
commit) instead of queueing behind each other; under ``async`` it runs on the event loop,
where it takes microseconds.
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
PUT_THREADS = 16  # sends waiting for one flush at once


class Sender:
    def __init__(self, store, topics, config) -> None:
        self._store = store
        self._topics = topics
        self._max_body = config.commit_log.max_message_bytes
        waits = config.flush.policy != NON_WAITING_FLUSH
        self._pool = ThreadPoolExecutor(PUT_THREADS, thread_name_prefix="mqstore-grpc-put") \
            if waits else None

    def messages(self, request, peer: str) -> list:
        if not request.messages:
            raise EndpointError(Code.MESSAGE_CORRUPTED, "no message to send")
        born_host = wire.peer_host(peer)
        out = []
        for m in request.messages:
            topic = topic_to_write(full_name(m.topic))
            self._topics.for_send(topic)
            msg = wire.to_store(m, topic, born_host, self._max_body)
            group = m.system_properties.message_group
            if group:
                queues = self._topics.queues(topic) or range(self._topics.queues_per_topic)
                msg.queue_id = queues[(java_string_hash(group) & 0x7FFFFFFF) % len(queues)]
            out.append(msg)
        return out

    def _put(self, messages: list):
        store = self._store
        try:
            if len(messages) == 1:
                r = store.put(messages[0])
                return r.status, r.error, [r.queue_offset]
            r = store.put_batch(messages)
        except ValueError as exc:  # what the checks above let through, the store refuses
            raise EndpointError(Code.BAD_REQUEST, str(exc)) from None
        return r.status, r.error, [int(o) for o in r.queue_offsets]

    async def send(self, request, peer: str) -> service_pb2.SendMessageResponse:
        messages = self.messages(request, peer)
        if self._pool is None:
            put, error, offsets = self._put(messages)
        else:
            loop = asyncio.get_running_loop()
            put, error, offsets = await loop.run_in_executor(self._pool, self._put, messages)
        if put.stored:
            for m in messages:
                self._topics.created(m.topic)
        head = put_status(put, error)
        entries = []
        for i, m in enumerate(request.messages):
            entry = service_pb2.SendResultEntry(status=head,
                                                message_id=m.system_properties.message_id)
            if put is PutStatus.PUT_OK:
                entry.offset = offsets[i]
            entries.append(entry)
        return service_pb2.SendMessageResponse(status=head, entries=entries)

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)


__all__ = ["Sender"]

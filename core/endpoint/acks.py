"""AckMessage and ChangeInvisibleDuration on the receipt handles a receive handed out.

An ack answers one entry per handle: OK, or INVALID_RECEIPT_HANDLE (40013) for a handle that
is stale (the message was acknowledged, delivered again, or given a new invisible time) or
that the store never handed out to this group; the response's status is that code when every
entry has it, MULTIPLE_RESULTS otherwise (as the proxy answers). A change of invisible
duration answers the delivery's new handle; the old one is stale from then on. A forward to
the dead-letter queue writes the handle's message to ``%DLQ%<group>`` and ends its delivery
(as an ack does); a handle that is not current answers INVALID_RECEIPT_HANDLE.

A push consumer presents the handle it was given (to an ack, a change or a forward) for a
delivery the endpoint may have renewed since: its latest handle is presented instead (NOTE [ Auto-renewed deliveries ] in
``renewals``).
"""

from __future__ import annotations

from mqstore.endpoint.pops import Pops
from mqstore.endpoint.protocol import Code, service_pb2
from mqstore.endpoint.receive import MAX_INVISIBLE_MS
from mqstore.endpoint.renewals import Renewals
from mqstore.endpoint.resources import group_name, topic_to_read
from mqstore.endpoint.status import EndpointError, ok, status


def ack(pops: Pops, request, renewals: Renewals, client_id: str
        ) -> service_pb2.AckMessageResponse:
    group = group_name(request.group)
    topic = topic_to_read(request.topic)
    if not request.entries:
        raise EndpointError(Code.BAD_REQUEST, "an ack needs at least one entry")
    refusals = pops.ack(group, topic, [renewals.take(client_id, e.receipt_handle)
                                       for e in request.entries])
    entries = [service_pb2.AckMessageResultEntry(
        message_id=e.message_id, receipt_handle=e.receipt_handle,
        status=ok() if why is None else status(Code.INVALID_RECEIPT_HANDLE, why))
        for e, why in zip(request.entries, refusals)]
    codes = {e.status.code for e in entries}
    if len(codes) == 1:
        head = entries[0].status
    else:
        head = status(Code.MULTIPLE_RESULTS, "some entries were acknowledged, some refused")
    return service_pb2.AckMessageResponse(status=head, entries=entries)


def change_invisible_duration(pops: Pops, request, renewals: Renewals, client_id: str
                              ) -> service_pb2.ChangeInvisibleDurationResponse:
    group = group_name(request.group)
    topic = topic_to_read(request.topic)
    ms = request.invisible_duration.ToMilliseconds()
    if not 0 <= ms <= MAX_INVISIBLE_MS:
        raise EndpointError(Code.ILLEGAL_INVISIBLE_TIME,
                            f"invisible duration {ms} ms must be 0..{MAX_INVISIBLE_MS} ms")
    handle = pops.change_invisible(group, topic, renewals.take(client_id, request.receipt_handle),
                                   ms)
    return service_pb2.ChangeInvisibleDurationResponse(status=ok(), receipt_handle=handle)


def forward_to_dead_letter_queue(pops: Pops, request, renewals: Renewals, client_id: str
                                 ) -> service_pb2.ForwardMessageToDeadLetterQueueResponse:
    group = group_name(request.group)
    topic = topic_to_read(request.topic)
    # A FIFO push consumer forwards once its local retries are spent, usually long after the
    # endpoint renewed the delivery: the latest handle goes to the store.
    pops.dead_letter(group, topic, renewals.take(client_id, request.receipt_handle))
    return service_pb2.ForwardMessageToDeadLetterQueueResponse(status=ok())


__all__ = ["ack", "change_invisible_duration", "forward_to_dead_letter_queue"]

"""The servicer of ``apache.rocketmq.v2.MessagingService``: each RPC, guarded.

Every call first passes the guard: the access-key check (``auth``, which reads the call's
metadata only when access keys are configured) and the connection cap (``limits.Peers``).
Clients are known by their ``x-mq-client-id`` from Telemetry, Heartbeat (every 10 s) and
NotifyClientTermination (``settings.Sessions``); a push consumer's deliveries are renewed for it
while it consumes them (``renewals``). A refusal raised anywhere
(``EndpointError``) becomes the response's status, as RocketMQ answers (the RPC itself
succeeds); anything unexpected is logged and answered INTERNAL_SERVER_ERROR naming it. RPCs
mqstore does not serve (PullMessage, offsets, recall, lite topics) end with gRPC's
UNIMPLEMENTED and a message saying so.

Everything runs on the event loop's thread; store calls that may wait for the disk run on
threads (``send``), everything else inline (microseconds to a millisecond).
"""

from __future__ import annotations

import asyncio
import errno
import functools
import inspect
import logging

import grpc

from mqstore.endpoint import acks, receive, route
from mqstore.endpoint.protocol import ClientType, Code, service_pb2, service_pb2_grpc
from mqstore.endpoint.resources import group_name, topic_to_read
from mqstore.endpoint.status import EndpointError, ok, status
from mqstore.errors import StoreClosedError

log = logging.getLogger(__name__)
CLIENT_ID = "x-mq-client-id"
SERVED = ("QueryRoute", "QueryAssignment", "Heartbeat", "SendMessage", "ReceiveMessage",
          "AckMessage", "ChangeInvisibleDuration", "ForwardMessageToDeadLetterQueue",
          "Telemetry", "NotifyClientTermination", "EndTransaction")


def _failure(name: str, exc: BaseException) -> tuple[int, str]:
    if isinstance(exc, EndpointError):
        return exc.code, exc.message
    if isinstance(exc, StoreClosedError):
        return Code.INTERNAL_SERVER_ERROR, "the store is closing: the endpoint is stopping"
    if isinstance(exc, OSError) and exc.errno in (errno.EMFILE, errno.ENFILE):
        # Its caches let files go as they need descriptors; this is a moment's shortage.
        log.error("%s refused: out of file descriptors (%s)", name, exc.strerror)
        return Code.TOO_MANY_REQUESTS, (f"{name} refused: the server is out of file "
                                        f"descriptors for now; try again later")
    log.exception("%s failed", name)
    return Code.INTERNAL_SERVER_ERROR, f"{name} failed: {type(exc).__name__}: {exc}"


def unary(response_type):
    """A guarded unary RPC: ``handler(self, request, context, peer)`` returns the response
    (a coroutine function awaits it); refusals become its status."""
    def wrap(handler):
        name = handler.__name__
        awaits = inspect.iscoroutinefunction(handler)

        @functools.wraps(handler)
        async def rpc(self, request, context):
            peer = context.peer()
            try:
                self.enter(context, peer)
            except EndpointError as exc:
                return response_type(status=status(exc.code, exc.message))
            try:
                if awaits:
                    return await handler(self, request, context, peer)
                return handler(self, request, context, peer)
            except Exception as exc:  # noqa: BLE001 - every failure is an answer
                return response_type(status=status(*_failure(name, exc)))
            finally:
                self.peers.leave(peer)
        return rpc
    return wrap


def client_id(context) -> str:
    for key, value in context.invocation_metadata() or ():
        if key == CLIENT_ID:
            return value
    return ""


class MessagingService(service_pb2_grpc.MessagingServiceServicer):
    def __init__(self, parts) -> None:
        self.parts = parts  # the endpoint's pieces (server.Parts)
        self.peers = parts.peers
        self.stopping = asyncio.Event()

    def enter(self, context, peer: str) -> None:
        """The guard: returns when the call may proceed."""
        access_keys = self.parts.access_keys
        if access_keys.enabled:
            access_keys.check(dict(context.invocation_metadata() or ()))
        self.peers.enter(peer)

    def enter_admin(self, context, peer: str) -> None:
        """The admin service's guard: its own keys (``auth.AdminAccess``), the same cap."""
        self.parts.admin_access.check(dict(context.invocation_metadata() or ()))
        self.peers.enter(peer)

    # -- routes and clients ---------------------------------------------------------------
    @unary(service_pb2.QueryRouteResponse)
    def QueryRoute(self, request, context, peer):
        topic = topic_to_read(request.topic)
        queues = self.parts.topics.for_route(topic)
        endpoints = request.endpoints if request.endpoints.addresses else self.parts.endpoints
        return route.route_response(request.topic, queues, endpoints)

    @unary(service_pb2.QueryAssignmentResponse)
    def QueryAssignment(self, request, context, peer):
        group_name(request.group)
        topic = topic_to_read(request.topic)
        queues = self.parts.topics.for_route(topic)
        endpoints = request.endpoints if request.endpoints.addresses else self.parts.endpoints
        return route.assignment_response(request.topic, queues, endpoints)

    @unary(service_pb2.HeartbeatResponse)
    def Heartbeat(self, request, context, peer):
        if request.HasField("group") and request.group.name:
            group_name(request.group)
        self.parts.sessions.seen(client_id(context), request.client_type)
        return service_pb2.HeartbeatResponse(status=ok())

    @unary(service_pb2.NotifyClientTerminationResponse)
    def NotifyClientTermination(self, request, context, peer):
        client = client_id(context)
        self.parts.sessions.drop(client)
        self.parts.receiver.renewals.give_back(client)
        return service_pb2.NotifyClientTerminationResponse(status=ok())

    async def Telemetry(self, request_iterator, context):
        peer = context.peer()
        try:
            self.enter(context, peer)
        except EndpointError as exc:
            await context.write(service_pb2.TelemetryCommand(status=status(exc.code,
                                                                           exc.message)))
            return
        client = client_id(context)
        try:
            reader = asyncio.ensure_future(self._settings(request_iterator, context, client))
            stopper = asyncio.ensure_future(self.stopping.wait())
            await asyncio.wait((reader, stopper), return_when=asyncio.FIRST_COMPLETED)
            for task in (reader, stopper):
                task.cancel()
            failure = reader.exception() if reader.done() and not reader.cancelled() else None
            if isinstance(failure, EndpointError):  # e.g. too many clients: say why
                await context.write(service_pb2.TelemetryCommand(
                    status=status(failure.code, failure.message)))
            elif failure is not None:  # the client went away mid-stream
                log.debug("telemetry stream of %s ended: %r", peer, failure)
        finally:
            self.parts.producers.gone(client, context)
            self.peers.leave(peer)

    async def _settings(self, request_iterator, context, client_id: str) -> None:
        parts = self.parts
        async for command in request_iterator:
            if command.HasField("settings"):
                filled = parts.settings_policy.fill(command.settings, parts.pops.max_attempts,
                                                    parts.pops.fifo)
                parts.sessions.seen(client_id, command.settings.client_type, filled)
                # A producer's stream also carries the transactions' check-backs.
                stream = parts.producers.publishing(client_id, context, command.settings)
                async with stream.lock:
                    await context.write(service_pb2.TelemetryCommand(status=ok(),
                                                                     settings=filled))
            # Other commands answer commands this endpoint never sends (stack traces,
            # message verification, transaction checks).

    # -- messages -------------------------------------------------------------------------
    @unary(service_pb2.SendMessageResponse)
    async def SendMessage(self, request, context, peer):
        return await self.parts.sender.send(request, peer)

    async def ReceiveMessage(self, request, context):
        peer = context.peer()
        receiver = self.parts.receiver
        try:
            self.enter(context, peer)
        except EndpointError as exc:
            await receiver.answer(context, None, receive.refusal(exc.code, exc.message))
            return
        try:
            handed = receive.Handed(peer, client_id(context))
            deliveries = []
            try:
                if request.auto_renew and handed.client_id:  # known before it pops
                    self.parts.sessions.seen(handed.client_id, ClientType.PUSH_CONSUMER)
                await receiver.receive(request, context.time_remaining(), handed)
                if handed.renew:
                    deliveries = handed.deliveries()
                answer = receive.responses(handed.messages, self.parts.store.clock())
            except Exception as exc:  # noqa: BLE001 - every failure is an answer
                answer = receive.refusal(*_failure("ReceiveMessage", exc))
            if await receiver.answer(context, handed, answer) and deliveries:
                receiver.renewals.hold(handed.client_id, deliveries)
        finally:
            self.peers.leave(peer)

    @unary(service_pb2.EndTransactionResponse)
    async def EndTransaction(self, request, context, peer):
        return await self.parts.transactions.end(request)

    @unary(service_pb2.AckMessageResponse)
    def AckMessage(self, request, context, peer):
        return acks.ack(self.parts.pops, request, self.parts.receiver.renewals,
                        client_id(context))

    @unary(service_pb2.ChangeInvisibleDurationResponse)
    def ChangeInvisibleDuration(self, request, context, peer):
        return acks.change_invisible_duration(self.parts.pops, request,
                                              self.parts.receiver.renewals, client_id(context))

    @unary(service_pb2.ForwardMessageToDeadLetterQueueResponse)
    def ForwardMessageToDeadLetterQueue(self, request, context, peer):
        return acks.forward_to_dead_letter_queue(self.parts.pops, request,
                                                 self.parts.receiver.renewals, client_id(context))

    # -- what mqstore does not serve -------------------------------------------------------
    async def _unimplemented(self, name: str, context) -> None:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, (
            f"mqstore's endpoint does not implement {name}; it serves "
            f"{', '.join(SERVED)} (producers and SimpleConsumer; see docs/endpoint.md)"))


def _add_unimplemented(name: str, streaming: bool) -> None:
    if streaming:
        async def rpc(self, request, context):
            await self._unimplemented(name, context)
            yield  # an async generator, as gRPC expects of a streaming handler
    else:
        async def rpc(self, request, context):
            await self._unimplemented(name, context)
    rpc.__name__ = name
    setattr(MessagingService, name, rpc)


for _name, _streaming in (("PullMessage", True), ("UpdateOffset", False), ("GetOffset", False),
                          ("QueryOffset", False), ("RecallMessage", False),
                          ("SyncLiteSubscription", False)):
    _add_unimplemented(_name, _streaming)


__all__ = ["MessagingService", "SERVED"]

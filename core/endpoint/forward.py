"""A store that takes no writes (a slave, a fenced master) forwards MessagingService calls to
its master, as RocketMQ 5's proxy forwards to its brokers, so a client listing every node's
endpoint works whichever node its channel picked.

NOTE [ Clients and failover ]
The official clients dial one channel over every address they are given (the Python client:
``ipv4:a,b``, the addresses sorted, gRPC's pick_first), and route answers name the addresses
the client dialled (``route``): every call of such a client goes to one node, the first of
its addresses that accepts a connection, until that connection breaks. So each node must
answer every call:

- a writable master serves it;
- a slave (or a fenced master) that knows its master's client endpoint (mqstore's HA
  handshake tells it, NOTE [ Node fields ] in ``format.ha_hello``) forwards it there: the
  request and response bytes unchanged (gRPC generic handlers on raw bytes), the client's
  metadata (its access-key signature, its client id) and deadline with it, telemetry streams
  and long polls included;
- a node that cannot forward (no master endpoint known, the master unreachable) answers
  sends, receives, acks and invisible-time changes with FORBIDDEN, as the proxy answers a
  send with no writable queue ("go elsewhere"): the producer tries again, and its retries end
  there; route queries, heartbeats and telemetry it answers itself, so the client stays up.

When the master dies, a client whose channel was on it reconnects to the next address (the
slave); one whose channel was on the slave stays there. Either way, from the moment the slave
is promoted its calls are served: no client is reconfigured, and none waits for its 30 s route
refresh.

Over TLS (``server.grpc_tls_*``), the master's certificate is checked against this node's own
``grpc_tls_cert_file`` (one certificate naming every node, or a chain ending in the CA that
signed them all) and must name the host this node dials.

Bounds: forwarded calls pass the endpoint's guard (access keys, connection cap) and count
against ``grpc_max_concurrent_rpcs`` as any call; requests are at most
``grpc_max_request_bytes`` already; responses from the master at most that or a message's
size, whichever is larger; one channel to the master, replaced when the master changes.
"""

from __future__ import annotations

import asyncio
import logging

import grpc

from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2

log = logging.getLogger(__name__)
SERVICE = "apache.rocketmq.v2.MessagingService"
PREFIX = f"/{SERVICE}/"
# Calls a node that takes no writes refuses when it cannot forward, and their responses.
DATA = {"SendMessage": service_pb2.SendMessageResponse,
        "ReceiveMessage": service_pb2.ReceiveMessageResponse,
        "AckMessage": service_pb2.AckMessageResponse,
        "ChangeInvisibleDuration": service_pb2.ChangeInvisibleDurationResponse}
STREAMS = {"ReceiveMessage": "unary_stream", "PullMessage": "unary_stream",
           "Telemetry": "stream_stream"}
READY_WAIT_S = 1.0  # a telemetry stream waits this long for the master before it is local
HOP_HEADERS = {"user-agent", "te", "content-type", ":authority"}
CHANNEL_KEEPALIVE_MS = 10_000


def forwarded_metadata(context) -> tuple:
    """The client's metadata, less gRPC's own (hop by hop)."""
    return tuple((k, v) for k, v in context.invocation_metadata() or ()
                 if k not in HOP_HEADERS and not k.startswith("grpc-"))


def refusal_bytes(name: str, why: str) -> bytes:
    """A data call's response saying FORBIDDEN, serialized."""
    status = definition_pb2.Status(code=Code.FORBIDDEN, message=why)
    return DATA[name](status=status).SerializeToString()


def _serialized(response) -> bytes:
    """A forwarded response (bytes as they came) or one answered here (a message)."""
    return response if isinstance(response, bytes) else response.SerializeToString()


class Forwarder:
    """Calls to the master's endpoint, on the endpoint's loop. ``guard``: the MessagingService
    guard (``enter(context, peer)``, ``leave(peer)``); ``local(name)``: the servicer's own
    handler of a method (for the calls answered here when the master cannot be reached).
    ``target``: the master's endpoint the next calls go to (``RoleRouter`` sets it)."""

    def __init__(self, guard, local, max_response_bytes: int,
                 credentials: grpc.ChannelCredentials | None = None) -> None:
        """``credentials``: TLS to the master (None: plaintext)."""
        self._enter, self._leave = guard
        self._local = local
        self._max_response = max_response_bytes
        self._credentials = credentials
        self.target = ""
        self.local_service: grpc.GenericRpcHandler | None = None  # the servicer's handler
        self._target: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._handlers: dict[str, grpc.RpcMethodHandler] = {}

    def channel(self, target: str) -> grpc.aio.Channel:
        if target != self._target or self._channel is None:
            old = self._channel
            options = [("grpc.max_receive_message_length", self._max_response),
                       ("grpc.max_send_message_length", -1), ("grpc.enable_retries", 0),
                       ("grpc.keepalive_time_ms", CHANNEL_KEEPALIVE_MS)]
            self._channel = (grpc.aio.insecure_channel(target, options=options)
                             if self._credentials is None else
                             grpc.aio.secure_channel(target, self._credentials, options=options))
            self._target = target
            log.info("forwarding MessagingService calls to the master's endpoint %s", target)
            if old is not None:
                asyncio.ensure_future(old.close())
        return self._channel

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    def handler(self, name: str) -> grpc.RpcMethodHandler:
        """The forwarding handler of method ``name`` (one per method, kept)."""
        found = self._handlers.get(name)
        if found is None:
            kind = STREAMS.get(name, "unary_unary")
            make = {"unary_unary": (grpc.unary_unary_rpc_method_handler, self._unary),
                    "unary_stream": (grpc.unary_stream_rpc_method_handler, self._unary_stream),
                    "stream_stream": (grpc.stream_stream_rpc_method_handler, self._streams)}
            wrap, build = make[kind]
            found = self._handlers[name] = wrap(build(name), response_serializer=_serialized)
        return found

    # -- the calls ---------------------------------------------------------------------------
    def _unary(self, name: str):
        path = PREFIX + name

        async def rpc(request: bytes, context) -> bytes:
            peer, target = context.peer(), self.target
            self._enter(context, peer)
            try:
                call = self.channel(target).unary_unary(path)
                return await call(request, metadata=forwarded_metadata(context),
                                  timeout=context.time_remaining())
            except grpc.aio.AioRpcError as exc:
                if exc.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    return await self._unreached(name, request, context, target, exc)
                await context.abort(exc.code(), exc.details() or "")
            finally:
                self._leave(peer)
        return rpc

    async def _unreached(self, name: str, request: bytes, context, target: str, exc) -> bytes:
        why = _why(target, exc)
        if name in DATA:
            return refusal_bytes(name, why)
        handler = self._local(name)  # answered here: the client stays up
        return await handler.unary_unary(handler.request_deserializer(request), context)

    def _unary_stream(self, name: str):
        path = PREFIX + name

        async def rpc(request: bytes, context):
            peer, target = context.peer(), self.target
            self._enter(context, peer)
            answered = False
            try:
                call = self.channel(target).unary_stream(path)(
                    request, metadata=forwarded_metadata(context),
                    timeout=context.time_remaining())
                async for response in call:
                    answered = True
                    yield response
            except grpc.aio.AioRpcError as exc:
                unreached = exc.code() in (grpc.StatusCode.UNAVAILABLE,
                                           grpc.StatusCode.DEADLINE_EXCEEDED)
                if unreached and not answered and name in DATA:
                    yield refusal_bytes(name, _why(target, exc))
                else:
                    await context.abort(exc.code(), exc.details() or "")
            finally:
                self._leave(peer)
        return rpc

    def _streams(self, name: str):
        path = PREFIX + name

        async def rpc(requests, context):
            peer, target = context.peer(), self.target
            channel = self.channel(target)
            try:
                await asyncio.wait_for(channel.channel_ready(), READY_WAIT_S)
            except asyncio.TimeoutError:  # the master is not there: this node answers
                handler = self._local(name)
                async for response in _local_stream(handler, requests, context):
                    yield response
                return
            self._enter(context, peer)
            call = channel.stream_stream(path)(metadata=forwarded_metadata(context),
                                               timeout=context.time_remaining())
            pump = asyncio.ensure_future(_pump(requests, call))
            try:
                async for response in call:
                    yield response
            except grpc.aio.AioRpcError as exc:
                if exc.code() is not grpc.StatusCode.CANCELLED:
                    await context.abort(exc.code(), exc.details() or "")
            finally:
                pump.cancel()
                call.cancel()
                self._leave(peer)
        return rpc


async def _pump(requests, call) -> None:
    async for request in requests:
        await call.write(request)
    await call.done_writing()


async def _local_stream(handler, requests, context):
    """The servicer's own streaming handler, on raw request bytes; what it writes goes out
    through ``_serialized``."""
    async def decoded():
        async for raw in requests:
            yield handler.request_deserializer(raw)
    result = handler.stream_stream(decoded(), context)
    if hasattr(result, "__aiter__"):
        async for response in result:
            yield response
    else:  # a coroutine writing with context.write (the telemetry servicer's way)
        await result


class RoleRouter(grpc.GenericRpcHandler):
    """MessagingService's methods, each call to the store's role as it is then (NOTE [ Clients
    and failover ]): ``local``: the servicer's generic handler; ``store``: the served store
    (its ``role_state``); ``forwarder``: the master's endpoint. The handlers it hands out are
    kept per method and way, so the metrics interceptor wraps each once."""

    def __init__(self, local: grpc.GenericRpcHandler, store, forwarder: Forwarder) -> None:
        self._local = local
        self._store = store
        self._forwarder = forwarder
        self._refusals: dict[tuple[str, str], grpc.RpcMethodHandler] = {}

    def service(self, handler_call_details):
        method = handler_call_details.method
        if not method.startswith(PREFIX):
            return None
        name = method[len(PREFIX):]
        try:
            role = self._store.role_state
        except Exception:  # noqa: BLE001 - the store reopening: the servicer says so
            role = None
        if role is None or role.writable:
            return self._local.service(handler_call_details)
        target = role.master_endpoint if role.is_slave else None
        if target:
            self._forwarder.target = target
            return self._forwarder.handler(name)
        if name in DATA:
            return self._refusal(name, role.refusal() or "this node takes no writes")
        return self._local.service(handler_call_details)

    def _refusal(self, name: str, why: str) -> grpc.RpcMethodHandler:
        found = self._refusals.get((name, why))
        if found is None:
            text = (f"this node takes no writes ({why}) and knows no master endpoint to "
                    f"forward to: send to another endpoint, or promote this node (`mqstore "
                    f"role promote`)")
            answer = refusal_bytes(name, text)

            async def unary(request, context):
                return answer

            async def streaming(request, context):
                yield answer
            make = (grpc.unary_stream_rpc_method_handler if name in STREAMS
                    else grpc.unary_unary_rpc_method_handler)
            if len(self._refusals) > 64:
                self._refusals.clear()
            found = self._refusals[(name, why)] = make(
                streaming if name in STREAMS else unary)
        return found


def _why(target: str, exc: grpc.aio.AioRpcError) -> str:
    return (f"this node takes no writes and cannot reach its master's endpoint {target} "
            f"({exc.code().name}: {exc.details()}): send to another endpoint, or promote "
            f"this node (`mqstore role promote`)")


__all__ = ["Forwarder", "RoleRouter", "DATA", "PREFIX", "forwarded_metadata", "refusal_bytes"]

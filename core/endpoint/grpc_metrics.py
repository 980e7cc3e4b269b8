"""The gRPC endpoint's RPCs measured into ``rpc_metrics.RpcMetrics`` (NOTE [ RPC metrics ]):
a ``grpc.aio`` server interceptor wrapping each served method's handler.

Only the methods the endpoint serves are counted (MessagingService's, from its descriptor,
and the admin service's): a call naming any other method is left to gRPC, so a peer cannot
add label values. Each handler is wrapped once and the wrapper kept while gRPC hands out the
same handler.

An RPC's code is the status it ended with: the RocketMQ status of its (first) response, as
MessagingService answers refusals inside a successful RPC; else the gRPC status it was
aborted with (UNIMPLEMENTED, UNAUTHENTICATED ...), CANCELLED when the client went away,
UNKNOWN when the handler raised. A receive answered MESSAGE_NOT_FOUND (the poll found
nothing) is no error, nor a telemetry stream the client cancelled (its way of ending it). ReceiveMessage's responses also count the messages handed to the
group, and those handed out again (``delivery_attempt`` > 1).
"""

from __future__ import annotations

import asyncio
import inspect

import grpc

from mqstore.endpoint.admin_wire import METHODS as ADMIN_METHODS, SERVICE as ADMIN_SERVICE
from mqstore.endpoint.protocol import Code, service_pb2
from mqstore.endpoint.resources import group_name
from mqstore.endpoint.rpc_metrics import MethodMetrics, RpcMetrics

PROTOCOL = "grpc"
MESSAGING = service_pb2.DESCRIPTOR.services_by_name["MessagingService"]
RECEIVE = f"/{MESSAGING.full_name}/ReceiveMessage"
# Codes that are not errors, by method; every other method: OK only. A receive that found
# nothing says MESSAGE_NOT_FOUND; a client ends its telemetry stream by cancelling it.
SUCCESS = {RECEIVE: ("OK", "MESSAGE_NOT_FOUND"),
           f"/{MESSAGING.full_name}/Telemetry": ("OK", "CANCELLED")}
CODE_NAMES = {number: name for name, number in Code.items()}


def served_methods() -> dict[str, tuple[str, str]]:
    """``/service/method`` -> (service, method) of every method the endpoint serves."""
    known = {f"/{MESSAGING.full_name}/{m.name}": (MESSAGING.full_name, m.name)
             for m in MESSAGING.methods}
    known.update({f"/{ADMIN_SERVICE}/{name}": (ADMIN_SERVICE, name) for name in ADMIN_METHODS})
    return known


def response_code(response) -> str:
    """The RocketMQ status a response carries; OK for one without (the admin service's)."""
    try:
        if not response.HasField("status"):
            return "OK"
    except (AttributeError, ValueError):  # bytes, or a message with no status field
        return "OK"
    code = response.status.code
    return CODE_NAMES.get(code, str(code))


def failure_code(exc: BaseException, context) -> str:
    if isinstance(exc, (asyncio.CancelledError, GeneratorExit)):  # the client went away
        return "CANCELLED"
    code = context.code() if isinstance(exc, grpc.aio.AbortError) else None
    return code.name if isinstance(code, grpc.StatusCode) else "UNKNOWN"


class MetricsInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, metrics: RpcMetrics) -> None:
        self._metrics = metrics
        self._known = served_methods()
        self._wrapped: dict[str, tuple[grpc.RpcMethodHandler, grpc.RpcMethodHandler]] = {}

    async def intercept_service(self, continuation, handler_call_details):
        handler = await continuation(handler_call_details)
        path = handler_call_details.method
        if handler is None or path not in self._known:
            return handler
        cached = self._wrapped.get(path)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[path] = (handler, self._wrap(path, handler))
        return cached[1]

    def _wrap(self, path: str, handler) -> grpc.RpcMethodHandler:
        service, method = self._known[path]
        calls = self._metrics.method(PROTOCOL, service, method, SUCCESS.get(path, ("OK",)))
        codecs = {"request_deserializer": handler.request_deserializer,
                  "response_serializer": handler.response_serializer}
        if handler.unary_unary is not None:
            return grpc.unary_unary_rpc_method_handler(_unary(handler.unary_unary, calls),
                                                       **codecs)
        if handler.stream_unary is not None:
            return grpc.stream_unary_rpc_method_handler(_unary(handler.stream_unary, calls),
                                                        **codecs)
        deliveries = self._deliveries if path == RECEIVE else None
        if handler.unary_stream is not None:
            return grpc.unary_stream_rpc_method_handler(
                _streaming(handler.unary_stream, calls, deliveries), **codecs)
        return grpc.stream_stream_rpc_method_handler(
            _streaming(handler.stream_stream, calls, None), **codecs)

    def _deliveries(self, request, responses: list) -> None:
        """A receive's messages, counted once its stream ended (not a forwarded receive's,
        whose bytes go on undecoded: ``forward``)."""
        if isinstance(request, bytes):
            return
        attempts = [r.message.system_properties.delivery_attempt for r in responses
                    if r.HasField("message")]
        if attempts:
            self._metrics.delivered(PROTOCOL, group_name(request.group), len(attempts),
                                    sum(1 for a in attempts if a > 1))


def _unary(behavior, calls: MethodMetrics):
    async def rpc(request, context):
        started, code = calls.started(), "UNKNOWN"
        try:
            response = behavior(request, context)
            if inspect.isawaitable(response):
                response = await response
            code = response_code(response)
            return response
        except BaseException as exc:
            code = failure_code(exc, context)
            raise
        finally:
            calls.finished(started, code)
    return rpc


class _Writes:
    """A handler's context whose ``write``s are seen: the first response's code, and a
    receive's responses for its deliveries. Everything else is the context's."""

    def __init__(self, context, kept: list | None) -> None:
        self._context = context
        self.kept = kept
        self.code: str | None = None

    async def write(self, response) -> None:
        if self.code is None:
            self.code = response_code(response)
        if self.kept is not None:
            self.kept.append(response)  # a receive's: at most 32 messages
        await self._context.write(response)

    def __getattr__(self, name: str):
        return getattr(self._context, name)


def _writing(behavior, calls: MethodMetrics, deliveries):
    async def rpc(request, context):
        started, code = calls.started(), "UNKNOWN"
        writes = _Writes(context, [] if deliveries is not None else None)
        try:
            await behavior(request, writes)
            code = writes.code or "OK"
        except BaseException as exc:
            code = failure_code(exc, context)
            raise
        finally:
            calls.finished(started, code)
            if writes.kept:
                deliveries(request, writes.kept)
    return rpc


def _streaming(behavior, calls: MethodMetrics, deliveries):
    """The same kind of behavior as ``behavior``: an async generator of responses, or a
    coroutine writing them (``context.write``), which gRPC does not let a handler mix."""
    if not inspect.isasyncgenfunction(behavior):
        return _writing(behavior, calls, deliveries)

    async def rpc(request, context):
        started, code, first = calls.started(), "OK", True
        kept: list | None = [] if deliveries is not None else None
        try:
            async for response in behavior(request, context):
                if first:
                    code, first = response_code(response), False
                if kept is not None:
                    kept.append(response)  # a receive's: at most 32 messages
                yield response
        except BaseException as exc:
            code = failure_code(exc, context)
            raise
        finally:
            calls.finished(started, code)
            if kept:
                deliveries(request, kept)
    return rpc


__all__ = ["MetricsInterceptor", "served_methods", "response_code", "PROTOCOL"]

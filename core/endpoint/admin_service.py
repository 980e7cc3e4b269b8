"""The admin service (``admin_wire``): ``mqstore topic|group --server`` on the served store.

Every call passes the MessagingService's guard first (the access-key check, then the
connection cap: ``service.MessagingService.enter``), then its JSON arguments are checked
against the method's model, then the operation runs on ``admin`` (``ops.admin.ServedAdmin``,
handed in by ``mqstore serve``: the endpoint never imports the tools above it) on one thread
of its own, so a slow operation (a group's lag over many queues) never stalls the event loop,
and operations run one at a time, in the order they came. A method this service does not have
ends UNIMPLEMENTED naming those it has.
"""

from __future__ import annotations

import asyncio
import json
import logging
from concurrent.futures import ThreadPoolExecutor

import grpc
from pydantic import ValidationError

from mqstore.endpoint.admin_wire import ERROR_KEY, METHODS, SERVICE, code_of, named
from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError

log = logging.getLogger(__name__)
GUARD_CODES = {Code.UNAUTHORIZED: grpc.StatusCode.UNAUTHENTICATED,
               Code.TOO_MANY_REQUESTS: grpc.StatusCode.RESOURCE_EXHAUSTED}


class AdminService:
    """``admin``: the operations; ``enter(context, peer)`` and ``leave(peer)``: the
    MessagingService's guard."""

    def __init__(self, admin, enter, leave) -> None:
        self._admin = admin
        self._enter, self._leave = enter, leave
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="mqstore-admin")

    def handlers(self) -> list[grpc.GenericRpcHandler]:
        known = grpc.method_handlers_generic_handler(SERVICE, {
            name: grpc.unary_unary_rpc_method_handler(self._rpc(name)) for name in METHODS})
        return [known, _Unknown(self._guarded)]

    def close(self) -> None:
        """Waits for the operation under way: the store closes only after it."""
        self._thread.shutdown(wait=True)

    def _guarded(self, context) -> _Guard:
        return _Guard(self._enter, self._leave, context)

    def _rpc(self, name: str):
        method = METHODS[name]

        async def rpc(request: bytes, context) -> bytes:
            async with self._guarded(context):
                try:
                    arguments = method.arguments.model_validate_json(request or b"{}")
                except ValidationError as exc:
                    await _refuse(context, ValueError(_invalid(name, exc)))  # ends the call
                operation = getattr(self._admin, method.operation)
                try:
                    result = await asyncio.get_running_loop().run_in_executor(
                        self._thread, lambda: operation(**arguments.model_dump()))
                except Exception as exc:  # noqa: BLE001 - every refusal is an answer
                    if named(exc) is None:
                        log.exception("admin %s failed", name)
                        exc = RuntimeError(f"{name} failed: {type(exc).__name__}: {exc}")
                    await _refuse(context, exc)  # ends the call
                # default=str: what `--json` prints of a value JSON has no type for.
                return json.dumps(result, default=str).encode()
        return rpc


class _Guard:
    """The guard around one call: entered (or the call ends with the guard's refusal), and
    left when the call ends."""

    def __init__(self, enter, leave, context) -> None:
        self._enter, self._leave, self._context = enter, leave, context
        self._peer = context.peer()
        self._entered = False

    async def __aenter__(self) -> None:
        try:
            self._enter(self._context, self._peer)
        except EndpointError as exc:
            await self._context.abort(GUARD_CODES.get(exc.code, grpc.StatusCode.INTERNAL),
                                      exc.message)
        self._entered = True

    async def __aexit__(self, *exc_info) -> None:
        if self._entered:
            self._leave(self._peer)


class _Unknown(grpc.GenericRpcHandler):
    """Methods of the service it does not have: UNIMPLEMENTED, after the guard."""

    def __init__(self, guarded) -> None:
        self._guarded = guarded

    def service(self, handler_call_details):
        prefix = f"/{SERVICE}/"
        if not handler_call_details.method.startswith(prefix):
            return None
        name = handler_call_details.method[len(prefix):]

        async def rpc(request: bytes, context) -> bytes:
            async with self._guarded(context):
                await context.abort(grpc.StatusCode.UNIMPLEMENTED, (
                    f"{SERVICE} has no method {name!r}; it has {', '.join(METHODS)}"))
            return b""
        return grpc.unary_unary_rpc_method_handler(rpc)


async def _refuse(context, exc: BaseException) -> None:
    """Ends the call with ``exc`` as its refusal (``context.abort`` raises, never returns)."""
    cls = named(exc)
    metadata = ((ERROR_KEY, cls.__name__),) if cls is not None else ()
    await context.abort(code_of(exc), str(exc), trailing_metadata=metadata)


def _invalid(name: str, exc: ValidationError) -> str:
    problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'the request'}: {e['msg']}"
                         for e in exc.errors())
    return f"{SERVICE}/{name}: bad request: {problems}"


__all__ = ["AdminService"]

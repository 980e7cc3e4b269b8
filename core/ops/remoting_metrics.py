"""The remoting server's requests in the endpoints' RPC metrics (NOTE [ RPC metrics ]):
``protocol="remoting"``, the request code's RocketMQ name as the method, the response code's
name as an error's code. Only the codes RocketMQ names get a label of their own; a peer
inventing codes is counted under ``OTHER``, so it cannot grow the label set."""

from __future__ import annotations

from typing import Callable

from mqstore.remoting.codes import Req, Resp

OTHER = "OTHER"
# Codes that answer as the client expects though they are not SUCCESS: a pull that found
# nothing (long polling's usual end), a query that found nothing.
_NOT_ERRORS = ("SUCCESS", "PULL_NOT_FOUND", "PULL_RETRY_IMMEDIATELY", "QUERY_NOT_FOUND")


def _names(codes: type) -> dict[int, str]:
    return {value: name for name, value in vars(codes).items()
            if name.isupper() and isinstance(value, int)}


def observer(metrics) -> Callable[[int, int, float], None] | None:
    """``observe(request code, response code, seconds)`` recording into ``metrics`` (an
    ``endpoint.rpc_metrics.RpcMetrics``), or None without metrics."""
    if metrics is None:
        return None
    requests, responses = _names(Req), _names(Resp)
    methods = {}

    def observe(request: int, response: int, seconds: float) -> None:
        name = requests.get(request, OTHER)
        method = methods.get(name)
        if method is None:
            method = methods[name] = metrics.method("remoting", "broker", name, _NOT_ERRORS)
        method.record(seconds, responses.get(response, str(response) if response < 1000
                                             else OTHER))
    return observe


__all__ = ["observer"]

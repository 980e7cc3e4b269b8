"""The endpoints' RPC metrics, whatever protocol carries the RPCs.

NOTE [ RPC metrics ]
One ``RpcMetrics`` per ``mqstore serve``, registered on the registry its ``/metrics`` serves.
An endpoint records into it through an adapter of its own (the gRPC endpoint:
``grpc_metrics.MetricsInterceptor``; the remoting endpoint: its request dispatch), labelled
with its ``protocol``, and nothing here knows a framework:

    mqstore_rpc_requests_total{protocol, service, method}           RPCs received
    mqstore_rpc_errors_total{protocol, service, method, code}       RPCs that ended with a
        status other than success, by that status (the protocol's own code name: RocketMQ's
        ``TOO_MANY_REQUESTS``, gRPC's ``UNIMPLEMENTED`` ...)
    mqstore_rpc_duration_seconds{protocol, service, method}         histogram of the time
        from an RPC's start to its end (a long poll's wait included; a stream's whole life)
    mqstore_rpc_in_flight_requests{protocol, service, method}       RPCs under way
    mqstore_rpc_long_polls{protocol}                                receives waiting for
        messages now (read from the endpoint at each scrape: ``watch_long_polls``)
    mqstore_consumer_deliveries_total{protocol, group}              messages handed out
    mqstore_consumer_redeliveries_total{protocol, group}            of them, handed out again
        (delivery attempt > 1: the group did not acknowledge in time)
    mqstore_consumer_dead_letters_total{group}                      messages this serve
        moved to the group's dead-letter queue since it started, past their last attempt or
        forwarded (``dead_lettered``, told by the store: ``watch_dead_letters``); 0 for every
        group that received until then

Labels are bounded by what the operator deploys, never by what a peer sends: an adapter
records only the methods its endpoint serves (an unknown method name is not counted) and
groups that received messages. Every instrument is prometheus_client's, safe to update on
the endpoints' threads while the HTTP server's threads scrape; per RPC the hot path costs
three increments of label children resolved once per method (``MethodMetrics``), one
histogram observation, and per receive one count of what it delivered.
"""

from __future__ import annotations

import time
from typing import Callable, Iterable

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.registry import CollectorRegistry

RPC_LABELS = ("protocol", "service", "method")
# From half a millisecond (a heartbeat) to a minute (a long poll is at most 20 s by default).
DURATION_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0,
                    2.5, 5.0, 10.0, 30.0, 60.0)


class MethodMetrics:
    """One method's instruments (its label children, resolved once); ``started`` then
    ``finished`` around each RPC."""

    __slots__ = ("_requests", "_in_flight", "_duration", "_errors", "_labels", "_ok",
                 "_error_children")

    def __init__(self, metrics: "RpcMetrics", labels: tuple[str, str, str],
                 ok: frozenset[str]) -> None:
        self._requests = metrics.requests.labels(*labels)
        self._in_flight = metrics.in_flight.labels(*labels)
        self._duration = metrics.duration.labels(*labels)
        self._errors = metrics.errors
        self._labels = labels
        self._ok = ok
        self._error_children: dict[str, Counter] = {}

    def started(self) -> float:
        self._requests.inc()
        self._in_flight.inc()
        return time.perf_counter()

    def finished(self, started: float, code: str) -> None:
        self._in_flight.dec()
        self._duration.observe(time.perf_counter() - started)
        if code not in self._ok:
            child = self._error_children.get(code)
            if child is None:
                child = self._error_children[code] = self._errors.labels(*self._labels, code)
            child.inc()

    def record(self, seconds: float, code: str) -> None:
        """One RPC already answered, ``seconds`` after it began (for servers that report a
        request once it is over: it was never counted in flight)."""
        self._requests.inc()
        self._duration.observe(seconds)
        if code not in self._ok:
            child = self._error_children.get(code)
            if child is None:
                child = self._error_children[code] = self._errors.labels(*self._labels, code)
            child.inc()


class RpcMetrics:
    """NOTE [ RPC metrics ]: the instruments, and what endpoints call."""

    def __init__(self) -> None:
        self.requests = Counter("mqstore_rpc_requests", "RPCs received.", RPC_LABELS,
                                registry=None)
        self.errors = Counter("mqstore_rpc_errors", "RPCs that ended with a status other "
                              "than success, by that status.", (*RPC_LABELS, "code"),
                              registry=None)
        self.duration = Histogram("mqstore_rpc_duration_seconds", "Time from an RPC's start "
                                  "to its end (a long poll's wait included).", RPC_LABELS,
                                  buckets=DURATION_BUCKETS, registry=None)
        self.in_flight = Gauge("mqstore_rpc_in_flight_requests", "RPCs under way.",
                               RPC_LABELS, registry=None)
        self.long_polls = Gauge("mqstore_rpc_long_polls", "Receives waiting for messages.",
                                ("protocol",), registry=None)
        self.deliveries = Counter("mqstore_consumer_deliveries", "Messages handed to a "
                                  "consumer group by receives.", ("protocol", "group"),
                                  registry=None)
        self.redeliveries = Counter("mqstore_consumer_redeliveries", "Messages handed to a "
                                    "consumer group again (delivery attempt > 1).",
                                    ("protocol", "group"), registry=None)
        self.dead_letters = Counter("mqstore_consumer_dead_letters", "Messages of a group "
                                    "moved to its dead-letter queue after their last "
                                    "delivery attempt.", ("group",), registry=None)
        self._groups: set[str] = set()

    def instruments(self) -> tuple:
        return (self.requests, self.errors, self.duration, self.in_flight, self.long_polls,
                self.deliveries, self.redeliveries, self.dead_letters)

    def register(self, registry: CollectorRegistry) -> None:
        for instrument in self.instruments():
            registry.register(instrument)

    def method(self, protocol: str, service: str, method: str,
               ok: Iterable[str] = ("OK",)) -> MethodMetrics:
        """The instruments of one method; ``ok``: the codes that are not errors."""
        return MethodMetrics(self, (protocol, service, method), frozenset(ok))

    def watch_long_polls(self, protocol: str, count: Callable[[], int]) -> None:
        """``count()`` (the endpoint's receives waiting now) is read at each scrape, on the
        scraping thread: it must be safe to call from any thread."""
        self.long_polls.labels(protocol).set_function(count)

    def delivered(self, protocol: str, group: str, messages: int, again: int) -> None:
        """One receive handed ``messages`` to ``group``, ``again`` of them not for the first
        time."""
        if group not in self._groups:
            self._groups.add(group)
            self.dead_letters.labels(group)  # shown at 0 from the group's first delivery
        self.deliveries.labels(protocol, group).inc(messages)
        self.redeliveries.labels(protocol, group).inc(again)

    def dead_lettered(self, group: str, count: int = 1) -> None:
        """``count`` messages of ``group`` went to its dead-letter queue."""
        self._groups.add(group)
        self.dead_letters.labels(group).inc(count)


__all__ = ["RpcMetrics", "MethodMetrics", "DURATION_BUCKETS"]

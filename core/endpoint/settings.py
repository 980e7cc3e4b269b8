"""Telemetry's Settings and the clients the endpoint knows (by ``x-mq-client-id``).

A client opens one Telemetry stream per endpoint and writes its Settings (type, access point,
request timeout, the topics it publishes or its group's subscriptions), again a second later
and then every five minutes. Each is answered, as the Apache proxy's GrpcClientSettingsManager
answers it, with the client's Settings filled in:

    every client   metric.on = false
    producer       backoff_policy: 3 attempts, exponential 10 ms .. 1 s, x2 (the proxy's
                   defaults; the Java producer refuses any other strategy);
                   publishing.max_body_size = commit_log.max_message_bytes (the Python
                   producer copies it: a reply without it makes every send refused locally),
                   publishing.validate_message_type = true
    consumer       backoff_policy: the group's retryMaxTimes + 1 attempts (its config,
                   config/subscriptionGroup.json; RocketMQ's default 16 + 1 = 17), customized
                   with store.message_delay_levels (a group's default retry policy);
                   subscription.receive_batch_size = 32, long_polling_timeout =
                   server.grpc_max_long_polling_ms, fifo = the group's
                   consumeMessageOrderly (a FIFO group: NOTE [ FIFO groups ])

``Sessions`` keeps each client's last Settings and when it was last heard from (Telemetry,
and the Heartbeat every client sends every 10 s); a client silent for
``server.grpc_client_idle_ms`` is forgotten (its next Settings brings it back).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from google.protobuf.duration_pb2 import Duration

from mqstore.config import StoreConfig, parse_delay_levels
from mqstore.endpoint.protocol import Code, Settings, definition_pb2
from mqstore.endpoint.status import EndpointError

PRODUCER_MAX_ATTEMPTS = 3
PRODUCER_BACKOFF_INITIAL_MS = 10
PRODUCER_BACKOFF_MAX_MS = 1000
PRODUCER_BACKOFF_MULTIPLIER = 2
CONSUMER_MAX_ATTEMPTS = 17
RECEIVE_BATCH_SIZE = 32
SESSIONS_PER_CONNECTION = 8  # client ids one connection may bring, on average


def _duration(ms: int) -> Duration:
    d = Duration()
    d.FromMilliseconds(ms)
    return d


class SettingsPolicy:
    """How the endpoint fills in a client's Settings (the store's limits, the proxy's
    defaults)."""

    def __init__(self, config: StoreConfig) -> None:
        self.max_body_bytes = config.commit_log.max_message_bytes
        self.long_polling = _duration(config.server.grpc_max_long_polling_ms)
        self.producer_backoff = definition_pb2.RetryPolicy(
            max_attempts=PRODUCER_MAX_ATTEMPTS,
            exponential_backoff=definition_pb2.ExponentialBackoff(
                initial=_duration(PRODUCER_BACKOFF_INITIAL_MS),
                max=_duration(PRODUCER_BACKOFF_MAX_MS),
                multiplier=PRODUCER_BACKOFF_MULTIPLIER))
        self.consumer_backoff = definition_pb2.RetryPolicy(
            max_attempts=CONSUMER_MAX_ATTEMPTS,
            customized_backoff=definition_pb2.CustomizedBackoff(next=[
                _duration(ms) for ms in parse_delay_levels(config.store.message_delay_levels)]))

    def fill(self, client: Settings, max_attempts=None, fifo=None) -> Settings:
        """The client's Settings filled in; ``max_attempts(group)``: a consumer group's
        deliveries of a message (None: RocketMQ's default, 17); ``fifo(group)``: whether it
        is a FIFO group (None: none is)."""
        out = Settings()
        out.CopyFrom(client)
        if client.HasField("publishing"):
            out.backoff_policy.CopyFrom(self.producer_backoff)
            out.publishing.max_body_size = self.max_body_bytes
            out.publishing.validate_message_type = True
        elif client.HasField("subscription"):
            out.backoff_policy.CopyFrom(self.consumer_backoff)
            if max_attempts is not None and client.subscription.group.name:
                out.backoff_policy.max_attempts = max_attempts(client.subscription.group.name)
            sub = out.subscription
            sub.receive_batch_size = RECEIVE_BATCH_SIZE
            sub.long_polling_timeout.CopyFrom(self.long_polling)
            group = client.subscription.group.name
            sub.fifo = bool(fifo is not None and group and fifo(group))
        out.metric.Clear()
        out.metric.on = False
        return out


@dataclass
class Session:
    client_type: int
    settings: Settings | None
    last_seen: float


class Sessions:
    """The clients heard from, by client id. Only the event loop's thread calls it."""

    def __init__(self, max_sessions: int, idle_ms: int, clock=time.monotonic) -> None:
        self.max_sessions = max_sessions
        self._idle_s = idle_ms / 1000.0
        self._clock = clock
        self._sessions: dict[str, Session] = {}

    def seen(self, client_id: str, client_type: int, settings: Settings | None = None) -> None:
        session = self._sessions.get(client_id)
        if session is None:
            if len(self._sessions) >= self.max_sessions:
                self.forget_idle()
                if len(self._sessions) >= self.max_sessions:
                    raise EndpointError(Code.TOO_MANY_REQUESTS, (
                        f"{len(self._sessions)} clients are connected, the most this "
                        f"endpoint keeps; try again later"))
            session = self._sessions[client_id] = Session(client_type, settings, 0.0)
        if settings is not None:
            session.settings = settings
        session.last_seen = self._clock()

    def get(self, client_id: str) -> Session | None:
        return self._sessions.get(client_id)

    def drop(self, client_id: str) -> None:
        self._sessions.pop(client_id, None)

    def forget_idle(self) -> list[str]:
        before = self._clock() - self._idle_s
        gone = [c for c, s in self._sessions.items() if s.last_seen < before]
        for client_id in gone:
            del self._sessions[client_id]
        return gone

    def __len__(self) -> int:
        return len(self._sessions)


__all__ = ["SettingsPolicy", "Sessions", "Session"]

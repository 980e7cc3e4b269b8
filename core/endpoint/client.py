"""``mqstore produce|consume --server HOST:PORT``: the commands through a served store's gRPC
endpoint, with the official RocketMQ 5 Python client (any number of processes, any host).

The client is imported only here (it logs to ``~/logs/rocketmq_python``). Sends are
synchronous, one message per RPC, as the client sends them; a consumer receives with the
client's SimpleConsumer, prints, then acknowledges what it printed (at least once: a message
printed but not acknowledged when the process dies comes back after ``INVISIBLE_S``).
"""

from __future__ import annotations

import base64
import threading
from typing import Callable, Iterable, Sequence

from mqstore.config import parse_listen

INVISIBLE_S = 30  # how long a received message stays invisible until it is acknowledged
FOLLOW_AWAIT_S = 20  # a following consumer's long poll (the proxy's longest)
CATCH_UP_AWAIT_S = 1  # without --follow: a receive that waits this long for nothing ends it
RECEIVE_BATCH = 32
STOP_CHECK_S = 0.1  # a stop (Ctrl-C, SIGTERM) ends a long poll this soon


def check_server(server: str) -> str:
    """``HOST:PORT`` (ValueError naming the rule otherwise)."""
    parse_listen(server)
    return server


def _client():
    import rocketmq  # the grpc extra
    return rocketmq


def _configuration(rocketmq, server: str, access_key: str, secret_key: str, namespace: str):
    return rocketmq.ClientConfiguration(server, rocketmq.Credentials(access_key, secret_key),
                                        namespace=namespace)


def produce(server: str, topic: str,
            messages: Iterable[tuple[bytes, str | None, Sequence[str], dict[str, str]]], *,
            access_key: str = "", secret_key: str = "", namespace: str = "",
            on_sent: Callable[[dict], None] = lambda row: None) -> list[dict]:
    """Send each ``(body, tags, keys, properties)``; ``{"msg_id", "queue_offset", "size"}``
    per message sent. A refusal raises the client's exception (its message carries RocketMQ's
    code)."""
    rocketmq = _client()
    producer = rocketmq.Producer(_configuration(rocketmq, server, access_key, secret_key,
                                                namespace), (topic,))
    producer.startup()
    rows = []
    try:
        for body, tags, keys, properties in messages:
            msg = rocketmq.Message()
            msg.topic = topic
            msg.body = body
            if tags:
                msg.tag = tags
            for key in keys:
                msg.keys = key
            for name, value in (properties or {}).items():
                msg.add_property(name, value)
            receipt = producer.send(msg)
            row = {"msg_id": receipt.message_id, "queue_offset": receipt.offset,
                   "size": len(body)}
            rows.append(row)
            on_sent(row)
    finally:
        producer.shutdown()
    return rows


def message_row(m) -> dict:
    """A received message as a plain dict (what the client exposes of it)."""
    body = m.body or b""
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        text = None
    return {"topic": m.topic, "msg_id": m.message_id, "tags": m.tag, "keys": sorted(m.keys),
            "properties": dict(m.properties), "born_timestamp": m.born_timestamp,
            "born_host": m.born_host, "delivery_attempt": m.delivery_attempt, "body": text,
            "body_base64": base64.b64encode(body).decode("ascii")}


def consume(server: str, topic: str, group: str, expression: str | None, sql: bool,
            limit: int | None, follow: bool, stop: threading.Event,
            show: Callable[[list[dict]], int], *, access_key: str = "", secret_key: str = "",
            namespace: str = "") -> int:
    """Receive, show (``show`` returns how many it printed) and acknowledge, until caught up
    (or ``stop``, or ``limit`` messages); the count acknowledged."""
    rocketmq = _client()
    from rocketmq.grpc_protocol import FilterType
    kind = FilterType.SQL if sql else FilterType.TAG
    subscription = {topic: rocketmq.FilterExpression(expression or "*", kind)}
    consumer = rocketmq.SimpleConsumer(
        _configuration(rocketmq, server, access_key, secret_key, namespace), group,
        subscription, await_duration=FOLLOW_AWAIT_S if follow else CATCH_UP_AWAIT_S)
    consumer.startup()
    count = 0
    try:
        while not stop.is_set():
            want = RECEIVE_BATCH if limit is None else min(RECEIVE_BATCH, limit - count)
            if want <= 0:
                break
            pending = consumer.receive_async(want, INVISIBLE_S)
            while not pending.done() and not stop.wait(STOP_CHECK_S):
                pass
            if not pending.done():  # stopped mid-poll: what it pops comes back later
                break
            received = pending.result()
            if not received:
                if follow:
                    continue
                break
            shown = show([message_row(m) for m in received])
            for m in received[:shown]:
                consumer.ack(m)
            count += shown
            if shown < len(received):  # the output went away
                break
    finally:
        consumer.shutdown()
    return count


__all__ = ["produce", "consume", "check_server", "message_row"]

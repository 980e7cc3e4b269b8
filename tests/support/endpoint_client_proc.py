"""A producer or a consumer of the official RocketMQ 5 Python client in its own process, for
the endpoint tests: ``python endpoint_client_proc.py produce <endpoint> <topic> <name> <n>``
or ``... consume <endpoint> <topic> <group> <withhold> <stop file>``.

A producer sends ``n`` messages with bodies ``<name>-<i>``, printing ``sent <body>`` once each
send returned. A consumer receives until the stop file exists, printing ``got <body>
<attempt>`` for every delivery and ``acked <body>`` once its ack returned (``stale <body>``
when the ack came after the invisible time and the message had gone to another delivery); it
withholds the ack of a first delivery whose body ends in one of the comma-separated
``withhold`` suffixes (that message must come back). Each line is flushed at once.

``fifo-consume`` (``... fifo-consume <endpoint> <topic> <group> <stop file>``) prints
``ready`` once started, receives as ``consume`` does, acknowledging everything, and prints
``got <body> <attempt> <t>`` and ``acking <body> <t>`` (``t``: CLOCK_MONOTONIC, one clock for
every process of the machine) so a test can tell, across processes, that a message was handed
out only after the one before it was being acknowledged.

``half`` (``... half <endpoint> <topic> <body>``) sends one transaction's half, prints
``sent <message id>`` and waits to be killed.

``failover-produce`` and ``failover-consume`` (same arguments; the endpoint may list several,
``a;b``) go on through a failover: a send that fails is tried again (a new message with the
same body) until one is answered OK, printing ``failed <body> <error>`` for each failure; a
receive that fails is tried again; ``got`` lines carry the message id as a fourth word (a
delivery of the same id again is a redelivery; a body sent twice has two ids), and an ack that
fails prints ``ackfailed <body> <id>``.
"""

from __future__ import annotations

import os
import sys
import time

from endpoint_support import CLIENT_REQUEST_TIMEOUT_S

INVISIBLE_S = 2


def main(argv: list[str]) -> int:
    import rocketmq
    from rocketmq.v5.exception import BadRequestException

    mode, endpoint, topic = argv[1:4]
    if mode.startswith("failover-"):
        return through_failover(mode, endpoint, topic, argv)
    config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(),
                                          request_timeout=CLIENT_REQUEST_TIMEOUT_S)
    if mode == "produce":
        name, count = argv[4], int(argv[5])
        producer = rocketmq.Producer(config, (topic,))
        producer.startup()
        for i in range(count):
            msg = rocketmq.Message()
            msg.topic = topic
            msg.body = f"{name}-{i}".encode()
            producer.send(msg)
            print("sent", msg.body.decode(), flush=True)
        producer.shutdown()
        return 0
    if mode == "half":  # one transaction's half, never ended: the process is killed
        name = argv[4]
        producer = rocketmq.Producer(config, (topic,), checker=_Undecided())
        producer.startup()
        msg = rocketmq.Message()
        msg.topic = topic
        msg.body = name.encode()
        receipt = producer.send(msg, transaction=producer.begin_transaction())
        print("sent", receipt.message_id, flush=True)
        time.sleep(3600)
        return 1
    if mode == "fifo-consume":
        return fifo_consume(rocketmq, config, topic, argv[4], argv[5])
    group, withhold, stop_file = argv[4], argv[5].split(","), argv[6]
    consumer = rocketmq.SimpleConsumer(config, group, {topic: rocketmq.FilterExpression()},
                                       await_duration=1)
    consumer.startup()
    while not os.path.exists(stop_file):
        for msg in consumer.receive(16, INVISIBLE_S):
            body = msg.body.decode()
            print("got", body, msg.delivery_attempt, flush=True)
            if msg.delivery_attempt == 1 and any(body.endswith(s) for s in withhold if s):
                continue
            try:
                consumer.ack(msg)
            except BadRequestException:
                print("stale", body, flush=True)
                continue
            print("acked", body, flush=True)
    consumer.shutdown()
    return 0


def fifo_consume(rocketmq, config, topic: str, group: str, stop_file: str) -> int:
    consumer = rocketmq.SimpleConsumer(config, group, {topic: rocketmq.FilterExpression()},
                                       await_duration=1)
    consumer.startup()
    print("ready", flush=True)
    while not os.path.exists(stop_file):
        batch = consumer.receive(4, 30)
        now = time.clock_gettime(time.CLOCK_MONOTONIC)
        for msg in batch:
            print("got", msg.body.decode(), msg.delivery_attempt, now, flush=True)
        for msg in batch:
            print("acking", msg.body.decode(), time.clock_gettime(time.CLOCK_MONOTONIC),
                  flush=True)
            consumer.ack(msg)
    consumer.shutdown()
    return 0


class _Undecided:
    """A transaction checker that never decides (the process is killed before it could)."""

    def check(self, message):
        from rocketmq import TransactionResolution
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


def through_failover(mode: str, endpoint: str, topic: str, argv: list[str]) -> int:
    import rocketmq
    # Short: a call to a paused master must give up in time to go elsewhere.
    config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(), request_timeout=5)
    if mode == "failover-produce":
        name, count = argv[4], int(argv[5])
        producer = rocketmq.Producer(config, (topic,))
        producer.startup()
        for i in range(count):
            body = f"{name}-{i}"
            while True:
                msg = rocketmq.Message()
                msg.topic, msg.body = topic, body.encode()
                try:
                    producer.send(msg)
                    break
                except Exception as exc:  # noqa: BLE001 - no master for a while: again
                    print("failed", body, type(exc).__name__, flush=True)
                    time.sleep(0.2)
            print("sent", body, flush=True)
        producer.shutdown()
        return 0
    if mode == "half":  # one transaction's half, never ended: the process is killed
        name = argv[4]
        producer = rocketmq.Producer(config, (topic,), checker=_Undecided())
        producer.startup()
        msg = rocketmq.Message()
        msg.topic = topic
        msg.body = name.encode()
        receipt = producer.send(msg, transaction=producer.begin_transaction())
        print("sent", receipt.message_id, flush=True)
        time.sleep(3600)
        return 1
    group, withhold, stop_file = argv[4], argv[5].split(","), argv[6]
    consumer = rocketmq.SimpleConsumer(config, group, {topic: rocketmq.FilterExpression()},
                                       await_duration=1)
    consumer.startup()
    while not os.path.exists(stop_file):
        try:
            batch = consumer.receive(16, INVISIBLE_S)
        except Exception as exc:  # noqa: BLE001 - no master for a while: again
            print("error", type(exc).__name__, flush=True)
            time.sleep(0.2)
            continue
        for msg in batch:
            body = msg.body.decode()
            print("got", body, msg.delivery_attempt, msg.message_id, flush=True)
            if msg.delivery_attempt == 1 and any(body.endswith(s) for s in withhold if s):
                continue
            try:
                consumer.ack(msg)
            except Exception:  # noqa: BLE001 - it comes back: counted as a redelivery
                print("ackfailed", body, msg.message_id, flush=True)
                continue
            print("acked", body, msg.message_id, flush=True)
    consumer.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

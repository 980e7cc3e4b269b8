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

    mode, endpoint, topic = argv[1:4]
    failover = mode.startswith("failover-")
    # Short through a failover: a call to a paused master must give up in time to go elsewhere.
    config = rocketmq.ClientConfiguration(
        endpoint, rocketmq.Credentials(),
        request_timeout=5 if failover else CLIENT_REQUEST_TIMEOUT_S)
    if mode.endswith("produce"):
        return produce(rocketmq, config, topic, argv[4], int(argv[5]), retry=failover)
    if mode == "half":
        return half(rocketmq, config, topic, argv[4])
    consumer = rocketmq.SimpleConsumer(config, argv[4], {topic: rocketmq.FilterExpression()},
                                       await_duration=1)
    consumer.startup()
    if mode == "fifo-consume":
        print("ready", flush=True)
        consume(consumer, argv[5], 4, 30, ack_in_order)
    else:
        consume(consumer, argv[6], 16, INVISIBLE_S, acking(argv[5].split(","), failover),
                retry=failover)
    consumer.shutdown()
    return 0


def produce(rocketmq, config, topic: str, name: str, count: int, retry: bool) -> int:
    """Send ``<name>-<i>`` one at a time; with ``retry`` a failed send is tried again (a new
    message with the same body) until one is answered OK."""
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
                if not retry:
                    raise
                print("failed", body, type(exc).__name__, flush=True)
                time.sleep(0.2)
        print("sent", body, flush=True)
    producer.shutdown()
    return 0


def half(rocketmq, config, topic: str, name: str) -> int:
    """One transaction's half, never ended: the process is killed."""
    producer = rocketmq.Producer(config, (topic,), checker=_Undecided())
    producer.startup()
    msg = rocketmq.Message()
    msg.topic = topic
    msg.body = name.encode()
    receipt = producer.send(msg, transaction=producer.begin_transaction())
    print("sent", receipt.message_id, flush=True)
    time.sleep(3600)
    return 1


def consume(consumer, stop_file: str, count: int, invisible_s: int, take,
            retry: bool = False) -> None:
    """Receive up to ``count`` messages at a time, invisible ``invisible_s``, and hand each
    batch to ``take(consumer, batch)``, until the stop file exists; with ``retry`` a receive
    that fails is tried again."""
    while not os.path.exists(stop_file):
        try:
            batch = consumer.receive(count, invisible_s)
        except Exception as exc:  # noqa: BLE001 - no master for a while: again
            if not retry:
                raise
            print("error", type(exc).__name__, flush=True)
            time.sleep(0.2)
            continue
        take(consumer, batch)


def acking(withhold: list[str], failover: bool):
    """What ``consume`` and ``failover-consume`` do with a batch: each message acknowledged
    but a withheld first delivery. An ack refused as stale prints ``stale``; through a
    failover any failed ack prints ``ackfailed`` (the message comes back: counted as a
    redelivery), and the lines carry the message id."""
    from rocketmq.v5.exception import BadRequestException

    refused, word = (Exception, "ackfailed") if failover else (BadRequestException, "stale")

    def take(consumer, batch) -> None:
        for msg in batch:
            body = msg.body.decode()
            ident = (msg.message_id,) if failover else ()
            print("got", body, msg.delivery_attempt, *ident, flush=True)
            if msg.delivery_attempt == 1 and any(body.endswith(s) for s in withhold if s):
                continue
            try:
                consumer.ack(msg)
            except refused:
                print(word, body, *ident, flush=True)
                continue
            print("acked", body, *ident, flush=True)
    return take


def ack_in_order(consumer, batch) -> None:
    """What ``fifo-consume`` does with a batch: say it was handed out, then acknowledge each
    message in turn, saying when."""
    now = time.clock_gettime(time.CLOCK_MONOTONIC)
    for msg in batch:
        print("got", msg.body.decode(), msg.delivery_attempt, now, flush=True)
    for msg in batch:
        print("acking", msg.body.decode(), time.clock_gettime(time.CLOCK_MONOTONIC),
              flush=True)
        consumer.ack(msg)


class _Undecided:
    """A transaction checker that never decides (the process is killed before it could)."""

    def check(self, message):
        from rocketmq import TransactionResolution
        return TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED


if __name__ == "__main__":
    sys.exit(main(sys.argv))

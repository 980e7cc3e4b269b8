"""A producer or a consumer of the official RocketMQ 5 Python client in its own process, for
the endpoint tests: ``python endpoint_client_proc.py produce <endpoint> <topic> <name> <n>``
or ``... consume <endpoint> <topic> <group> <withhold> <stop file>``.

A producer sends ``n`` messages with bodies ``<name>-<i>``, printing ``sent <body>`` once each
send returned. A consumer receives until the stop file exists, printing ``got <body>
<attempt>`` for every delivery and ``acked <body>`` once its ack returned (``stale <body>``
when the ack came after the invisible time and the message had gone to another delivery); it
withholds the ack of a first delivery whose body ends in one of the comma-separated
``withhold`` suffixes (that message must come back). Each line is flushed at once.
"""

from __future__ import annotations

import os
import sys

from endpoint_support import CLIENT_REQUEST_TIMEOUT_S

INVISIBLE_S = 2


def main(argv: list[str]) -> int:
    import rocketmq
    from rocketmq.v5.exception import BadRequestException

    mode, endpoint, topic = argv[1:4]
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


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""RocketMQ's C++ client (PyPI ``rocketmq==0.4.4``) against a broker, in a process of its own
(its module is named ``rocketmq`` like the gRPC client's: the caller puts its directory first
on PYTHONPATH). Prints one JSON document on its last line.

    cpp_client_proc.py produce ADDR TOPIC COUNT            sync sends with keys, tags, properties
    cpp_client_proc.py consume ADDR TOPIC GROUP COUNT EXPR  a push consumer until COUNT arrived
    cpp_client_proc.py batch ADDR TOPIC                      send_batch of two messages
    cpp_client_proc.py delay ADDR TOPIC COUNT LEVEL          sync sends at a delay level
    cpp_client_proc.py orderly ADDR TOPIC GROUP COUNT        an orderly push consumer until COUNT
                                                             arrived; prints "consumed", then
                                                             shuts down when stdin closes
"""

from __future__ import annotations

import json
import sys
import threading
import time

from rocketmq.client import Message, Producer, PushConsumer

WAIT_S = 60


def produce(addr: str, topic: str, count: int, level: int = 0) -> dict:
    producer = Producer("cpp-producer")
    producer.set_namesrv_addr(addr)
    producer.start()
    sent = []
    try:
        for i in range(count):
            msg = Message(topic)
            msg.set_keys(f"key-{i}")
            msg.set_tags("TagA" if i % 2 == 0 else "TagB")
            msg.set_property("order", str(i))
            msg.set_body(f"body-{i}")
            if level:
                msg.set_delay_time_level(level)
            r = producer.send_sync(msg)
            sent.append({"status": int(r.status), "msg_id": r.msg_id, "offset": r.offset})
    finally:
        producer.shutdown()
    return {"sent": sent}


def batch(addr: str, topic: str) -> dict:
    producer = Producer("cpp-batch")
    producer.set_namesrv_addr(addr)
    producer.start()
    try:
        msgs = []
        for i in range(2):
            msg = Message(topic)
            msg.set_keys(f"bk-{i}")
            msg.set_body(f"batch-{i}")
            msgs.append(msg)
        r = producer.send_batch(msgs)
        return {"status": int(r.status), "msg_id": r.msg_id, "offset": r.offset}
    finally:
        producer.shutdown()


def consume(addr: str, topic: str, group: str, count: int, expression: str) -> dict:
    got, done = [], threading.Event()
    lock = threading.Lock()

    def on_message(msg):
        with lock:
            got.append({"id": msg.id, "topic": msg.topic, "tags": msg.tags.decode(),
                        "keys": msg.keys.decode(), "body": msg.body.decode(),
                        "order": (msg.get_property("order") or b"").decode(),
                        "queue_id": msg.queue_id, "queue_offset": msg.queue_offset,
                        "reconsume_times": msg.reconsume_times})
            if len(got) >= count:
                done.set()

    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(addr)
    consumer.subscribe(topic, on_message, expression)
    start = time.monotonic()
    consumer.start()
    done.wait(WAIT_S)
    elapsed = time.monotonic() - start
    consumer.shutdown()
    return {"got": got, "elapsed_s": elapsed}


def orderly(addr: str, topic: str, group: str, count: int) -> dict:
    """An orderly push consumer (it locks its queues with LOCK_BATCH_MQ); each message's queue,
    offset and whether another callback of the same queue was running at once."""
    got, done, lock = [], threading.Event(), threading.Lock()
    running: set[int] = set()
    overlapped = []

    def on_message(msg):
        with lock:
            if msg.queue_id in running:
                overlapped.append(msg.queue_offset)
            running.add(msg.queue_id)
        time.sleep(0.002)  # long enough for another thread of the same queue to show
        with lock:
            running.discard(msg.queue_id)
            got.append({"queue_id": msg.queue_id, "queue_offset": msg.queue_offset,
                        "body": msg.body.decode()})
            if len(got) >= count:
                done.set()

    consumer = PushConsumer(group, orderly=True)
    consumer.set_namesrv_addr(addr)
    consumer.subscribe(topic, on_message, "*")
    consumer.start()
    done.wait(WAIT_S)
    print("consumed", flush=True)
    sys.stdin.read()
    consumer.shutdown()
    return {"got": got, "overlapped": overlapped}


def main(argv: list[str]) -> None:
    kind = argv[1]
    if kind == "produce":
        out = produce(argv[2], argv[3], int(argv[4]))
    elif kind == "delay":
        out = produce(argv[2], argv[3], int(argv[4]), int(argv[5]))
    elif kind == "batch":
        out = batch(argv[2], argv[3])
    elif kind == "orderly":
        out = orderly(argv[2], argv[3], argv[4], int(argv[5]))
    else:
        out = consume(argv[2], argv[3], argv[4], int(argv[5]), argv[6])
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv)

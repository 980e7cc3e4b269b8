"""A PushConsumer of the official RocketMQ 5 Python client in its own process, for the endpoint
tests: ``python push_consumer_proc.py <endpoint> <topic> <group> <stop file> [<fail>
[<sleep ms> [<hold file> <hold after>]]]``.

Its listener prints ``got <message id> <body> <attempt> <ns>`` for every delivery (``ns``: the
system-wide monotonic clock, comparable across processes), sleeps ``sleep ms``, and fails
(FAILURE) the first delivery of a body ending in one of the comma-separated ``fail`` suffixes;
past its first ``hold after`` deliveries it waits, before answering, for as long as the hold
file exists (so a test knows the consumers are mid-way, whatever the machine's speed);
``received <message id> <ns>`` when the server's answer brought it (the consumer caches what
it receives until a consumption thread is free: a listener may see it much later);
``acked <message id> <ns>`` follows once the consumer's ack of it returned OK (``ackfailed
<message id> <error>`` when it raised). ``ready`` once started; ``stopped`` after a clean
shutdown once the stop file exists. Each line is flushed at once.
"""

from __future__ import annotations

import os
import sys
import threading
import time

from endpoint_support import CLIENT_REQUEST_TIMEOUT_S

_lock = threading.Lock()


def say(*words) -> None:
    with _lock:
        print(*words, flush=True)


def main(argv: list[str]) -> int:
    import rocketmq
    from rocketmq import PushConsumer

    endpoint, topic, group, stop_file = argv[1:5]
    fail = [s for s in (argv[5] if len(argv) > 5 else "").split(",") if s]
    sleep_s = (int(argv[6]) if len(argv) > 6 else 0) / 1000.0
    hold_file, hold_after = (argv[7], int(argv[8])) if len(argv) > 8 else ("", 0)
    deliveries = [0]

    class Listener(rocketmq.MessageListener):
        def consume(self, message):
            body = message.body.decode()
            say("got", message.message_id, body, message.delivery_attempt,
                time.monotonic_ns())
            if sleep_s:
                time.sleep(sleep_s)
            with _lock:
                deliveries[0] += 1
                held = bool(hold_file) and deliveries[0] > hold_after
            while held and os.path.exists(hold_file):
                time.sleep(0.05)
            if message.delivery_attempt == 1 and any(body.endswith(s) for s in fail):
                return rocketmq.ConsumeResult.FAILURE
            return rocketmq.ConsumeResult.SUCCESS

    class Recorded(PushConsumer):
        """Says what each receive brought and which acks the server answered OK (the
        listener's SUCCESS is not one)."""

        async def _receive_coroutine(self, queue, req, timeout):
            messages = await super()._receive_coroutine(queue, req, timeout)
            now = time.monotonic_ns()
            for m in messages:
                say("received", m.message_id, now)
            return messages

        def _ack(self, message):
            try:
                super()._ack(message)
            except Exception as exc:
                say("ackfailed", message.message_id, type(exc).__name__)
                raise
            say("acked", message.message_id, time.monotonic_ns())

    config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials(),
                                          request_timeout=CLIENT_REQUEST_TIMEOUT_S)
    consumer = Recorded(config, group, Listener(), {topic: rocketmq.FilterExpression()})
    consumer.startup()
    say("ready")
    while not os.path.exists(stop_file):
        time.sleep(0.05)
    consumer.shutdown()
    say("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

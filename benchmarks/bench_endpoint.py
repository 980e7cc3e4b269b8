"""The gRPC endpoint: the official RocketMQ 5 Python client against ``mqstore serve``, beside
the same client against a do-nothing ``grpc.aio`` servicer (the floor of Python gRPC on this
machine) and the store's in-process API, in one run.

Six workloads, ``--count`` messages of ``--body-bytes`` each:

* ``send sync``: ``Producer.send``, one at a time (one SendMessage RPC each);
* ``send async``: ``Producer.send_async`` with ``--in-flight`` (256) sends outstanding;
* ``receive+ack``: ``SimpleConsumer.receive(32)`` then ``ack`` of every message (one
  ReceiveMessage RPC per 32, one AckMessage RPC per message);
* ``push``: a ``PushConsumer`` of a group of its own over the same messages, its listener
  doing nothing but return SUCCESS (its own receives of up to 32, one AckMessage per
  message, from its 20 consumption threads); timed from the first message its listener sees
  to the ``count``-th ack answered OK (its start, settings and first assignment scan, about
  a second, are not its throughput). ``push / receive+ack`` is printed beside it, with the
  mean batch its receives brought (the endpoint fills a batch when the backlog allows).
* ``receive+ack fifo``: the same by a FIFO consumer group (``mqstore group config
  --orderly``) of ``count`` FIFO messages of ``FIFO_GROUPS`` message groups in a topic of their
  own (sent with ``send_async`` first, not timed): each queue hands out nothing newer while a message of it is in flight.
  Served by ``serve`` and in-process only (the floor answers every receive alike; in-process
  a FIFO group pops the ``send sync`` messages), and
  compared with the floor's ``receive+ack``;
* ``push fifo``: ``push`` by a FIFO group (its PushConsumer consumes each message group
  in order) over those FIFO messages, compared with the floor's ``push``.

Against three servers: ``floor`` (a grpc.aio servicer in another process that answers each
RPC with a canned reply: a route, filled-in settings, OK, 32 prepared messages), ``serve``
(``mqstore serve`` with its default configuration: async flush, dispatch and flush worker
processes) and, for send sync and receive+ack, ``in-process`` (``store.put`` of one message,
``store.pop(32)`` + ``store.ack`` per message, no network). Floor and serve alternate for
``--rounds`` rounds and the best round of each is kept. The figure is serve / floor (target
>= 0.7 for each workload). Client and servers share this machine's CPUs, so the ratio, not the
absolute rate, is what to compare across runs; ``x floor cpu`` also compares the CPU all
processes spent per message (client, server, serve's workers), which other work on a shared
machine does not move.

Server CPU per RPC comes from /proc (user + system time of the server process, and of serve's
worker processes apart) over the RPCs each workload made; the client's own CPU per message is
shown beside it.

    .venv/bin/python benchmarks/bench_endpoint.py            # 2000 messages, 2 rounds
    .venv/bin/python benchmarks/bench_endpoint.py --quick    # 500 messages, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

from benchlib import emit_json
from proc_cpu import cpu_s, descendants_cpu_s

TOPIC = "BenchTopic"
GROUP = "bench-group"
FIFO_GROUP = "bench-fifo-group"
FIFO_TOPIC = "BenchFifo"  # the FIFO workloads' messages, apart from the others
FIFO_GROUPS = 16  # message groups of the FIFO workload
BATCH = 32
START_TIMEOUT_S = 60
WORKLOADS = ("send sync", "send async", "receive+ack", "push", "receive+ack fifo", "push fifo")
BASELINE = {"receive+ack fifo": "receive+ack", "push fifo": "push"}  # the floor row compared


# -- the floor: a servicer that does nothing but answer -----------------------------------------
def floor_server(body_bytes: int) -> None:
    """Serve until stdin closes; print ``PORT <n>`` once listening."""
    import grpc
    from mqstore.endpoint.protocol import Code, definition_pb2 as d, service_pb2 as s
    from mqstore.endpoint.protocol import service_pb2_grpc
    from mqstore.endpoint.wire import md5_digest

    ok = d.Status(code=Code.OK, message="OK")
    body = b"x" * body_bytes
    canned = []
    for i in range(BATCH):
        m = d.Message(topic=d.Resource(name=TOPIC), body=body)
        sp = m.system_properties
        sp.message_id, sp.receipt_handle, sp.queue_id, sp.queue_offset = f"ID{i}", f"h{i}", 0, i
        sp.body_digest.type, sp.body_digest.checksum = d.DigestType.MD5, md5_digest(body)
        sp.body_encoding, sp.message_type, sp.delivery_attempt = d.IDENTITY, d.NORMAL, 1
        sp.born_timestamp.FromMilliseconds(1)
        sp.store_timestamp.FromMilliseconds(1)
        canned.append(s.ReceiveMessageResponse(message=m))
    stamp = canned[0].message.system_properties.store_timestamp

    class Floor(service_pb2_grpc.MessagingServiceServicer):
        async def QueryRoute(self, request, context):
            broker = d.Broker(name="floor", id=0, endpoints=request.endpoints)
            return s.QueryRouteResponse(status=ok, message_queues=[d.MessageQueue(
                topic=request.topic, id=q, permission=d.READ_WRITE, broker=broker,
                accept_message_types=[d.NORMAL]) for q in range(4)])

        async def Heartbeat(self, request, context):
            return s.HeartbeatResponse(status=ok)

        async def Telemetry(self, request_iterator, context):
            async for command in request_iterator:
                settings = d.Settings()
                settings.CopyFrom(command.settings)
                if settings.HasField("publishing"):
                    settings.publishing.max_body_size = 4 << 20
                    settings.backoff_policy.max_attempts = 3
                    settings.backoff_policy.exponential_backoff.multiplier = 2
                await context.write(s.TelemetryCommand(status=ok, settings=settings))

        async def SendMessage(self, request, context):
            return s.SendMessageResponse(status=ok, entries=[s.SendResultEntry(
                status=ok, message_id=m.system_properties.message_id, offset=0)
                for m in request.messages])

        async def ReceiveMessage(self, request, context):
            yield s.ReceiveMessageResponse(status=ok)
            for response in canned[:request.batch_size]:
                yield response
            yield s.ReceiveMessageResponse(delivery_timestamp=stamp)

        async def AckMessage(self, request, context):
            return s.AckMessageResponse(status=ok, entries=[s.AckMessageResultEntry(
                message_id=e.message_id, receipt_handle=e.receipt_handle, status=ok)
                for e in request.entries])

        async def QueryAssignment(self, request, context):
            broker = d.Broker(name="floor", id=0, endpoints=request.endpoints)
            return s.QueryAssignmentResponse(status=ok, assignments=[d.Assignment(
                message_queue=d.MessageQueue(topic=request.topic, id=-1,
                                             permission=d.READ_WRITE, broker=broker))])

        async def NotifyClientTermination(self, request, context):
            return s.NotifyClientTerminationResponse(status=ok)

    async def main():
        server = grpc.aio.server()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(Floor(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        print("PORT", port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        await server.stop(1)
    asyncio.run(main())


# -- processes and their CPU ----------------------------------------------------------------
class Server:
    """A server process: ``endpoint``, and its CPU (itself, its children) so far."""

    def __init__(self, proc: subprocess.Popen, endpoint: str, log_path: str | None) -> None:
        self.proc, self.endpoint, self.log_path = proc, endpoint, log_path

    def cpu(self) -> tuple[float, float]:
        kids = descendants_cpu_s(self.proc.pid)
        return cpu_s(self.proc.pid), kids

    def stop(self) -> None:
        if self.proc.poll() is None:
            if self.proc.stdin is not None:
                self.proc.stdin.close()
            else:
                os.kill(self.proc.pid, signal.SIGTERM)
        self.proc.wait(60)


def start_floor(body_bytes: int) -> Server:
    proc = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--floor-server",
                             "--body-bytes", str(body_bytes)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    return Server(proc, f"127.0.0.1:{int(line.split()[1])}", None)


def start_serve(workdir: str) -> Server:
    os.makedirs(workdir, exist_ok=True)
    yaml = os.path.join(workdir, "deploy.yaml")
    with open(yaml, "w") as f:
        f.write(f"commit_log: {{segment_bytes: {256 << 20}}}\nindex: {{enabled: false}}\n"
                f"plugins: {{load_entry_points: false}}\n"
                f"store: {{root: {json.dumps(os.path.join(workdir, 'served'))}}}\n"
                'server: {metrics_listen: "127.0.0.1:0", grpc_listen: "127.0.0.1:0", '
                "grpc_min_invisible_ms: 1000}\n")
    log_path = os.path.join(workdir, "serve.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mqstore.cli", "serve", "-c", yaml],
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(log_path) as f:
            found = re.search(r"MessagingService\) on ([\d.]+:\d+)", f.read())
        if found:
            return Server(proc, found.group(1), log_path)
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    proc.kill()
    with open(log_path) as f:
        raise RuntimeError(f"serve did not start:\n{f.read()}")


# -- the workloads, through the official client ---------------------------------------------
def message(rocketmq, body: bytes, i: int, message_group: str | None = None):
    m = rocketmq.Message()
    m.topic = FIFO_TOPIC if message_group is not None else TOPIC
    m.body = body
    m.tag = "bench"
    m.keys = f"k{i}"
    if message_group is not None:
        m.message_group = message_group
    return m


def make_fifo_group(endpoint: str, group: str) -> None:
    subprocess.run([sys.executable, "-m", "mqstore.cli", "group", "config", "--server",
                    endpoint, group, "--orderly"], check=True, capture_output=True)


def run_client(rocketmq, server: Server, count: int, body: bytes, in_flight: int,
               fifo: bool = False) -> dict:
    """``{workload: (msg/s, server CPU s, worker CPU s, RPCs, client CPU s)}``."""
    config = rocketmq.ClientConfiguration(server.endpoint, rocketmq.Credentials())
    producer = rocketmq.Producer(config, (TOPIC,))
    producer.startup()
    producer.send(message(rocketmq, body, -1))  # the topic exists; settings arrived
    time.sleep(1.2)
    out = {}

    def measured(name: str, rpcs: int, work) -> None:
        server_before, kids_before = server.cpu()
        client_before = time.process_time()
        started = time.perf_counter()
        done = work()
        seconds = time.perf_counter() - started
        server_after, kids_after = server.cpu()
        out[name] = (done / seconds, server_after - server_before, kids_after - kids_before,
                     rpcs, time.process_time() - client_before, done)

    def send_sync() -> int:
        for i in range(count):
            producer.send(message(rocketmq, body, i))
        return count

    def send_async(groups: int = 0) -> int:
        slots = threading.BoundedSemaphore(in_flight)
        finished = threading.Event()
        left = [count]
        lock = threading.Lock()

        def done(_future) -> None:
            slots.release()
            with lock:
                left[0] -= 1
                if left[0] == 0:
                    finished.set()
        for i in range(count):
            slots.acquire()
            producer.send_async(message(rocketmq, body, i, f"g{i % groups}" if groups else None)
                                ).add_done_callback(done)
        finished.wait(600)
        return count

    measured("send sync", count, send_sync)
    measured("send async", count, send_async)
    consumer = rocketmq.SimpleConsumer(config, GROUP, {TOPIC: rocketmq.FilterExpression()},
                                       await_duration=2)
    consumer.startup()

    def receive_ack(consumer=consumer) -> int:
        got = 0
        while got < count:
            batch = consumer.receive(BATCH, 60)
            if not batch:
                break
            for m in batch:
                consumer.ack(m)
            got += len(batch)
        return got
    measured("receive+ack", -(-count // BATCH) + count, receive_ack)
    consumer.shutdown()
    out["push"] = push_consume(rocketmq, config, server, count)
    if fifo:
        make_fifo_group(server.endpoint, FIFO_GROUP)
        make_fifo_group(server.endpoint, FIFO_GROUP + "-push")
        send_async(FIFO_GROUPS)
        ordered = rocketmq.SimpleConsumer(config, FIFO_GROUP,
                                          {FIFO_TOPIC: rocketmq.FilterExpression()},
                                          await_duration=2)
        ordered.startup()
        measured("receive+ack fifo", -(-count // BATCH) + count,
                 lambda: receive_ack(ordered))
        ordered.shutdown()
        out["push fifo"] = push_consume(rocketmq, config, server, count, FIFO_GROUP + "-push",
                                        FIFO_TOPIC)
    producer.shutdown()
    return out


def push_consume(rocketmq, config, server: Server, count: int,
                 group: str = GROUP + "-push", topic: str = TOPIC) -> tuple:
    """The ``push`` workload's row, and the mean batch of its receives as a seventh field."""
    from rocketmq import PushConsumer
    acked, batches = [0], []
    first, done = threading.Event(), threading.Event()
    lock = threading.Lock()
    marks: dict = {}

    class Listener(rocketmq.MessageListener):
        def consume(self, message):
            if not first.is_set():
                marks["start"] = (time.perf_counter(), server.cpu(), time.process_time())
                first.set()
            return rocketmq.ConsumeResult.SUCCESS

    class Counted(PushConsumer):
        async def _receive_coroutine(self, queue, req, timeout):
            messages = await super()._receive_coroutine(queue, req, timeout)
            batches.append(len(messages))
            return messages

        def _ack(self, message):
            super()._ack(message)
            with lock:
                acked[0] += 1
                if acked[0] == count:
                    marks["end"] = (time.perf_counter(), server.cpu(), time.process_time())
                    done.set()

    consumer = Counted(config, group, Listener(), {topic: rocketmq.FilterExpression()})
    consumer.startup()
    try:
        if not done.wait(600):
            raise RuntimeError(f"the push consumer acknowledged {acked[0]} of {count} in 600 s")
    finally:
        consumer.shutdown()
    (t0, (srv0, kids0), c0), (t1, (srv1, kids1), c1) = marks["start"], marks["end"]
    served = [b for b in batches if b]
    return (count / (t1 - t0), srv1 - srv0, kids1 - kids0, len(batches) + count, c1 - c0, count,
            sum(served) / max(1, len(served)))


def run_in_process(workdir: str, count: int, body: bytes) -> dict:
    from mqstore import Message, MessageStore, load_config
    config = load_config(overrides={"commit_log": {"segment_bytes": 256 << 20},
                                    "index": {"enabled": False},
                                    "plugins": {"load_entry_points": False}})
    out = {}
    with MessageStore.open(os.path.join(workdir, "in-process"), config=config) as store:
        started, cpu = time.perf_counter(), time.process_time()
        for i in range(count):
            store.put(Message(TOPIC, body, tags="bench", keys=[f"k{i}"],
                              properties={"UNIQ_KEY": f"ID{i}"}))
        out["send sync"] = (count / (time.perf_counter() - started), None, None, count,
                            time.process_time() - cpu, count)
        store.wait_dispatched(30)
        started, cpu, got = time.perf_counter(), time.process_time(), 0
        while got < count:
            popped = store.pop(GROUP, TOPIC, BATCH, 60_000, consume_from="first")
            for m in popped:
                store.ack(m.receipt_handle)
            got += len(popped)
        out["receive+ack"] = (got / (time.perf_counter() - started), None, None, got,
                              time.process_time() - cpu, got)
        store.set_group_config(FIFO_GROUP, consume_message_orderly=True)
        started, cpu, got = time.perf_counter(), time.process_time(), 0
        while got < count:
            popped = store.pop(FIFO_GROUP, TOPIC, BATCH, 60_000, consume_from="first")
            for m in popped:
                store.ack(m.receipt_handle)
            got += len(popped)
        out["receive+ack fifo"] = (got / (time.perf_counter() - started), None, None, got,
                                   time.process_time() - cpu, got)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=None, help="messages per workload (2000)")
    ap.add_argument("--rounds", type=int, default=None, help="floor/serve rounds (2)")
    ap.add_argument("--quick", action="store_true", help="500 messages per workload, 1 round")
    ap.add_argument("--body-bytes", type=int, default=1024)
    ap.add_argument("--in-flight", type=int, default=256, help="async sends outstanding")
    ap.add_argument("--json", action="store_true", help="also print a BENCH-JSON line")
    ap.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_server:
        floor_server(args.body_bytes)
        return 0
    count = args.count or (500 if args.quick else 2000)
    rounds = args.rounds or (1 if args.quick else 2)
    body = b"x" * args.body_bytes
    workdir = tempfile.mkdtemp(prefix="bench-endpoint-")
    saved_home = os.environ.get("HOME")
    os.environ["HOME"] = workdir  # the client logs to ~/logs; fixed when it is imported
    try:
        import rocketmq
    finally:
        os.environ["HOME"] = saved_home or ""
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {count} messages of "
          f"{args.body_bytes} B per workload, {args.in_flight} async sends in flight, "
          f"{rounds} round(s), temp {workdir}")
    results: dict = {"floor": {}, "serve": {}}
    try:
        for r in range(rounds):
            for name, start in (("floor", lambda: start_floor(args.body_bytes)),
                                ("serve", lambda: start_serve(os.path.join(workdir, f"r{r}")))):
                server = start()
                try:
                    got = run_client(rocketmq, server, count, body, args.in_flight,
                                     fifo=name == "serve")
                finally:
                    server.stop()
                for workload, row in got.items():  # the best round of each
                    best = results[name].get(workload)
                    if best is None or row[0] > best[0]:
                        results[name][workload] = row
        results["in-process"] = run_in_process(workdir, count, body)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)

    print(f"\n{'workload':<17} {'server':<11} {'msgs':>6} {'msg/s':>9} {'x floor':>8} "
          f"{'x floor cpu':>12} {'srv ms/RPC':>11} {'workers ms/msg':>15} {'client ms/msg':>14}")
    metrics = []

    def cpu_per_msg(row) -> float:
        _rate, srv, kids, _rpcs, client_cpu, done = row[:6]
        return (client_cpu + (srv or 0.0) + (kids or 0.0)) / done
    for workload in WORKLOADS:
        floor_row = results["floor"][BASELINE.get(workload, workload)]
        for name in ("floor", "serve", "in-process"):
            row = results[name].get(workload)
            if row is None:
                continue
            rate, srv, kids, rpcs, client_cpu, done = row[:6]
            srv_txt = f"{srv / rpcs * 1000:.3f}" if srv is not None else "-"
            kids_txt = f"{kids / done * 1000:.3f}" if kids is not None else "-"
            print(f"{workload:<17} {name:<11} {done:>6} {rate:>9.0f} "
                  f"{rate / floor_row[0]:>8.2f} {cpu_per_msg(floor_row) / cpu_per_msg(row):>12.2f} "
                  f"{srv_txt:>11} {kids_txt:>15} {client_cpu / done * 1000:>14.3f}")
            metrics.append((f"{workload} {name} msg/s", rate, "msg/s", "higher"))
    print()
    for name in ("floor", "serve"):
        push, simple = results[name]["push"], results[name]["receive+ack"]
        print(f"push / receive+ack ({name}): {push[0] / simple[0]:.2f} by the clock, "
              f"{cpu_per_msg(simple) / cpu_per_msg(push):.2f} by CPU; push receives brought "
              f"{push[6]:.1f} messages each (at most {BATCH})")
        metrics.append((f"push/receive+ack {name}", push[0] / simple[0], "x", "higher"))
    print()
    for workload in WORKLOADS:
        floor_row = results["floor"][BASELINE.get(workload, workload)]
        ratio = results["serve"][workload][0] / floor_row[0]
        by_cpu = cpu_per_msg(floor_row) / cpu_per_msg(results["serve"][workload])
        print(f"{workload} serve >= 0.7 x floor: {'PASS' if ratio >= 0.7 else 'MISS'} "
              f"({ratio:.2f} by the clock, {by_cpu:.2f} by CPU)")
        metrics.append((f"{workload} serve/floor", ratio, "x", "higher"))
    if args.json:
        emit_json("endpoint", metrics, count=count, body_bytes=args.body_bytes)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The remoting server: RocketMQ's C++ client (PyPI ``rocketmq==0.4.4``, the remoting protocol)
against ``mqstore serve``, beside the same client against a do-nothing remoting server (the
floor of a Python asyncio server on this machine) in one run.

Two workloads, ``--count`` messages of ``--body-bytes`` each:

* ``send sync``: ``Producer.send_sync``, one at a time (one SEND_MESSAGE each); the figure is
  messages per second and the median send latency;
* ``push consume``: a ``PushConsumer`` (32 messages per pull, one consume callback per
  message) reading ``--count`` stored messages; messages per second from the first message
  delivered to the last (the consumer's start-up and rebalance apart).

Against two servers: ``floor`` (another process answering each request with a canned reply: a
route, SUCCESS, 32 prepared records per pull) and ``serve`` (``mqstore serve`` with its default
configuration: async flush, dispatch and flush worker processes). Floor and serve alternate for
``--rounds`` rounds; the best round of each is kept. The figure is serve / floor (target >= 0.7),
by rate and by CPU: ``x floor cpu`` is the CPU every process spent per message (the client,
the server and serve's workers; from /proc and the client's process time), the floor's over
serve's, which other work on a shared machine moves least; ``srv us/msg`` the server's part.
Beside them, RocketMQ 4.9.8's Java broker with the same client on this machine, measured once
(not in this run) with 1 KiB bodies: 463 msg/s sync send (p50 1.2 ms), 6,680 msg/s push; and
the official gRPC client's SimpleConsumer against serve's gRPC endpoint: 273 msg/s (one ack RPC
per message). The default body is 1 KiB so that "x Java" compares like with like; with another
``--body-bytes`` the table says the Java column was measured at 1 KiB.

    .venv/bin/python benchmarks/bench_remoting.py            # 3000 messages, 2 rounds
    .venv/bin/python benchmarks/bench_remoting.py --quick    # 1000 messages, 1 round
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

from proc_cpu import cpu_s, descendants_cpu_s

HERE = os.path.dirname(os.path.abspath(__file__))
TOPIC = "BenchTopic"
BATCH = 32
START_TIMEOUT_S = 60
JAVA_BROKER = {"send sync": 463.0, "push consume": 6680.0}
JAVA_SEND_P50_MS = 1.2
JAVA_BODY_BYTES = 1024  # the body size the Java broker's figures were measured with
GRPC_SIMPLE_CONSUMER = 273.0


# -- the client side (runs with the C++ client's directory first on sys.path) ----------------
def client_send(addr: str, count: int, body_bytes: int) -> dict:
    from rocketmq.client import Message, Producer
    producer = Producer("bench-producer")
    producer.set_namesrv_addr(addr)
    producer.start()
    body = b"x" * body_bytes
    latencies = []
    try:
        for i in range(min(count, 50)):  # warm: route, connection
            m = Message(TOPIC)
            m.set_body(body)
            producer.send_sync(m)
        start = time.perf_counter()
        for i in range(count):
            m = Message(TOPIC)
            m.set_keys(f"k{i}")
            m.set_tags("bench")
            m.set_body(body)
            t = time.perf_counter()
            producer.send_sync(m)
            latencies.append(time.perf_counter() - t)
        elapsed = time.perf_counter() - start
    finally:
        producer.shutdown()
    latencies.sort()
    return {"rate": count / elapsed, "cpu_s": time.process_time(), "p50_ms": latencies[len(latencies) // 2] * 1000,
            "p99_ms": latencies[len(latencies) * 99 // 100] * 1000,
            "slowest_ms": latencies[-1] * 1000,
            "over_10ms": sum(1 for x in latencies if x > 0.01)}


def client_consume(addr: str, count: int, group: str) -> dict:
    import threading
    from rocketmq.client import PushConsumer
    times = []
    done = threading.Event()

    def on_message(msg):
        times.append(time.perf_counter())
        if len(times) >= count:
            done.set()
    consumer = PushConsumer(group)
    consumer.set_namesrv_addr(addr)
    consumer.subscribe(TOPIC, on_message, "*")
    consumer.start()
    done.wait(300)
    consumer.shutdown()
    got = min(len(times), count)
    if got < 2:
        return {"rate": 0.0, "got": got, "cpu_s": time.process_time()}
    return {"rate": (got - 1) / (times[got - 1] - times[0]), "got": got,
            "cpu_s": time.process_time()}


# -- the floor: a remoting server that does nothing but answer -------------------------------
def floor_server(body_bytes: int) -> None:
    """Serve until stdin closes; print ``PORT <n>`` once listening."""
    from mqstore.format import remoting_frame as rf
    from mqstore.format import remoting_json as fj
    from mqstore.format.hosts import parse_host
    from mqstore.format.record import encode_record, offset_msg_id

    host = parse_host("127.0.0.1:1")
    records = b"".join(encode_record(
        queue_id=0, flag=0, queue_offset=i, phys_offset=i * 1000, sysflag=0,
        born_timestamp=1, born_host=host, store_timestamp=1, store_host=host,
        reconsume_times=0, prepared_tx_offset=0, body=b"x" * body_bytes, topic=TOPIC.encode(),
        properties=b"TAGS\x01bench\x02") for i in range(BATCH))
    msg_id = offset_msg_id(host, 0)
    clients: list[str] = []

    class Floor(asyncio.Protocol):
        def connection_made(self, transport):
            self.t, self.buf = transport, b""
            self.addr = "127.0.0.1:%d" % transport.get_extra_info("sockname")[1]

        def data_received(self, data):
            self.buf += data
            while len(self.buf) >= 4:
                n = int.from_bytes(self.buf[:4], "big")
                if len(self.buf) < 4 + n:
                    return
                cmd, self.buf = rf.decode(self.buf[4:4 + n]), self.buf[4 + n:]
                if not cmd.is_oneway and not cmd.is_response:
                    self.t.write(rf.encode(self.answer(cmd)))

        def answer(self, cmd):
            code = cmd.code
            if code == 105:
                doc = {"brokerDatas": [{"brokerAddrs": {0: self.addr}, "brokerName": "floor",
                                        "cluster": "c"}], "filterServerTable": {},
                       "queueDatas": [{"brokerName": "floor", "perm": 6, "readQueueNums": 4,
                                       "topicSysFlag": 0, "writeQueueNums": 4}]}
                return cmd.response(0, None, None, fj.dumps(doc).encode())
            if code in (10, 310):
                return cmd.response(0, None, {"msgId": msg_id, "queueId": "0",
                                              "queueOffset": "0"})
            if code == 11:
                offset = int(cmd.ext.get("queueOffset", "0"))
                return cmd.response(0, "FOUND", {
                    "suggestWhichBrokerId": "0", "nextBeginOffset": str(offset + BATCH),
                    "minOffset": "0", "maxOffset": str(1 << 40)}, records)
            if code == 34:  # the consumer list answers the clients that heart-beat
                client = fj.loads(cmd.body).get("clientID")
                if client not in clients:
                    clients.append(client)
                return cmd.response(0)
            if code == 38:
                return cmd.response(0, None, None,
                                    fj.dumps({"consumerIdList": sorted(clients)}).encode())
            if code == 14:
                return cmd.response(0, None, {"offset": "0"})
            return cmd.response(0)

    async def main():
        loop = asyncio.get_running_loop()
        server = await loop.create_server(Floor, "127.0.0.1", 0)
        print("PORT", server.sockets[0].getsockname()[1], flush=True)
        await loop.run_in_executor(None, sys.stdin.read)
        server.close()
    asyncio.run(main())


# -- servers ---------------------------------------------------------------------------------
class Server:
    def __init__(self, proc, address: str) -> None:
        self.proc, self.address = proc, address

    def cpu(self) -> float:
        """CPU seconds of the server and its processes so far."""
        return cpu_s(self.proc.pid) + descendants_cpu_s(self.proc.pid)

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
    return Server(proc, f"127.0.0.1:{int(proc.stdout.readline().split()[1])}")


def start_serve(workdir: str) -> Server:
    os.makedirs(workdir, exist_ok=True)
    yaml = os.path.join(workdir, "deploy.yaml")
    with open(yaml, "w") as f:
        f.write(f"commit_log: {{segment_bytes: {256 << 20}}}\nplugins: {{load_entry_points: "
                f"false}}\nstore: {{root: {json.dumps(os.path.join(workdir, 'served'))}}}\n"
                'server: {metrics_listen: "127.0.0.1:0", remoting_listen: "127.0.0.1:0"}\n')
    log_path = os.path.join(workdir, "serve.log")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mqstore.cli", "serve", "-c", yaml],
                                stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        with open(log_path) as f:
            found = re.search(r"serving RocketMQ remoting on ([\d.]+:\d+)", f.read())
        if found:
            return Server(proc, found.group(1))
        if proc.poll() is not None:
            break
        time.sleep(0.05)
    with open(log_path) as f:
        raise RuntimeError(f"serve did not start:\n{f.read()}")


def run_client(client_dir: str, home: str, *args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=client_dir, HOME=home)
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--client", *map(str, args)],
                         capture_output=True, text=True, env=env, timeout=900)
    if out.returncode != 0:
        raise RuntimeError(f"client {args} failed:\n{out.stdout}\n{out.stderr}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def one_round(kind: str, client_dir: str, home: str, count: int, body_bytes: int,
              workdir: str, round_no: int) -> dict:
    if kind == "floor":
        server = start_floor(body_bytes)
    else:
        server = start_serve(os.path.join(workdir, f"serve{round_no}"))
    try:
        before = server.cpu()
        send = run_client(client_dir, home, "send", server.address, count, body_bytes)
        middle = server.cpu()
        consume = run_client(client_dir, home, "consume", server.address, count,
                             f"bench-group-{round_no}")
        after = server.cpu()
    finally:
        server.stop()
    # CPU per message of everything (client and server), in microseconds: what other work on
    # a shared machine moves least.
    return {"send sync": send["rate"], "send p50 ms": send["p50_ms"],
            "send p99 ms": send["p99_ms"], "push consume": consume["rate"],
            "send cpu us": (send["cpu_s"] + middle - before) / count * 1e6,
            "push cpu us": (consume["cpu_s"] + after - middle) / count * 1e6,
            "send server cpu us": (middle - before) / count * 1e6,
            "push server cpu us": (after - middle) / count * 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=3000)
    ap.add_argument("--body-bytes", type=int, default=JAVA_BODY_BYTES)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--floor-server", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--client", nargs="+", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.floor_server:
        floor_server(args.body_bytes)
        return
    if args.client:
        kind, addr, count = args.client[0], args.client[1], int(args.client[2])
        out = (client_send(addr, count, int(args.client[3])) if kind == "send"
               else client_consume(addr, count, args.client[3]))
        print(json.dumps(out), flush=True)
        return
    if args.quick:
        args.count, args.rounds = 1000, 1
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "support"))
    from cpp_client_support import install_cpp_client
    client_dir = str(install_cpp_client())
    workdir = tempfile.mkdtemp(prefix="bench-remoting-")
    home = os.path.join(workdir, "home")
    os.makedirs(home)
    best: dict[str, dict] = {"floor": {}, "serve": {}}
    try:
        for r in range(args.rounds):
            for kind in ("floor", "serve"):
                got = one_round(kind, client_dir, home, args.count, args.body_bytes, workdir, r)
                for k, v in got.items():
                    better = min if k.endswith(("ms", "us")) else max
                    best[kind][k] = better(best[kind].get(k, v), v)
                print(f"round {r + 1} {kind}: " + ", ".join(
                    f"{k} {v:,.1f}" for k, v in got.items()), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"\n{args.count} messages of {args.body_bytes} bytes, best of {args.rounds} "
          f"round(s)\n")
    print(f"{'workload':<14} {'floor msg/s':>12} {'serve msg/s':>12} {'x floor':>8} "
          f"{'x floor cpu':>12} {'srv us/msg':>16} {'Java broker':>12} {'x Java':>7}")
    rows = []
    for k, c in (("send sync", "send"), ("push consume", "push")):
        f, s = best["floor"][k], best["serve"][k]
        fc, sc = best["floor"][f"{c} cpu us"], best["serve"][f"{c} cpu us"]
        fsrv, ssrv = best["floor"][f"{c} server cpu us"], best["serve"][f"{c} server cpu us"]
        rows.append((k, f, s, fc / sc))
        print(f"{k:<14} {f:>12,.0f} {s:>12,.0f} {s / f:>8.2f} {fc / sc:>12.2f} "
              f"{fsrv:>7.1f} / {ssrv:>6.1f} {JAVA_BROKER[k]:>12,.0f} {s / JAVA_BROKER[k]:>7.2f}")
    if args.body_bytes != JAVA_BODY_BYTES:
        print(f"(the Java broker's figures are of {JAVA_BODY_BYTES}-byte bodies, not "
              f"{args.body_bytes}: its column compares unlike sizes)")
    f50, s50 = best["floor"]["send p50 ms"], best["serve"]["send p50 ms"]
    print(f"\nsend p50: floor {f50:.2f} ms, serve {s50:.2f} ms (serve / floor by the median: "
          f"{f50 / s50:.2f}; Java broker {JAVA_SEND_P50_MS} ms)")
    print(f"push consume vs the gRPC SimpleConsumer on serve ({GRPC_SIMPLE_CONSUMER:.0f} "
          f"msg/s): {best['serve']['push consume'] / GRPC_SIMPLE_CONSUMER:.1f}x")
    try:
        from benchlib import emit_json
        emit_json("remoting", [(f"{k} serve/floor", s / f, "x", "higher") for k, f, s, _c in rows]
                  + [(f"{k} serve/floor cpu", c, "x", "higher") for k, _f, _s, c in rows]
                  + [(f"{k} serve", s, "msg/s", "higher") for k, _f, s, _c in rows])
    except ImportError:
        pass


if __name__ == "__main__":
    main()

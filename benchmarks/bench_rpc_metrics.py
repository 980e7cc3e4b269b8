"""What counting RPCs costs the gRPC endpoint (NOTE [ RPC metrics ] in
``core/endpoint/rpc_metrics.py``): a ``grpc.aio`` server answering a do-nothing unary method,
bare and with ``grpc_metrics.MetricsInterceptor``, called by a ``grpc.aio`` client over
127.0.0.1, alternating for ``--rounds`` rounds (best of each kept), one call at a time and
``--in-flight`` at once. The figure is metered / bare CPU time per RPC (client and server
share this process, so other work on a shared machine moves it less than wall time, which is
shown too; 1.0: free). Beside it, the recording alone (``MethodMetrics.started`` +
``finished``), without gRPC.

    .venv/bin/python benchmarks/bench_rpc_metrics.py            # 4000 calls, 3 rounds
    .venv/bin/python benchmarks/bench_rpc_metrics.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import time

import grpc

from mqstore.endpoint.grpc_metrics import MetricsInterceptor
from mqstore.endpoint.rpc_metrics import RpcMetrics

SERVICE = "apache.rocketmq.v2.MessagingService"
METHOD = "Heartbeat"  # a method the interceptor counts; the payload is raw bytes here


async def _answer(request: bytes, context) -> bytes:
    return b"ok"


async def serve(interceptors) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server(interceptors=interceptors)
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        SERVICE, {METHOD: grpc.unary_unary_rpc_method_handler(_answer)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, port


async def calls(port: int, count: int, in_flight: int) -> tuple[float, float]:
    """CPU and wall seconds per RPC over ``count`` calls, ``in_flight`` at a time."""
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = channel.unary_unary(f"/{SERVICE}/{METHOD}")
        await call(b"warm")
        cpu, wall = time.process_time(), time.perf_counter()
        for _ in range(count // in_flight):
            await asyncio.gather(*(call(b"x") for _ in range(in_flight)))
        made = count // in_flight * in_flight
        return (time.process_time() - cpu) / made, (time.perf_counter() - wall) / made


async def run(count: int, rounds: int, in_flight: int) -> None:
    metrics = RpcMetrics()
    bare, bare_port = await serve(None)
    metered, metered_port = await serve([MetricsInterceptor(metrics)])
    try:
        for width in (1, in_flight):
            best = {"bare": (float("inf"),) * 2, "metered": (float("inf"),) * 2}
            for _ in range(rounds):
                best["bare"] = min(best["bare"], await calls(bare_port, count, width))
                best["metered"] = min(best["metered"], await calls(metered_port, count, width))
            (bare_cpu, bare_wall), (cpu, wall) = best["bare"], best["metered"]
            print(f"{width:>4} in flight: CPU bare {bare_cpu * 1e6:6.1f} us/RPC, metered "
                  f"{cpu * 1e6:6.1f} us/RPC, metered / bare {cpu / bare_cpu:.3f} (wall "
                  f"{bare_wall * 1e6:6.1f} / {wall * 1e6:6.1f} us)")
    finally:
        await bare.stop(None)
        await metered.stop(None)


def recording(count: int) -> float:
    method = RpcMetrics().method("grpc", SERVICE, METHOD)
    started = time.perf_counter()
    for _ in range(count):
        method.finished(method.started(), "OK")
    return (time.perf_counter() - started) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=4000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--quick", action="store_true", help="1000 calls, 1 round")
    args = parser.parse_args()
    count, rounds = (1000, 1) if args.quick else (args.count, args.rounds)
    asyncio.run(run(count, rounds, args.in_flight))
    print(f"recording alone: {recording(100_000) * 1e6:.2f} us per RPC")


if __name__ == "__main__":
    main()

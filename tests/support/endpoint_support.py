"""``mqstore serve`` with its gRPC endpoint in a subprocess, and the official RocketMQ 5 Python
client (``rocketmq-python-client``) talking to it.

The client logs to ``~/logs/rocketmq_python`` and fixes that directory when it is first
imported, so ``client_module`` imports it with HOME pointing at a temporary directory (and
puts HOME back); client subprocesses get a temporary HOME in their environment.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

from cli_support import SMALL_CONFIG, env

START_TIMEOUT_S = 60
STOP_TIMEOUT_S = 60
# The official client's deadline for one RPC (its default is 3 s): a route query or a send
# answered later on a loaded machine must not fail a test that is not about time.
CLIENT_REQUEST_TIMEOUT_S = 30
_client = None


def client_module(home: Path):
    """``rocketmq`` (the official client), imported with HOME=home."""
    global _client
    if _client is None:
        saved = os.environ.get("HOME")
        os.environ["HOME"] = str(home)
        try:
            import rocketmq
        finally:
            if saved is None:
                del os.environ["HOME"]
            else:
                os.environ["HOME"] = saved
        _client = rocketmq
    return _client


def deployment_yaml(path: Path, root: Path, server: dict | None = None,
                    extra: str = "") -> Path:
    settings = {"metrics_listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
                "grpc_min_invisible_ms": 1000, **(server or {})}
    path.write_text(SMALL_CONFIG + extra + f"store: {{root: {json.dumps(str(root))}}}\n"
                    f"server: {json.dumps(settings)}\n")
    return path


@contextlib.contextmanager
def serving(base: Path, home: Path, *, server: dict | None = None, extra: str = "",
            clean: bool = True, log: str = "serve.log"):
    """``mqstore serve`` of a deployment in ``base`` (``deploy.yaml``, its ``store``, the log
    ``log``; ``server`` and ``extra`` as ``deployment_yaml`` takes them; the same arguments
    again serve the same store again). At the end it is stopped (SIGTERM) and its clean close
    asserted, or with ``clean=False`` SIGKILLed; an exception out of the block SIGKILLs it."""
    root = base / "store"
    served = Served(deployment_yaml(base / "deploy.yaml", root, server, extra),
                    base / log, home, root=root)
    try:
        yield served
    except BaseException:
        served.kill()
        raise
    if not clean:
        served.kill()
        return
    code = served.stop()
    assert code == 0, served.log()
    assert "store closed cleanly" in served.log()


def consumer_settings(endpoint: str, group: str):
    """The Settings the endpoint announces to a SimpleConsumer of ``group`` (a Telemetry
    call of the raw protocol)."""
    import grpc
    from mqstore.endpoint.protocol import definition_pb2, service_pb2, service_pb2_grpc

    settings = definition_pb2.Settings(
        client_type=definition_pb2.SIMPLE_CONSUMER,
        subscription=definition_pb2.Subscription(group=definition_pb2.Resource(name=group)))
    with grpc.insecure_channel(endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        (reply,) = list(stub.Telemetry(iter([service_pb2.TelemetryCommand(settings=settings)]),
                                       timeout=10))
    return reply.settings


class Served:
    """A running ``mqstore serve``; ``endpoint`` is "127.0.0.1:PORT" of its gRPC endpoint,
    ``yaml`` its deployment file, ``root`` its store directory where the caller said it.
    ``nofile``: its RLIMIT_NOFILE (its workers inherit it)."""

    def __init__(self, yaml: Path, log_path: Path, home: Path,
                 argv: list[str] | None = None, nofile: int | None = None,
                 root: Path | None = None) -> None:
        """``argv``: the command to run instead of ``mqstore serve -c yaml``, not waited for
        (it may end before it serves)."""
        self.yaml = yaml
        self.root = root
        self.log_path = log_path
        log = open(log_path, "w")
        self.proc = subprocess.Popen(
            argv or [sys.executable, "-m", "mqstore.cli", "serve", "-c", str(yaml)],
            stdout=log, stderr=subprocess.STDOUT, env={**env(), "HOME": str(home)},
            start_new_session=True, preexec_fn=None if nofile is None else
            (lambda: resource.setrlimit(resource.RLIMIT_NOFILE,
                                        (nofile, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))))
        log.close()
        self.endpoint = None if argv else self._wait_for(
            r"serving gRPC \(apache\.rocketmq\.v2\.MessagingService\) on ([\d.]+:\d+)")

    def _wait_for(self, pattern: str) -> str:
        from mqstore.testing import patience  # here: the client processes import this module

        deadline = time.monotonic() + patience(START_TIMEOUT_S)
        while time.monotonic() < deadline:
            found = re.search(pattern, self.log())
            if found:
                return found.group(1)
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}:\n{self.log()}")
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"serve did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text()

    def metrics(self) -> str:
        """``/metrics`` of this serve, as text."""
        import urllib.request
        url = re.findall(r"serving metrics on (http://\S+)/metrics", self.log())[-1]
        with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
            return resp.read().decode()

    def long_polls(self) -> int:
        """Receives waiting on this serve now (``mqstore_rpc_long_polls``)."""
        found = re.search(r'^mqstore_rpc_long_polls\{protocol="grpc"\} (\S+)$',
                          self.metrics(), re.M)
        return int(float(found.group(1))) if found else 0

    def stop(self, signum=signal.SIGTERM) -> int:
        """Signal serve's process (``kill PID``); the exit status. Not its process group: a
        group SIGTERM within a flush interval of async puts restarts the flush worker with a
        stale flushed offset and the close is then unclean (a store issue apart from the
        endpoint, seen in test_cli_serve's setting too once puts precede the signal)."""
        from mqstore.testing import patience

        if self.proc.poll() is None:
            os.kill(self.proc.pid, signum)
        return self.proc.wait(patience(STOP_TIMEOUT_S))

    def kill(self) -> None:
        from mqstore.testing import patience

        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(patience(STOP_TIMEOUT_S))


class Clients:
    """Official clients against one endpoint, shut down together (by ``close``, or at the end
    of a ``with`` block)."""

    def __init__(self, rocketmq, endpoint: str, **config) -> None:
        self.mq = rocketmq
        self.endpoint = endpoint
        self.config = config
        self._open: list = []

    def configuration(self, ak: str = "", sk: str = ""):
        return self.mq.ClientConfiguration(self.endpoint, self.mq.Credentials(ak, sk),
                                           **{"request_timeout": CLIENT_REQUEST_TIMEOUT_S,
                                              **self.config})

    def producer(self, *topics: str, **kwargs):
        p = self.mq.Producer(self.configuration(**kwargs), topics or None)
        p.startup()
        self._open.append(p)
        return p

    def consumer(self, group: str, subscriptions: dict, await_s: int = 2, **kwargs):
        c = self.mq.SimpleConsumer(self.configuration(**kwargs), group, subscriptions,
                                   await_duration=await_s)
        c.startup()
        self._open.append(c)
        return c

    def message(self, topic: str, body: bytes, tag: str | None = None, keys=(),
                properties: dict | None = None):
        m = self.mq.Message()
        m.topic = topic
        m.body = body
        if tag is not None:
            m.tag = tag
        for key in ([keys] if isinstance(keys, str) else keys):
            m.keys = key  # the client's setter adds one key per assignment
        for name, value in (properties or {}).items():
            m.add_property(name, value)
        return m

    def receive_all(self, consumer, count: int, invisible_s: int = 30, timeout_s: float = 30,
                    ack: bool = True) -> list:
        from mqstore.testing import patience
        got: list = []
        deadline = time.monotonic() + patience(timeout_s)
        while len(got) < count and time.monotonic() < deadline:
            batch = consumer.receive(32, invisible_s)
            for m in batch:
                if ack:
                    consumer.ack(m)
            got += batch
        return got

    def __enter__(self) -> Clients:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for client in reversed(self._open):
            try:
                client.shutdown()
            except Exception:  # noqa: BLE001 - a client already shut down by its test
                pass
        self._open.clear()


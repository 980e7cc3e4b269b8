"""``mqstore serve``: one deployment, a writable store with its workers and cleanup, its
metrics and health over HTTP, until SIGTERM or SIGINT.

The endpoints are served on an asyncio event loop in the main thread (``http_server``, with
its limits on connections, time, bytes and descriptors); the WSGI application runs on the
server's few threads, so the loop never waits on the store, and other asyncio servers of the
deployment run on the same loop (``_serve_endpoints`` starts and stops them in turn).

Shutdown: the signal handler is installed before the store opens (so the store's put shield
wraps it: NOTE [ Uninterrupted puts ]); it marks the deployment stopping and wakes the loop,
which closes the endpoints; then the main thread closes the store, which commits and flushes
everything written, stops the workers, unlinks its shared memory and removes ``abort`` (NOTE
[ Shutdown ] in ``workers.supervisor``). The workers leave SIGINT and SIGTERM to this process
(``uninterrupted.worker_signals``): a signal sent to the whole process group, as a terminal,
systemd or a container runtime sends it, stops them once, in order, through that close.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, make_wsgi_app

from mqstore.config import StoreConfig, parse_listen
from mqstore.ops.admin import ServedAdmin
from mqstore.ops.http_server import HttpServer, Limits
from mqstore.ops.metrics import StoreCollector
from mqstore.ops.repair import describe
from mqstore.running_flags import DISK_FULL, NOT_WRITEABLE
from mqstore.storage.checkpoint import abort_exists
from mqstore.store import MessageStore

log = logging.getLogger("mqstore.serve")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _Stop:
    """Set by SIGTERM or SIGINT (the handler runs in the main thread, between bytecodes, also
    while the loop waits); ``flag`` is what ``/healthz`` reads on the server's threads."""

    def __init__(self) -> None:
        self.received: list[str] = []
        self.flag = threading.Event()
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, signum, _frame) -> None:
        self.received.append(signal.Signals(signum).name)
        self.flag.set()
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def wait(self) -> None:
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        if not self.flag.is_set():
            await self._event.wait()


def health(store: MessageStore, stopping: bool) -> tuple[int, dict]:
    """HTTP status and body of ``/healthz``."""
    problems = []
    if stopping:
        problems.append("shutting down")
    else:
        dispatch, flush = store.worker_status(), store.flush_client.status()
        for name, status in (("dispatch", dispatch), ("flush", flush)):
            if not status["alive"]:
                problems.append(f"{name} worker is not running")
        failing = dispatch.get("failing")
        if failing:
            problems.append(failing)
        if store.running_flags & DISK_FULL:
            problems.append("disk full: puts are refused")
        elif store.running_flags & NOT_WRITEABLE:
            problems.append("the store is not writable")
        if store.replication is not None:
            problems.extend(store.replication.problems())
    body = {"status": "failing" if problems else "ok", "problems": problems,
            "commit_log_max_offset": None if stopping else store.max_phys_offset}
    return (503 if problems else 200), body


def make_app(store: MessageStore, stopping: threading.Event):
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            code, body = health(store, stopping.is_set())
            start_response(f"{code} {'OK' if code == 200 else 'Service Unavailable'}",
                           [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /healthz\n"]
    return app


def serve(root: str, config: StoreConfig,
          on_ready: Callable[[str], None] = lambda url: None) -> bool:
    """Run until SIGTERM or SIGINT; True when the store closed cleanly. Main thread only."""
    stop = _Stop()
    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    try:
        return _run(root, config, stop, on_ready)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _start_endpoint(store: MessageStore, config: StoreConfig):
    """The gRPC endpoint when ``server.grpc_listen`` is set (imported only then: it needs the
    grpc extra), with its admin service running ``mqstore topic|group --server`` on ``store``."""
    if config.server.grpc_listen is None:
        return None
    from mqstore.endpoint.server import start_endpoint
    return start_endpoint(store, config, admin=ServedAdmin(store))


def _start_remoting(store: MessageStore, config: StoreConfig):
    """The RocketMQ remoting server when ``server.remoting_listen`` is set."""
    if config.server.remoting_listen is None:
        return None
    from mqstore.remoting.server import start_remoting
    return start_remoting(store, config)


def _run(root, config, stop: _Stop, on_ready) -> bool:
    log.info("opening store %s (writer %s, flush %s, dispatch worker %s, flush worker %s)",
             root, config.writer.kind, config.flush.policy, config.dispatch.worker,
             config.flush.worker)
    store = MessageStore.open(root, config=config)
    try:
        for line in describe(store.recovery_report):
            log.info("recovery: %s", line)
        log.info("store open: commit log [%d, %d)", store.min_phys_offset, store.max_phys_offset)
        store.replication.start()  # by store.role; the store's close stops it
        asyncio.run(_serve_endpoints(store, config, stop, on_ready))
    finally:
        store.close()
    clean = not abort_exists(root)
    if clean:
        log.info("store closed cleanly (everything flushed and dispatched)")
    else:
        log.error("store closed, but not cleanly: the next open recovers it")
    return clean


async def _serve_endpoints(store: MessageStore, config: StoreConfig, stop: _Stop,
                           on_ready) -> None:
    host, port = parse_listen(config.server.metrics_listen)
    limits = Limits.of(config.server)
    httpd = HttpServer(make_app(store, stop.flag), host, port, limits)
    await httpd.start()
    try:
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{httpd.port}"
        log.info("serving metrics on %s/metrics and health on %s/healthz", url, url)
        _check_descriptors(httpd)
        # The gRPC endpoint runs its own loop on its own thread: a flood of RPCs never slows
        # /healthz, and it stops (NOTE [ Endpoint shutdown ]) before the store closes.
        endpoint = await asyncio.to_thread(_start_endpoint, store, config)
        remoting = None
        try:
            # The remoting server too (NOTE [ Remoting shutdown ]): its own loop and thread.
            remoting = await asyncio.to_thread(_start_remoting, store, config)
            on_ready(url)
            await stop.wait()
            log.info("%s received: shutting down", stop.received[0] if stop.received else "stop")
        finally:
            if remoting is not None:
                await asyncio.to_thread(remoting.stop)
            if endpoint is not None:
                await asyncio.to_thread(endpoint.stop)
    finally:
        await httpd.close()


def _check_descriptors(httpd: HttpServer) -> None:
    """Warn when the descriptor limit leaves less room than server.max_connections."""
    if httpd.fd_ceiling is None or not os.path.isdir("/proc/self/fd"):
        return
    room = httpd.fd_ceiling - len(os.listdir("/proc/self/fd"))
    if room < httpd.limits.max_connections:
        log.warning("server.max_connections is %d, but the descriptor limit (RLIMIT_NOFILE) "
                    "leaves room for about %d connections beside the store's files; "
                    "connections past that are closed at once (raise the limit, e.g. "
                    "LimitNOFILE= or ulimit -n)", httpd.limits.max_connections, max(room, 0))

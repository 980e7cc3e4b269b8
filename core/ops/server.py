"""``mqstore serve``: one deployment, a writable store with its workers and cleanup, its
metrics and health over HTTP, until SIGTERM or SIGINT.

Shutdown: the signal sets an event (the handler is installed before the store opens, so the
store's put shield wraps it: NOTE [ Uninterrupted puts ]); the main thread then stops the
HTTP server and closes the store, which commits and flushes everything written, stops the
workers, unlinks its shared memory and removes ``abort`` (NOTE [ Shutdown ] in
``workers.supervisor``). Workers leave SIGINT to this process; a SIGTERM sent to the whole
group makes them finish their work and exit, and the supervisor starts them again until the
close stops them for good.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import socketserver
import threading
from typing import Callable
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

from mqstore.config import StoreConfig, parse_listen
from mqstore.ops import put_metrics
from mqstore.ops.metrics import StoreCollector
from mqstore.ops.repair import describe
from mqstore.running_flags import DISK_FULL, NOT_WRITEABLE
from mqstore.storage.checkpoint import abort_exists
from mqstore.store import MessageStore

log = logging.getLogger("mqstore.serve")
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
WAKE_S = 1.0


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scrape in flight never holds up the shutdown


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Handler(WSGIRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the stdlib's name
        log.debug("%s %s", self.address_string(), format % args)


def with_put_metrics(config: StoreConfig) -> StoreConfig:
    modules = config.plugins.modules
    if put_metrics.MODULE in modules:
        return config
    return config.replace(plugins={"modules": [*modules, put_metrics.MODULE]})


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
    registry.register(StoreCollector(store, put_metrics.COUNTS))
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
    stop = threading.Event()
    received: list[str] = []

    def on_signal(signum, _frame):
        received.append(signal.Signals(signum).name)
        stop.set()

    previous = {s: signal.signal(s, on_signal) for s in STOP_SIGNALS}
    try:
        return _run(root, with_put_metrics(config), stop, received, on_ready)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _run(root, config, stop, received, on_ready) -> bool:
    log.info("opening store %s (writer %s, flush %s, dispatch worker %s, flush worker %s)",
             root, config.writer.kind, config.flush.policy, config.dispatch.worker,
             config.flush.worker)
    store = MessageStore.open(root, config=config)
    try:
        for line in describe(store.recovery_report):
            log.info("recovery: %s", line)
        log.info("store open: commit log [%d, %d)", store.min_phys_offset, store.max_phys_offset)
        store.replication.start()  # by store.role; the store's close stops it
        host, port = parse_listen(config.server.metrics_listen)
        server_class = _Server6 if ":" in host else _Server
        httpd = make_server(host, port, make_app(store, stop), server_class=server_class,
                            handler_class=_Handler)
        thread = threading.Thread(target=httpd.serve_forever, name="mqstore-metrics",
                                  daemon=True)
        thread.start()
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{httpd.server_port}"
        log.info("serving metrics on %s/metrics and health on %s/healthz", url, url)
        on_ready(url)
        try:
            while not stop.wait(WAKE_S):
                pass
            log.info("%s received: shutting down", received[0] if received else "stop")
        finally:
            httpd.shutdown()
            httpd.server_close()
            thread.join()
    finally:
        store.close()
    clean = not abort_exists(root)
    if clean:
        log.info("store closed cleanly (everything flushed and dispatched)")
    else:
        log.error("store closed, but not cleanly: the next open recovers it")
    return clean

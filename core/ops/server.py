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

Reload: SIGHUP (what a service manager sends for a reload) is never a stop. Its handler, too,
is installed before the store opens and only notes the signal and wakes the loop; the loop
reads the configuration file again (on a thread) and applies what changes without a restart
(``ops.reload``: log level, HTTP limits, the endpoint's access keys and connection cap),
logging each change it took and each one that needs a restart. The workers ignore SIGHUP, so
one sent to the whole process group reloads once too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import threading
from typing import Callable

from prometheus_client import CollectorRegistry, disable_created_metrics, make_wsgi_app

from mqstore.config import StoreConfig, coordination_listen_problem, parse_listen
from mqstore.errors import ConfigError
from mqstore.ops import reload
from mqstore.ops.admin import ServedAdmin
from mqstore.ops.http_server import HttpServer, Limits
from mqstore.ops.metrics import StoreCollector
from mqstore.ops.checking.repair import describe
from mqstore.replication.node import advertised
from mqstore.running_flags import DISK_FULL, NOT_WRITEABLE
from mqstore.storage.abort_file import abort_exists
from mqstore.store import MessageStore

log = logging.getLogger(__name__)
STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
RELOAD_SIGNAL = signal.SIGHUP


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


class _Hangups:
    """SIGHUP: counted by the handler (main thread, any time), acted on by the loop."""

    def __init__(self) -> None:
        self.pending = 0
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def __call__(self, _signum, _frame) -> None:
        self.pending += 1
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._event.set)

    async def each(self, act) -> None:
        """Await ``act()`` once per burst of SIGHUPs (one that came before the loop too)."""
        self._event = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while True:
            if not self.pending:
                await self._event.wait()
            self._event.clear()
            self.pending = 0
            try:
                await act()
            except Exception:  # noqa: BLE001 - a failed reload never ends serve, nor reloads
                log.exception("SIGHUP received: the reload failed; serve goes on")


class _Deployment:
    """What a reload changes: the running configuration and the servers it configures."""

    def __init__(self, config: StoreConfig, reread, debug: bool, httpd: HttpServer) -> None:
        self.config = config
        self.reread = reread  # the configuration file, read again (None: nothing to read)
        self.debug = debug  # -v: the log level stays debug
        self.httpd = httpd
        self.endpoint = None

    async def reload(self) -> None:
        if self.reread is None:
            log.warning("SIGHUP received: no configuration file to reload; going on")
            return
        try:
            wanted = await asyncio.to_thread(self.reread)
        except (ConfigError, OSError) as exc:
            log.error("SIGHUP received: configuration not reloaded, serve goes on as it "
                      "was: %s", exc)
            return
        changes = reload.changes(self.config, wanted)
        taken = [c for c in changes if c.reloaded]
        self.config = reload.applied(self.config, taken)
        self._apply()
        log.info("SIGHUP received: configuration reloaded, %d change(s) taken, %d need a "
                 "restart", len(taken), len(changes) - len(taken))
        for change in changes:
            if change.reloaded:
                log.info("reloaded %s", change.show())
            else:
                log.warning("not reloaded, needs a restart: %s", change.show())

    def _apply(self) -> None:
        server = self.config.server
        if not self.debug:
            logging.getLogger().setLevel(server.log_level.upper())
        self.httpd.set_limits(Limits.of(server))
        if self.endpoint is not None:
            self.endpoint.reload(self.config)


def health(store: MessageStore, stopping: bool, starting: str | None = None
           ) -> tuple[int, dict]:
    """HTTP status and body of ``/healthz``; ``starting``: what is not serving yet."""
    problems = []
    if stopping:
        problems.append("shutting down")
    elif starting:
        problems.append(f"starting: {starting}")
    else:
        dispatch, flush = store.worker_status(), store.internals.flush_client.status()
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


def make_app(store: MessageStore, stopping: threading.Event, rpc_metrics=None,
             starting: Callable[[], str | None] = lambda: None):
    """``rpc_metrics``: the endpoints' ``RpcMetrics``, served beside the store's;
    ``starting()``: what is not serving yet (``/healthz`` fails until it answers None)."""
    # Counters and histograms without a ``_created`` sample each: the store's own never had
    # one, and the series says nothing a restart does not.
    disable_created_metrics()
    registry = CollectorRegistry(auto_describe=False)
    registry.register(StoreCollector(store))
    if rpc_metrics is not None:
        rpc_metrics.register(registry)
    metrics = make_wsgi_app(registry)

    def app(environ, start_response):
        path = environ.get("PATH_INFO", "")
        if path == "/metrics":
            return metrics(environ, start_response)
        if path == "/healthz":
            code, body = health(store, stopping.is_set(), starting())
            start_response(f"{code} {'OK' if code == 200 else 'Service Unavailable'}",
                           [("Content-Type", "application/json")])
            return [json.dumps(body).encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found: try /metrics or /healthz\n"]
    return app


def serve(root: str, config: StoreConfig,
          on_ready: Callable[[str], None] = lambda url: None,
          reread: Callable[[], StoreConfig] | None = None, debug: bool = False) -> bool:
    """Run until SIGTERM or SIGINT; True when the store closed cleanly. Main thread only.

    SIGHUP calls ``reread`` for the configuration file's current content and applies it
    (``ops.reload``); ``debug``: the log level stays DEBUG whatever the file says."""
    stop, hangups = _Stop(), _Hangups()
    previous = {s: signal.signal(s, stop) for s in STOP_SIGNALS}
    previous[RELOAD_SIGNAL] = signal.signal(RELOAD_SIGNAL, hangups)
    try:
        return _run(root, config, stop, on_ready, (hangups, reread, debug))
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


def _endpoint(store: MessageStore, config: StoreConfig, rpc_metrics):
    """The gRPC endpoint when ``server.grpc_listen`` is set (imported only then: it needs the
    grpc extra), with its admin service running ``mqstore topic|group --server`` on ``store``;
    not started yet."""
    if config.server.grpc_listen is None:
        return None
    from mqstore.endpoint.server import Endpoint
    return Endpoint(store, config, admin=ServedAdmin(store), metrics=rpc_metrics)


def _rpc_metrics(config: StoreConfig):
    """The endpoints' RPC metrics (NOTE [ RPC metrics ]) when an endpoint is configured."""
    if config.server.grpc_listen is None and config.server.remoting_listen is None:
        return None
    from mqstore.endpoint.rpc_metrics import RpcMetrics
    return RpcMetrics()


def _start_remoting(store: MessageStore, config: StoreConfig, rpc_metrics):
    """The RocketMQ remoting server when ``server.remoting_listen`` is set, its requests
    counted in the endpoints' RPC metrics."""
    if config.server.remoting_listen is None:
        return None
    from mqstore.ops.remoting_metrics import observer
    from mqstore.remoting.server import start_remoting
    return start_remoting(store, config, observer(rpc_metrics))


def _run(root, config, stop: _Stop, on_ready, reloading) -> bool:
    if config.coordination.etcd_endpoints:  # refused before the store is touched
        problem = coordination_listen_problem(config.server, config.coordination)
        if problem is not None:
            raise ConfigError(problem)
    log.info("opening store %s (writer %s, flush %s, dispatch worker %s, flush worker %s)",
             root, config.writer.kind, config.flush.policy, config.dispatch.worker,
             config.flush.worker)
    store = MessageStore.open(root, config=config)
    try:
        for line in describe(store.recovery_report):
            log.info("recovery: %s", line)
        log.info("store open: commit log [%d, %d)", store.min_phys_offset, store.max_phys_offset)
        # Its write guard holds before replication or an endpoint can act on the store.
        failover = _failover(store, config)
        store.replication.start()  # by store.role; the store's close stops it
        try:
            asyncio.run(_serve_endpoints(store, config, stop, on_ready, reloading, failover))
        finally:
            if failover is not None:
                failover.stop()  # steps down first: another node is elected at once
    finally:
        store.close()
    clean = not abort_exists(root)
    if clean:
        log.info("store closed cleanly (everything flushed and dispatched)")
    else:
        log.error("store closed, but not cleanly: the next open recovers it")
    return clean


def _failover(store: MessageStore, config: StoreConfig):
    """Automatic failover (``ops.failover``) when ``coordination.etcd_endpoints`` is set
    (imported only then: it needs the ha extra); not started yet."""
    if not config.coordination.etcd_endpoints:
        return None
    from mqstore.ops.failover import Failover
    return Failover(store, config)


async def _serve_endpoints(store: MessageStore, config: StoreConfig, stop: _Stop,
                           on_ready, reloading, failover=None) -> None:
    hangups, reread, debug = reloading
    host, port = parse_listen(config.server.metrics_listen)
    limits = Limits.of(config.server)
    rpc_metrics = _rpc_metrics(config)
    if rpc_metrics is not None:
        store.watch_dead_letters(rpc_metrics.dead_lettered)
    endpoint = _endpoint(store, config, rpc_metrics)

    def starting() -> str | None:  # an endpoint has its address once it serves
        return "the gRPC endpoint" if endpoint is not None and endpoint.address is None \
            else None
    httpd = HttpServer(make_app(store, stop.flag, rpc_metrics, starting), host, port, limits)
    await httpd.start()
    deployment = _Deployment(config, reread, debug, httpd)
    try:
        shown = f"[{host}]" if ":" in host else host
        url = f"http://{shown}:{httpd.port}"
        log.info("serving metrics on %s/metrics and health on %s/healthz", url, url)
        _check_descriptors(httpd)
        # The gRPC endpoint runs its own loop on its own thread: a flood of RPCs never slows
        # /healthz, and it stops (NOTE [ Endpoint shutdown ]) before the store closes.
        if endpoint is not None:
            await asyncio.to_thread(endpoint.start)
            deployment.endpoint = endpoint
            if store.replication is not None:  # what slaves forward clients' calls to
                store.replication.client_endpoint = advertised(endpoint.address)
        if failover is not None:
            await asyncio.to_thread(failover.start, endpoint.address if endpoint else None)
        reloads = asyncio.ensure_future(hangups.each(deployment.reload))
        remoting = None
        try:
            # The remoting server too (NOTE [ Remoting shutdown ]): its own loop and thread.
            remoting = await asyncio.to_thread(_start_remoting, store, config, rpc_metrics)
            on_ready(url)
            await stop.wait()
            log.info("%s received: shutting down", stop.received[0] if stop.received else "stop")
        finally:
            reloads.cancel()
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

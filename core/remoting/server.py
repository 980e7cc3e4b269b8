"""The remoting server's lifecycle: an asyncio server on its own thread and event loop, beside
``mqstore serve``'s metrics server and the gRPC endpoint, over the store that process opened;
and ``dispatch``, which hands each request to its processor.

Processors are modules with ``handlers(broker) -> {request code: handler}``
(``PROCESSORS``); a handler takes ``(broker, connection, request)`` and returns the response,
a coroutine that returns it (work on a thread: puts that wait for the disk, key queries), or
None when it answers later itself (a held pull). A code no processor serves is answered
REQUEST_CODE_NOT_SUPPORTED naming it; a ``RemotingError`` answers its code and remark; a
ValueError from the store (a bad topic or queue id) SYSTEM_ERROR with its message; anything
else SYSTEM_ERROR naming the exception (logged). A oneway request gets no answer, whatever
happens.

NOTE [ Remoting shutdown ]
``stop`` (called by serve once SIGTERM or SIGINT arrived, before the store closes):

  1. the listener closes (no new connections), the broker is marked stopping: every held
     pull is run again at once and answered with what there is, no pull is held any more,
     and new requests are answered SERVICE_NOT_AVAILABLE (producers try another broker);
  2. requests in flight (puts on threads, key queries) finish, for at most STOP_GRACE_S;
  3. the broker unregisters from its NameServers, the connections close, the threads end.

Only then does serve close the store, so no request touches a closed store, and every send
answered SUCCESS was stored before the close flushed the commit log.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

from mqstore.config import StoreConfig, parse_listen
from mqstore.config.descriptors import connection_cap, reserved_descriptors
from mqstore.format.remoting_frame import Command
from mqstore.remoting import (
    admin, client_calls, namesrv, offsets, pull, queries, send, send_back, transactions,
)
from mqstore.errors import StoreClosedError
from mqstore.remoting.broker import MASTER_ID, Broker, advertised, show
from mqstore.remoting.client_calls import notify_changed
from mqstore.remoting.codes import RemotingError, Resp
from mqstore.remoting.connection import Connection
from mqstore.remoting.listener import Listener
from mqstore.remoting.registration import Registration
from mqstore.remoting.stats import SAMPLE_INTERVAL_S
from mqstore.remoting.topics import BrokerTopics
from mqstore.remoting.wakeups import DispatchWatch

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
STOP_TIMEOUT_S = STOP_GRACE_S + 10.0
SWEEP_INTERVAL_S = 5.0
NON_WAITING_FLUSH = "async"
PUT_THREADS = 16
SLOW_THREADS = 4
# The request processors, each one module (``handlers(broker)``).
PROCESSORS = (send, send_back, pull, queries, offsets, client_calls, admin, namesrv,
              transactions)


def build_broker(store, config: StoreConfig, port: int) -> Broker:
    server = config.server
    host, _ = parse_listen(server.remoting_listen)
    slave_id = (server.remoting_broker_id if server.remoting_broker_id not in (None, MASTER_ID)
                else 1)
    address = advertised(host, port, server.remoting_advertise)
    put_pool = None
    if config.flush.policy != NON_WAITING_FLUSH or config.store.role == "sync_master":
        put_pool = ThreadPoolExecutor(PUT_THREADS, thread_name_prefix="mqstore-remoting-put")
    return Broker(store=store, config=config,
                  address=address, name=server.remoting_broker_name,
                  cluster=server.remoting_cluster, slave_id=slave_id,
                  topics=BrokerTopics(store, config), put_pool=put_pool,
                  slow_pool=ThreadPoolExecutor(SLOW_THREADS,
                                               thread_name_prefix="mqstore-remoting-query"))


class RemotingServer:
    """RocketMQ's remoting protocol over one open store. ``start`` then ``stop``;
    ``address`` is where it listens (the port chosen when the configuration said 0)."""

    def __init__(self, store, config: StoreConfig, observe=None) -> None:
        """``observe(request code, response code, seconds)``, if given, is called on the
        loop's thread for every request answered (held pulls included): the seam for per-
        request metrics."""
        self._store = store
        self._config = config
        self._observe = observe
        server = config.server
        self.max_frame_bytes = server.remoting_max_frame_bytes
        self.max_in_flight = server.remoting_max_in_flight
        self.max_connections = server.remoting_max_connections  # the accept cap once serving
        self.idle_s = server.remoting_client_idle_ms / 1000.0
        self.address: str | None = None
        self.broker: Broker | None = None
        self.connections: set[Connection] = set()
        self._handlers: dict = {}
        self._tasks: set[asyncio.Task] = set()
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="mqstore-remoting", daemon=True)

    # -- lifecycle ------------------------------------------------------------------------
    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError(f"the remoting server did not start within {START_TIMEOUT_S} s")
        if self._failure is not None:
            self._thread.join(STOP_TIMEOUT_S)
            raise self._failure
        return self.address

    def stop(self) -> None:
        """NOTE [ Remoting shutdown ]; returns once the server's threads ended."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("the remoting server did not stop within %s s", STOP_TIMEOUT_S)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            if not self._ready.is_set():
                self._failure = exc
                self._ready.set()
            else:
                log.exception("the remoting server failed")

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop, self._stop = loop, asyncio.Event()
        cfg = self._config.server
        host, port = parse_listen(cfg.remoting_listen)
        cap = self.max_connections = self._accept_cap()
        try:
            listener = Listener(host, port, cap, lambda: Connection(self),
                                lambda: len(self.connections))
        except OSError as exc:
            raise OSError(f"cannot listen on server.remoting_listen {cfg.remoting_listen!r}: "
                          f"{exc.strerror or exc}") from None
        try:
            await self._serve_on(listener, host)
        finally:
            listener.close()

    async def _serve_on(self, listener: Listener, host: str) -> None:
        loop, cfg = self._loop, self._config.server
        bound = listener.port
        broker = self.broker = build_broker(self._store, self._config, bound)
        broker.observe = self._observe
        watch = DispatchWatch(self._store.root, loop, lambda: broker.holds.on_dispatch())
        broker.holds = pull.HeldPulls(broker, loop, watch, cfg.remoting_max_held_pulls,
                                      cfg.remoting_max_long_polling_ms)
        broker.offsets = offsets.Offsets(self._store)
        if cfg.namesrv_addr:
            broker.registration = Registration(broker, cfg.namesrv_addr)
        for module in PROCESSORS:
            self._handlers.update(module.handlers(broker))
        checks = transactions.Checks(broker, loop)  # producers asked about open ones
        _checker(self._store, checks.check, add=True)
        watch.start()
        if broker.registration is not None:
            broker.registration.start()
        sweeper = asyncio.ensure_future(self._sweep())
        sampler = asyncio.ensure_future(self._sample())
        self.address = show(host, bound)
        log.info("serving RocketMQ remoting on %s as broker %s (id %d, cluster %s, told "
                 "clients %s), %s", self.address, broker.name, broker.broker_id,
                 broker.cluster, broker.address,
                 f"registering with name servers {cfg.namesrv_addr}" if cfg.namesrv_addr
                 else "answering name-server requests itself")
        store_host = self._config.store.store_host
        if store_host != broker.address:
            log.warning("store.store_host is %s but clients are told %s: records carry the "
                        "store host, and clients take the offset message ids of the messages "
                        "they consume from it (mqadmin queryMsgById dials it); set "
                        "store.store_host to the advertised address", store_host,
                        broker.address)
        listener.start()
        self._ready.set()
        try:
            await self._stop.wait()
            log.info("remoting server stopping: held pulls answer now; no new connections")
            listener.close()
            broker.stopping = True
            broker.holds.answer_all()
            await self._drain()
            if broker.registration is not None:
                await broker.registration.stop()
        finally:
            sweeper.cancel()
            sampler.cancel()
            _checker(self._store, checks.check, add=False)
            for conn in list(self.connections):
                conn.close()
            await asyncio.sleep(0)
            watch.stop()
            if broker.put_pool is not None:
                broker.put_pool.shutdown(wait=True)
            broker.slow_pool.shutdown(wait=True)
        log.info("remoting server stopped")

    def _accept_cap(self) -> int:
        """server.remoting_max_connections, or this server's share of the descriptors the limit
        leaves (NOTE [ Listener descriptors ])."""
        server = self._config.server
        grpc = ({"the gRPC endpoint": server.grpc_max_connections}
                if server.grpc_listen is not None else None)
        return connection_cap("the remoting server", "server.remoting_max_connections",
                              server.remoting_max_connections,
                              reserved_descriptors(self._config), grpc)

    async def _drain(self) -> None:
        deadline = time.monotonic() + STOP_GRACE_S
        while any(c.in_flight for c in self.connections) and time.monotonic() < deadline:
            await asyncio.sleep(0.01)

    async def _sweep(self) -> None:
        while True:
            await asyncio.sleep(min(SWEEP_INTERVAL_S, self.idle_s / 2))
            self.sweep()

    async def _sample(self) -> None:
        """NOTE [ Broker stats ]: a snapshot a second."""
        broker = self.broker
        while True:
            try:
                broker.stats.sample(self._store.put_counts().messages)
            except Exception:  # noqa: BLE001 - the store reopening for a role change
                log.debug("broker stats: no put count this second", exc_info=True)
            await asyncio.sleep(SAMPLE_INTERVAL_S)

    def sweep(self) -> None:
        """Close idle connections and forget clients that stopped heart-beating."""
        now = time.monotonic()
        for conn in list(self.connections):
            idle = conn.idle_for(now)
            if idle <= self.idle_s:
                continue
            if conn.write_paused_at is not None:
                log.warning("closing %s: it has not read its answers for %.1f s "
                            "(server.remoting_client_idle_ms)", conn.peer, idle)
                conn.abort()
            else:
                log.info("closing %s: idle for %.1f s (server.remoting_client_idle_ms)",
                         conn.peer, idle)
                conn.close()
        broker = self.broker
        if broker is not None:
            notify_changed(broker, broker.clients.expire())

    # -- connections ----------------------------------------------------------------------
    def admit(self, conn: Connection) -> None:
        """``conn`` is open (the listener took no more than its cap)."""
        self.connections.add(conn)

    def lost(self, conn: Connection) -> None:
        if conn not in self.connections:
            return
        self.connections.discard(conn)
        broker = self.broker
        if broker is not None:
            broker.holds.forget(conn)
            notify_changed(broker, broker.clients.connection_closed(conn))

    # -- requests -------------------------------------------------------------------------
    def dispatch(self, conn: Connection, cmd: Command) -> None:
        if cmd.is_response:
            return  # the broker's own requests are oneway
        handler = self._handlers.get(cmd.code)
        if handler is None:
            if not cmd.is_oneway:
                conn.send(cmd.response(Resp.REQUEST_CODE_NOT_SUPPORTED,
                                       f"request type {cmd.code} not supported"))
            return
        if self.broker.stopping:
            if not cmd.is_oneway:
                conn.send(cmd.response(Resp.SERVICE_NOT_AVAILABLE,
                                       f"broker {self.broker.name} is shutting down"))
            return
        started = time.perf_counter()
        try:
            result = handler(self.broker, conn, cmd)
        except Exception as exc:  # noqa: BLE001 - every failure is an answer
            self._answer(conn, cmd, self._failure_response(conn, cmd, exc), started)
            return
        if type(result) is Command:  # answered at once (a send's usual end): no coroutine
            self._answer(conn, cmd, result, started)
        elif asyncio.iscoroutine(result):
            conn.started()
            task = asyncio.ensure_future(self._finish(conn, cmd, result, started))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        elif result is not None:
            self._answer(conn, cmd, result, started)

    async def _finish(self, conn: Connection, cmd: Command, work, started: float) -> None:
        try:
            response = await work
        except Exception as exc:  # noqa: BLE001 - every failure is an answer
            response = self._failure_response(conn, cmd, exc)
        finally:
            conn.finished()
        self._answer(conn, cmd, response, started)

    def _answer(self, conn: Connection, cmd: Command, response: Command | None,
                started: float) -> None:
        if response is None:
            return
        if not cmd.is_oneway:
            conn.send(response)
        observe = self.broker.observe
        if observe is not None:
            observe(cmd.code, response.code, time.perf_counter() - started)

    @staticmethod
    def _failure_response(conn: Connection, cmd: Command, exc: Exception) -> Command:
        if isinstance(exc, RemotingError):
            return cmd.response(exc.code, exc.remark)
        if isinstance(exc, ValueError):
            return cmd.response(Resp.SYSTEM_ERROR, str(exc))
        log.exception("request %d from %s failed", cmd.code, conn.peer)
        return cmd.response(Resp.SYSTEM_ERROR, f"{type(exc).__name__}: {exc}")


def _checker(store, check, add: bool) -> None:
    """Ask this server's producers about the store's open transactions, or no longer."""
    try:
        if add:
            store.add_transaction_checker(check)
        else:
            store.remove_transaction_checker(check)
    except (StoreClosedError, PermissionError):
        pass  # closed first, or read-only: no checker


def start_remoting(store, config: StoreConfig, observe=None) -> RemotingServer:
    """Start the server ``server.remoting_listen`` names over ``store``; ``stop`` it before
    closing the store. ``observe``: ``RemotingServer``'s per-request callback."""
    server = RemotingServer(store, config, observe)
    server.start()
    return server


__all__ = ["RemotingServer", "start_remoting", "PROCESSORS", "STOP_GRACE_S"]

"""The endpoint's lifecycle: a ``grpc.aio`` server on its own thread and event loop, beside
``mqstore serve``'s metrics server, over the store that process opened.

NOTE [ Endpoint shutdown ]
``stop`` (called by serve once SIGTERM or SIGINT arrived, before the store closes):

  1. the endpoint is marked stopping: every long-polling receive returns at once with what it
     has (nothing, or messages it already popped), and every Telemetry stream ends;
  2. ``server.stop(STOP_GRACE_S)``: no new RPC is accepted (clients get UNAVAILABLE and try
     another endpoint or again later); RPCs in flight (sends, acks) finish, and whatever
     still runs after the grace period is cancelled;
  3. the put threads and the wake-up thread end, and the thread running the loop exits.

Only then does serve close the store, so no RPC touches a closed store, and every send that
was answered PUT_OK was stored before the close flushed the commit log.

Plaintext by default; with ``server.grpc_tls_cert_file`` and ``grpc_tls_key_file`` the port
speaks TLS only (the Java and Go clients enable TLS by default, trusting any certificate; the
Python client verifies it against the system roots, or ``GRPC_DEFAULT_SSL_ROOTS_FILE_PATH``).
An admin service open to anyone is refused beyond loopback (``check_exposure``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import dataclass

import grpc

from mqstore.config import StoreConfig, parse_delay_levels, parse_listen
from mqstore.consumer.pop_journal import state_exists
from mqstore.endpoint.admin_service import AdminService
from mqstore.errors import StoreClosedError
from mqstore.endpoint.auth import AccessKeys, AdminAccess
from mqstore.endpoint.backlog import Backlog
from mqstore.endpoint.creations import Creations
from mqstore.endpoint.forward import PREFIX, Forwarder, RoleRouter
from mqstore.endpoint.grpc_metrics import PROTOCOL, MetricsInterceptor
from mqstore.endpoint.limits import (
    LogLimits, Peers, check_exposure, connection_cap, other_listeners, reserved_descriptors,
    return_big_buffers, server_options,
)
from mqstore.endpoint.longpoll import DispatchWaiter
from mqstore.endpoint.pops import Pops
from mqstore.endpoint.protocol import service_pb2_grpc
from mqstore.endpoint.receive import Receiver
from mqstore.endpoint.renewals import Renewals
from mqstore.endpoint.route import Topics, endpoints_of
from mqstore.endpoint.send import Sender
from mqstore.endpoint.service import MessagingService
from mqstore.endpoint.settings import SESSIONS_PER_CONNECTION, Sessions, SettingsPolicy
from mqstore.endpoint.transactions import Producers, Transactions

log = logging.getLogger(__name__)
START_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
STOP_TIMEOUT_S = STOP_GRACE_S + 10.0
SWEEP_INTERVAL_S = 10.0  # how often clients not heard from are forgotten


@dataclass
class Parts:
    """Everything the servicer works with; built on the loop's thread."""

    store: object
    topics: Topics
    pops: Pops
    sender: Sender
    receiver: Receiver
    waiter: DispatchWaiter
    sessions: Sessions
    peers: Peers
    access_keys: AccessKeys
    admin_access: AdminAccess
    backlog: Backlog
    settings_policy: SettingsPolicy
    endpoints: object  # Endpoints answered when a route query names none
    producers: Producers  # their Telemetry streams, which carry transaction check-backs
    transactions: Transactions


def _read(path: str, key: str) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError as exc:
        raise OSError(f"cannot read server.{key} {path!r}: {exc.strerror}") from None


def credentials(server) -> grpc.ServerCredentials | None:
    """TLS credentials from the configured PEM files; None for plaintext."""
    if server.grpc_tls_cert_file is None:
        return None
    cert = _read(server.grpc_tls_cert_file, "grpc_tls_cert_file")
    key = _read(server.grpc_tls_key_file, "grpc_tls_key_file")
    return grpc.ssl_server_credentials([(key, cert)])


def show(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


class Endpoint:
    """The gRPC endpoint of one open, writable store. ``start`` then ``stop``; ``address`` is
    where it listens (the port chosen when the configuration said 0). ``admin``: the topic and
    group operations its admin service runs (``ops.admin.ServedAdmin``; None: no admin
    service). ``metrics``: the ``rpc_metrics.RpcMetrics`` its RPCs are counted in (None: not
    counted)."""

    def __init__(self, store, config: StoreConfig, admin=None, metrics=None) -> None:
        check_exposure(config.server, admin is not None)
        self._store = store
        self._config = config
        self._admin = admin if config.server.grpc_admin_enabled else None
        self._metrics = metrics
        self._served: Parts | None = None  # once serving
        self._accept_cap: int | None = None  # gRPC's own connection cap, fixed at start
        self._creds = credentials(config.server)
        self.address: str | None = None
        self._ready = threading.Event()
        self._failure: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._thread = threading.Thread(target=self._run, name="mqstore-grpc", daemon=True)

    def start(self) -> str:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError(f"the gRPC endpoint did not start within {START_TIMEOUT_S} s")
        if self._failure is not None:
            self._thread.join(STOP_TIMEOUT_S)
            raise self._failure
        return self.address

    def stop(self) -> None:
        """NOTE [ Endpoint shutdown ]; returns once the endpoint's threads ended."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:
                pass  # the loop already ended
        self._thread.join(STOP_TIMEOUT_S)
        if self._thread.is_alive():
            log.error("the gRPC endpoint did not stop within %s s", STOP_TIMEOUT_S)

    def _run(self) -> None:
        try:
            asyncio.run(self._serve())
        except BaseException as exc:  # noqa: BLE001 - reported to start() or logged
            if not self._ready.is_set():
                self._failure = exc
                self._ready.set()
            else:
                log.exception("the gRPC endpoint failed")

    def _interceptors(self) -> list | None:
        return None if self._metrics is None else [MetricsInterceptor(self._metrics)]

    def reload(self, config: StoreConfig) -> None:
        """Take ``config``'s access keys and connection cap for the calls from now on (SIGHUP:
        ``ops.reload``); the rest of it needs a restart."""
        loop, parts, server = self._loop, self._served, config.server
        if loop is None or parts is None or loop.is_closed():
            return
        if self._accept_cap is not None and server.grpc_max_connections > self._accept_cap:
            log.warning("server.grpc_max_connections %d counts peers from now on, but gRPC "
                        "accepts at most the %d connections it started with until a restart",
                        server.grpc_max_connections, self._accept_cap)
        keys = AccessKeys(_pairs(server.grpc_access_keys), server.grpc_signature_skew_ms)
        # The admin keys stay as they run; whether a client key is refused there follows the new keys.
        admin_access = AdminAccess(parts.admin_access.admin_keys, keys)

        def apply() -> None:  # on the loop's thread, between two calls' guards
            parts.access_keys = keys
            parts.admin_access = admin_access
            parts.peers.max_connections = server.grpc_max_connections
            parts.sessions.max_sessions = server.grpc_max_connections * SESSIONS_PER_CONNECTION
        try:
            loop.call_soon_threadsafe(apply)
        except RuntimeError:
            pass  # the loop ended: the endpoint stopped

    def _parts(self, loop, port: int) -> Parts:
        store, config = self._store, self._config
        server = config.server
        topics = Topics(store, config.queue_select.queues_per_topic, config.topics.auto_create)
        pops = Pops(store)
        waiter = DispatchWaiter(store.root, loop)
        host, _port = parse_listen(server.grpc_listen)
        creations = Creations(server.grpc_peer_max_new_topics, server.grpc_peer_max_new_groups,
                              lambda topic, group: state_exists(store.root, topic, group))
        backlog = Backlog(server.grpc_max_unwritten_bytes_per_connection,
                          server.grpc_max_unwritten_bytes)
        access_keys = AccessKeys(_pairs(server.grpc_access_keys), server.grpc_signature_skew_ms)
        producers = Producers()
        transactions = Transactions(store, producers, loop)
        store.add_transaction_checker(transactions.check)
        return Parts(
            store=store, topics=topics, pops=pops,
            sender=Sender(store, topics, config, creations),
            receiver=Receiver(topics, pops, waiter, server, backlog, creations, port,
                              Renewals(store, server.grpc_push_invisible_ms,
                                       parse_delay_levels(config.store.message_delay_levels))),
            waiter=waiter,
            sessions=Sessions(server.grpc_max_connections * SESSIONS_PER_CONNECTION,
                              server.grpc_client_idle_ms),
            peers=Peers(server.grpc_max_connections, server.grpc_client_idle_ms),
            access_keys=access_keys,
            admin_access=AdminAccess(AccessKeys(_pairs(server.grpc_admin_keys),
                                                server.grpc_signature_skew_ms,
                                                setting="server.grpc_admin_keys"), access_keys),
            backlog=backlog, settings_policy=SettingsPolicy(config),
            endpoints=endpoints_of(host, port), producers=producers, transactions=transactions)

    async def _serve(self) -> None:
        loop = asyncio.get_running_loop()
        self._loop, self._stop = loop, asyncio.Event()
        server_cfg = self._config.server
        host, port = parse_listen(server_cfg.grpc_listen)
        cap = self._accept_cap = connection_cap(server_cfg.grpc_max_connections,
                                                reserved_descriptors(self._config),
                                                other_listeners(self._config))
        server = grpc.aio.server(options=server_options(server_cfg, cap),
                                 maximum_concurrent_rpcs=server_cfg.grpc_max_concurrent_rpcs,
                                 interceptors=self._interceptors())
        try:
            if self._creds is None:
                bound = server.add_insecure_port(show(host, port))
            else:
                bound = server.add_secure_port(show(host, port), self._creds)
        except RuntimeError as exc:
            raise OSError(f"cannot listen on server.grpc_listen {server_cfg.grpc_listen!r}: "
                          f"{exc}") from None
        if not bound:
            raise OSError(f"cannot listen on server.grpc_listen {server_cfg.grpc_listen!r}")
        parts = self._served = self._parts(loop, bound)
        if self._metrics is not None:
            self._metrics.watch_long_polls(PROTOCOL, lambda: parts.waiter.waiting)
        service = MessagingService(parts)
        forwarder = self._forwarder(service)
        server.add_generic_rpc_handlers((RoleRouter(forwarder.local_service, self._store,
                                                    forwarder),))
        admin = None
        if self._admin is not None:
            admin = AdminService(self._admin, service.enter_admin, service.peers.leave)
            server.add_generic_rpc_handlers(admin.handlers())
        await server.start()
        return_big_buffers()
        parts.waiter.start()
        sweeper = asyncio.ensure_future(self._sweep(parts))
        renewer = asyncio.ensure_future(self._renew(parts))
        limited = LogLimits()
        self.address = show(host, bound)
        log.info("serving gRPC (apache.rocketmq.v2.MessagingService) on %s, %s, %s; admin "
                 "service %s", self.address, "TLS" if self._creds else "plaintext",
                 "access keys checked" if parts.access_keys.enabled else "no access keys",
                 parts.admin_access.describe(admin is not None))
        self._ready.set()
        try:
            await self._stop.wait()
            log.info("gRPC endpoint stopping: no new RPCs; long polls end with what they have")
            service.stopping.set()
            parts.waiter.stop()
            await server.stop(STOP_GRACE_S)
        finally:
            sweeper.cancel()
            renewer.cancel()
            _no_checker(self._store, parts.transactions.check)
            if admin is not None:
                admin.close()
            parts.sender.close()
            parts.pops.close()
            parts.waiter.close()
            await forwarder.close()
            limited.remove()
        log.info("gRPC endpoint stopped")

    def _forwarder(self, service: MessagingService) -> Forwarder:
        """What a store taking no writes forwards to its master (NOTE [ Clients and
        failover ] in ``forward``), over the servicer's own handlers."""
        local = _Captured()
        service_pb2_grpc.add_MessagingServiceServicer_to_server(service, local)
        config = self._config
        tls = config.server.grpc_tls_cert_file
        forwarder = Forwarder((service.enter, service.peers.leave), local.method,
                              max(config.server.grpc_max_request_bytes,
                                  config.commit_log.max_message_bytes + (1 << 20)),
                              None if tls is None else grpc.ssl_channel_credentials(
                                  _read(tls, "grpc_tls_cert_file")))
        forwarder.local_service = local.handler
        return forwarder

    @staticmethod
    async def _sweep(parts: Parts) -> None:
        while True:
            await asyncio.sleep(SWEEP_INTERVAL_S)
            for client_id in parts.sessions.forget_idle():
                log.debug("forgot idle client %s", client_id)
                parts.receiver.renewals.give_back(client_id)

    @staticmethod
    async def _renew(parts: Parts) -> None:
        """NOTE [ Auto-renewed deliveries ] in ``renewals``: what push consumers hold stays
        invisible while they are heard from."""
        renewals = parts.receiver.renewals
        known = lambda client_id: parts.sessions.get(client_id) is not None  # noqa: E731
        while True:
            await asyncio.sleep(renewals.period_s)
            try:
                renewals.renew_due(known)
            except Exception:  # noqa: BLE001 - the next round tries again
                log.exception("renewing push consumers' deliveries failed")


def _no_checker(store, checker) -> None:
    """The store's transactions are no longer checked back through this endpoint."""
    try:
        store.remove_transaction_checker(checker)
    except (StoreClosedError, PermissionError):
        pass  # closed first, or read-only: nothing to undo


class _Captured:
    """Takes the servicer's generic handler as gRPC's server would."""

    handler: grpc.GenericRpcHandler

    def add_generic_rpc_handlers(self, handlers) -> None:
        (self.handler,) = handlers

    def method(self, name: str) -> grpc.RpcMethodHandler:
        return self.handler.service(_Details(PREFIX + name, ()))


@dataclass(frozen=True)
class _Details:
    method: str
    invocation_metadata: tuple


def _pairs(keys) -> dict[str, str]:
    return dict(pair.split(":", 1) for pair in keys)


def start_endpoint(store, config: StoreConfig, admin=None, metrics=None) -> Endpoint:
    """Start the endpoint ``server.grpc_listen`` names over ``store`` (with the admin service
    running ``admin``'s operations, its RPCs counted in ``metrics``); ``stop`` it before
    closing the store."""
    endpoint = Endpoint(store, config, admin, metrics)
    endpoint.start()
    return endpoint


__all__ = ["Endpoint", "start_endpoint", "credentials", "STOP_GRACE_S"]

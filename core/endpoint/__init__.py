"""RocketMQ 5's gRPC API (``apache.rocketmq.v2.MessagingService``) over one open store, so the
official clients (Python ``rocketmq-python-client``, Java, Go, ...) produce to and consume
from ``mqstore serve`` unchanged (docs/endpoint.md).

Needs the ``grpc`` extra (``pip install 'mqstore[grpc]'``): grpcio, protobuf, and the official
Python client, whose package ships the generated stubs. The store never imports this package;
``mqstore serve`` starts it when ``server.grpc_listen`` is set (``server.start_endpoint``).

    protocol     the generated messages and service, loaded from the client's package
    status       RocketMQ status codes: EndpointError, put statuses and errors -> codes
    resources    namespaced resource names <-> store topics and groups
    rpc_metrics  the endpoints' RPC metrics, whatever protocol carries the RPCs
    grpc_metrics the gRPC endpoint's RPCs counted into them (a server interceptor)
    auth         the access-key check (HMAC-SHA1 over x-mq-date-time, near the clock);
                 admin keys apart from client keys
    limits       what one peer may hold: connections, idle clients, request sizes; no open
                 admin service beyond loopback
    backlog      bytes receives handed out and their streams have not sent
    connections  closing a stalled peer's connection
    creations    topics and groups each client host creates
    rules        the proxy's rules for tags, keys, message groups, properties
    settings     Telemetry: each client's Settings answered as the Apache proxy does
    route        QueryRoute: which topics exist and their queues (one function)
    wire         store records <-> protobuf messages
    send         SendMessage
    pops         the store's pop API behind one adapter
    longpoll     dispatch wake-ups delivered to asyncio waiters
    receive      ReceiveMessage: pops across the topic's queues, long polling
    acks         AckMessage and ChangeInvisibleDuration
    transactions EndTransaction; check-backs on producers' Telemetry streams
    service      the servicer: every RPC, guarded (auth, limits, errors -> statuses)
    server       lifecycle: the grpc.aio server on its own thread, TLS, graceful stop
    client       `mqstore produce|consume --server` through the official client
    admin_wire   mqstore's admin service (mqstore.admin.v1.Admin): methods, JSON, refusals
    admin_service  the admin service: `mqstore topic|group --server` on the served store
    admin_client `mqstore topic|group --server`: the admin service as StoreAdmin's methods
"""

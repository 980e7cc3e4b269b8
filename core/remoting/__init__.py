"""RocketMQ 4.x's remoting protocol over one open store, so RocketMQ's remoting clients (Java
4.x, the C++ client and its Python binding, ``mqadmin``) and NameServers work with ``mqstore
serve`` (docs/remoting.md). Standard library only; the store never imports this package;
``mqstore serve`` starts it when ``server.remoting_listen`` is set.

    codes         request and response codes; store statuses -> codes; RemotingError
    fields        a request's header fields, parsed as the broker's Java parsers parse them
    listener      the listening socket: at most the connection cap, the rest closed at once
    connection    one client connection: frames, bounds, output
    server        lifecycle (own thread and loop), dispatch to the processors, shutdown
    broker        who this broker is, and the parts every processor shares
    topics        topics as clients and NameServers see them; auto-creation
    clients       heart-beating clients and consumer groups
    locks         orderly consumers' queue locks
    stats         what mqadmin's status commands read
    wakeups       dispatch wake-ups for held pulls
    send          SEND_MESSAGE, SEND_MESSAGE_V2, SEND_BATCH_MESSAGE
    transactions  END_TRANSACTION; CHECK_TRANSACTION_STATE to a producer of the group
    pull          PULL_MESSAGE and long polling
    queries       offsets by time, min/max offsets, earliest time, messages by id and key
    offsets       consumer offsets (query, update, commit in a pull)
    client_calls  heartbeats, unregistering, consumer lists, queue locks
    admin         topic configs, runtime info, topic and consume stats, group lists
    namesrv       a NameServer's answers for this broker (without NameServers)
    registration  registering with NameServers
"""

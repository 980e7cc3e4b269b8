"""The remoting server in the test's own process, over a store opened with the default
configuration (worker processes): its configuration keys, the per-request seam for metrics,
and a put that waits on a thread finishing before the server stops."""

from __future__ import annotations

import pytest

from mqstore import MessageStore, load_config
from mqstore.errors import ConfigError
from mqstore.remoting.server import RemotingServer

from remoting_support import Wire, send_ext


pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.mark.parametrize("server, store, complaint", [
    ({"remoting_broker_id": 1}, {}, "is a slave's id, but store.role is 'async_master'"),
    ({"remoting_broker_id": 0, "ha_master": "127.0.0.1:1"}, {"role": "slave"},
     "0 is the master's id"),
    ({"remoting_advertise": "example.org:10911"}, {}, "remoting_advertise 'example.org:10911'"),
    ({"remoting_advertise": "127.0.0.1:0"}, {}, "port 0 cannot be dialled"),
    ({"namesrv_addr": " ; "}, {}, "names no NameServer"),
    ({"namesrv_addr": "127.0.0.1:9876;127.0.0.1:0"}, {}, "entry '127.0.0.1:0'"),
    ({"remoting_listen": "nowhere"}, {}, "must be 'host:port'"),
    ({"remoting_max_frame_bytes": 1 << 25}, {}, "remoting_max_frame_bytes"),
    ({"remoting_max_connections": "5"}, {}, "remoting_max_connections"),
    ({"remoting_broker_name": "a b"}, {}, "remoting_broker_name"),
])
def test_bad_keys_are_refused_naming_them(server, store, complaint):
    with pytest.raises(ConfigError, match=complaint):
        load_config().replace(server=server, store=store)


def test_every_answer_is_observed_and_sync_puts_finish_before_the_stop(tmp_path):
    config = load_config().replace(
        server={"remoting_listen": "127.0.0.1:0"}, flush={"policy": "sync"},
        plugins={"load_entry_points": False}, commit_log={"segment_bytes": 1 << 20})
    seen = []
    with MessageStore.open(tmp_path / "root", config=config) as store:
        server = RemotingServer(store, config, observe=lambda *a: seen.append(a))
        address = server.start()
        try:
            with Wire(address) as wire:
                assert wire.call(10, send_ext("ObsT"), b"x").code == 0  # put on a thread
                assert wire.call(999, {}).code == 3
                assert wire.call(30, {"topic": "ObsT", "queueId": 0}).code == 0
                pending = wire.request(10, send_ext("ObsT"), b"last")
                server.stop()
                assert wire.response(pending).code == 0  # answered before the stop ended
        finally:
            server.stop()
        store.wait_dispatched(10)
        assert store.max_offset("ObsT", 0) == 2
    codes = [(code, answer) for code, answer, _s in seen]
    assert codes[:2] == [(10, 0), (30, 0)] and (10, 0) in codes[2:]
    assert all(s >= 0 for _c, _a, s in seen)


def test_the_remoting_server_takes_its_share_of_the_descriptors_beside_grpc(monkeypatch,
                                                                              caplog):
    """Under a 1,024-descriptor limit with 110 open, the store's files and the HTTP server
    reserving 448: 402 connections' room, shared with the gRPC endpoint by their maxima, by
    the one arithmetic both use."""
    from mqstore.config import descriptors
    from mqstore.endpoint.limits import connection_cap as grpc_cap
    monkeypatch.setattr(descriptors, "open_descriptors", lambda: 110)
    monkeypatch.setattr(descriptors.resource, "getrlimit", lambda which: (1024, 4096))
    config = load_config().replace(server={"remoting_listen": "127.0.0.1:0"})
    assert descriptors.reserved_descriptors(config) == 448
    assert RemotingServer(None, config)._accept_cap() == 402  # alone: all the room
    both = config.replace(server={"grpc_listen": "127.0.0.1:0"})
    remoting, grpc = RemotingServer(None, both)._accept_cap(), grpc_cap(1024, 448, 1024)
    assert (remoting, grpc) == (201, 201)
    assert caplog.messages[-2].startswith(
        "the remoting server accepts at most 201 connections, not "
        "server.remoting_max_connections (1024): the descriptor limit (RLIMIT_NOFILE 1024) "
        "leaves no more beside the 110 open, the 448 the store's files and the HTTP server may "
        "take and the share of the gRPC endpoint (1024 connections)")
    small = both.replace(server={"remoting_max_connections": 256})
    assert RemotingServer(None, small)._accept_cap() == 402 * 256 // (256 + 1024)
    roomy = config.replace(server={"remoting_max_connections": 300})
    caplog.clear()
    assert RemotingServer(None, roomy)._accept_cap() == 300  # it fits: what was configured
    assert caplog.messages == []

"""What one peer can make the remoting server hold, and the answer it gets past each bound
(NOTE [ Remoting connection bounds ]): frame size, connections, held pulls, idle peers, a peer
that never reads; and the shutdown (NOTE [ Remoting shutdown ])."""

from __future__ import annotations

import signal
import socket
import time

import pytest

from mqstore.format import remoting_frame as rf
from mqstore.format.record import parse_offset_msg_id
from mqstore.testing import wait_for

from remoting_support import Served, Wire, deployment_yaml, pull_ext, send_ext

pytestmark = pytest.mark.slow
MAX_FRAME = 65536
LIMITS = {"remoting_max_frame_bytes": MAX_FRAME, "remoting_max_connections": 4,
          "remoting_max_held_pulls": 1, "remoting_client_idle_ms": 1000}
SEGMENT = "commit_log: {segment_bytes: 8388608}\n"


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("bounded")
    server = Served(deployment_yaml(tmp / "deploy.yaml", tmp / "root", LIMITS, SEGMENT,
                                    small=False), tmp / "serve.log")
    yield server
    server.stop()


def max_offset(wire, topic, queue_id=0) -> int:
    return int(wire.call(30, {"topic": topic, "queueId": queue_id}).ext["offset"])


def test_an_oversized_frame_is_answered_and_read_past(bounded):
    with Wire(bounded.address) as wire:
        r = wire.call(10, send_ext("BigT"), b"x" * (MAX_FRAME + 10))
        assert r.code == 1
        assert f"exceeds the limit of {MAX_FRAME} bytes (server.remoting_max_frame_bytes)" \
            in r.remark
        assert wire.call(10, send_ext("BigT"), b"small").code == 0  # the connection goes on
        assert max_offset(wire, "BigT") <= 1  # nothing of the big one was stored


def test_connections_past_the_cap_are_told_and_closed(bounded):
    wires = [Wire(bounded.address) for _ in range(4)]
    try:
        for w in wires:
            assert w.call(30, {"topic": "CapT", "queueId": 0}).code == 0
        with Wire(bounded.address) as extra:
            r = extra.call(30, {"topic": "CapT", "queueId": 0})
            assert r.code == 2 and "server.remoting_max_connections" in r.remark
            with pytest.raises((EOFError, ConnectionError)):
                extra.read()
    finally:
        for w in wires:
            w.close()


def test_held_pulls_past_the_cap_get_system_busy(bounded):
    with Wire(bounded.address) as wire:
        assert wire.call(10, send_ext("HeldCapT"), b"x").code == 0
        wait_for(lambda: max_offset(wire, "HeldCapT") == 1, what="the message dispatched")
        first = wire.request(11, pull_ext("g", "HeldCapT", 0, 1, sysflag=6, suspend_ms=900))
        second = wire.call(11, pull_ext("g", "HeldCapT", 0, 1, sysflag=6, suspend_ms=900))
        assert second.code == 2 and "server.remoting_max_held_pulls" in second.remark
        assert wire.response(first).code == 19


def test_an_idle_peer_is_closed(bounded):
    with Wire(bounded.address) as wire:
        assert wire.call(30, {"topic": "IdleT", "queueId": 0}).code == 0
        start = time.monotonic()
        with pytest.raises((EOFError, ConnectionError)):
            wire.read()
        assert time.monotonic() - start >= 0.9
    assert "idle for" in bounded.log()


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


def test_a_peer_that_never_reads_is_not_read_then_closed(bounded):
    with Wire(bounded.address) as wire:
        r = wire.call(10, send_ext("SlowT"), b"y" * (MAX_FRAME - 1024))
        offset = parse_offset_msg_id(r.ext["msgId"])[1]
        wait_for(lambda: max_offset(wire, "SlowT") == 1, what="the message dispatched")
    # 20,000 requests of 80 bytes: small enough that a read chunk holds hundreds, their answers
    # 1.2 GiB; the server must stop taking them once its send buffer is full.
    requests = 20_000
    before = rss_bytes(bounded.proc.pid)
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", bounded.port))
        frame = rf.encode(rf.Command(33, opaque=1, ext={"offset": str(offset)}))
        s.settimeout(5)
        sent = 0
        try:  # in one write, so the server reads them in large chunks
            sent = s.send(frame * requests) // len(frame)
        except (socket.timeout, ConnectionError):
            pass  # the server stopped reading: our send buffer filled
        with Wire(bounded.address) as other:  # the server still answers others meanwhile
            assert other.call(30, {"topic": "SlowT", "queueId": 0}).code == 0
        grown = rss_bytes(bounded.proc.pid) - before
        wait_for(lambda: "has not read its answers" in bounded.log(), timeout=30,
                 what="the server giving up on the peer")
        s.settimeout(30)
        got = 0
        try:
            while True:
                chunk = s.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
        except ConnectionError:
            pass
    assert grown < 32 << 20, f"serve grew by {grown >> 20} MiB for a peer that never reads"
    assert got < sent * MAX_FRAME // 4  # most answers were never made


def test_sigterm_answers_held_pulls_then_closes_the_store(tmp_path):
    server = Served(deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "root"),
                    tmp_path / "serve.log")
    try:
        with Wire(server.address) as wire:
            assert wire.call(10, send_ext("StopT"), b"x").code == 0
            wait_for(lambda: max_offset(wire, "StopT") == 1, what="the message dispatched")
            held = wire.request(11, pull_ext("g", "StopT", 0, 1, sysflag=6,
                                             suspend_ms=30_000))
            # Answered before the pull: the pull was taken and is held.
            assert wire.call(30, {"topic": "StopT", "queueId": 0}).ext["offset"] == "1"
            assert not wire.unmatched
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            r = wire.response(held)
            assert r.code == 19 and time.monotonic() - start < 10
        assert server.proc.wait(60) == 0
        log = server.log()
        assert log.index("remoting server stopped") < log.index("store closed cleanly")
    finally:
        server.kill()


def test_grpc_and_remoting_serve_one_store(tmp_path):
    from endpoint_support import Clients, client_module
    rocketmq = client_module(tmp_path / "home")
    settings = {"grpc_listen": "127.0.0.1:0", "grpc_min_invisible_ms": 1000}
    server = Served(deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "root", settings),
                    tmp_path / "serve.log", home=tmp_path / "home")
    clients = None
    try:
        grpc_address = server.wait_for(r"MessagingService\) on ([\d.]+:\d+)")
        with Wire(server.address) as wire:
            for i in range(3):
                r = wire.call(10, send_ext("BothT", i % 2, "TAGS\x01t\x02KEYS\x01k%d\x02" % i),
                              b"both %d" % i)
                assert r.code == 0
        clients = Clients(rocketmq, grpc_address)
        consumer = clients.consumer("both-g", {"BothT": rocketmq.FilterExpression("t")})
        got = clients.receive_all(consumer, 3)
        assert sorted(m.body for m in got) == [b"both 0", b"both 1", b"both 2"]
        assert sorted(k for m in got for k in m.keys) == ["k0", "k1", "k2"]
    finally:
        if clients is not None:
            clients.close()
        assert server.stop() == 0
    assert "store closed cleanly" in server.log()

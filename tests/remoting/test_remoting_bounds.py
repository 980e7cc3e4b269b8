"""What one peer can make the remoting server hold, and the answer it gets past each bound
(NOTE [ Remoting connection bounds ]): frame size, connections, held pulls, idle peers, a peer
that never reads; and the shutdown (NOTE [ Remoting shutdown ])."""

from __future__ import annotations

import re
import resource
import signal
import socket
import time

import pytest

from mqstore.format import remoting_frame as rf
from mqstore.format.record import parse_offset_msg_id
from mqstore.testing import wait_for

from bounds_support import (HEALTH_URL, closed, descriptors, health,
                            out_of_descriptors_refusals)
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


def taken(address: str) -> Wire:
    """A connection the server answers: tried again while the connections of a test before
    are not counted out yet (the server reads their end in its own time)."""
    def attempt() -> Wire | None:
        wire = Wire(address)
        try:
            if wire.call(30, {"topic": "CapT", "queueId": 0}).code == 0:
                return wire
        except (EOFError, ConnectionError):
            pass
        wire.close()
        return None
    return wait_for(attempt, what="a connection the server took")


def test_connections_past_the_cap_are_closed_at_once(bounded):
    wires = []
    try:
        for _ in range(4):
            wires.append(taken(bounded.address))
        with Wire(bounded.address) as extra:  # closed before it says anything
            with pytest.raises((EOFError, ConnectionError)):
                extra.read()
        wait_for(lambda: "closed new remoting connections at once: 4 connections are open, "
                 "the most this server takes (server.remoting_max_connections" in bounded.log(),
                 what="the closing logged")
        assert wires[3].call(30, {"topic": "CapT", "queueId": 0}).code == 0
        wires.pop().close()
        wires.append(taken(bounded.address))  # once one left, a new one is served
    finally:
        for w in wires:
            counted_out(w)


def counted_out(wire: Wire) -> None:
    """Close ``wire`` from the server's side (it closes on bytes that are no frame), so the
    server has counted it out once it is closed and the tests after find room."""
    try:
        wire.sock.sendall(b"\0\0\0\0")  # a frame length below 4
        while wire.sock.recv(4096):
            pass
    except OSError:
        pass
    wire.close()


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
        start = time.monotonic()  # the idle clock runs from the request's arrival
        assert wire.call(30, {"topic": "IdleT", "queueId": 0}).code == 0
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


# -- descriptors --------------------------------------------------------------------------

NOFILE = 1024  # a common default soft limit: the one strangers exhausted
LOG_BOUND = 64 << 10  # serve's whole log, its start and the crowd's lines included


def test_connections_past_the_descriptor_limit_are_refused_not_served_into_exhaustion(
        tmp_path):
    """1,200 TCP connections that never send a byte to the remoting port, under a
    1,024-descriptor limit and the default remoting_max_connections (1024). Before: they were
    held until their first request, serve's descriptors ran out, /healthz was reset and asyncio
    logged a traceback per failed accept (tens of MB in seconds). Now the remoting server
    accepts only what fits beside the store's own descriptors and closes the rest at once;
    serve stays under its limit, /healthz and a client already connected are answered, the log
    stays small, and the descriptors come back once the strangers leave."""
    own = resource.getrlimit(resource.RLIMIT_NOFILE)
    if own[1] != resource.RLIM_INFINITY and own[1] < 1400:
        pytest.skip(f"this process may open {own[1]} descriptors, too few to play 1,200 peers")
    server = Served(deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "root"),
                    tmp_path / "serve.log", nofile=NOFILE)
    want = 4096 if own[1] == resource.RLIM_INFINITY else min(own[1], 4096)
    if own[0] != resource.RLIM_INFINITY and own[0] < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, own[1]))
    client, strangers = Wire(server.address), []
    pid = server.proc.pid
    try:
        assert client.call(10, send_ext("CrowdT"), b"before").code == 0
        said = re.search(r"the remoting server accepts at most (\d+) connections, not "
                         r"server.remoting_max_connections \(1024\): the descriptor limit "
                         r"\(RLIMIT_NOFILE 1024\) leaves no more", server.log())
        assert said and 0 < int(said[1]) < NOFILE // 2, server.log()
        cap, start = int(said[1]), descriptors(pid)
        for _ in range(1200):
            strangers.append(socket.create_connection(("127.0.0.1", server.port), timeout=30))
        # Accepted and held, or accepted and closed: either way serve has seen them all.
        wait_for(lambda: descriptors(pid) >= 1000 or all(
            closed(s) for s in strangers[-100:]), timeout=60, what="the crowd taken in")
        assert descriptors(pid) <= NOFILE - 64, "the store's headroom was taken"
        assert health(server.wait_for(HEALTH_URL)) == 200
        r = client.call(10, send_ext("CrowdT"), b"during")
        assert r.code == 0 and client.call(30, {"topic": "CrowdT", "queueId": 0}).code == 0
        # The client's connection and cap - 1 strangers are held; the rest were closed.
        assert sum(closed(s) for s in strangers) == len(strangers) - (cap - 1)
        for s in strangers:
            s.close()
        strangers.clear()
        wait_for(lambda: descriptors(pid) <= start + 2, timeout=60,
                 what="serve's descriptors back once the strangers left")
        with Wire(server.address) as late:
            assert late.call(10, send_ext("CrowdT"), b"after").code == 0
        log = server.log()
        assert len(log.encode()) < LOG_BOUND, f"{len(log.encode())} bytes of log"
        assert "Traceback" not in log and "out of system resource" not in log
        closing = [line for line in log.splitlines() if "connections are open" in line]
        assert 1 <= len(closing) <= 2, closing  # once a minute, with the count, not each
    finally:
        for s in strangers:
            s.close()
        client.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, own)
        assert server.stop() == 0, server.log()[-3000:]


def test_accept_failing_for_want_of_descriptors_refuses_at_once(tmp_path):
    """Every descriptor taken (EMFILE at accept): the remoting listener takes a pending
    connection off the queue on its reserve descriptor and closes it, logging one line a
    minute, without a traceback or a busy loop; it serves again once descriptors are free."""
    def served_again(port: int) -> None:
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            assert s.recv(16) == b"ok\n"
    err = out_of_descriptors_refusals("remoting", served_again)
    refusals = [line for line in err.splitlines() if "out of file descriptors" in line]
    assert len(refusals) == 1 and "Traceback" not in err, err

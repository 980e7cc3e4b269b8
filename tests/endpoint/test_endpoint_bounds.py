"""What a stranger reaching ``mqstore serve``'s gRPC port cannot do: exhaust its descriptors
with names or with connections that never speak, pin its memory with streams it never reads,
fill its log, stall its event loop with filters, slip names, tags and keys past the proxy's
rules, replay an old signature, or
call an admin service left open on a public address. Each test runs ``serve`` as a process
(default worker processes) on 127.0.0.1 and talks to it with raw gRPC (``raw_grpc``) where the
official client refuses to misbehave, with the official client where it does not."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import threading
import time

import grpc
import pytest

from bounds_support import HEALTH_URL, closed, descriptors, health
from cli_support import env
from endpoint_support import Clients, Served, deployment_yaml
from mqstore.endpoint.auth import now_date_time, signed_metadata
from mqstore.endpoint.protocol import Code
from mqstore.testing import wait_for
from raw_grpc import Raw

pytestmark = pytest.mark.usefixtures("no_plugin_env")


def workers_descriptors(pid: int) -> dict[int, int]:
    """Descriptors of each of ``pid``'s worker processes (its children)."""
    import psutil
    out = {}
    for child in psutil.Process(pid).children():
        try:
            out[child.pid] = descriptors(child.pid)
        except FileNotFoundError:  # gone since the listing
            pass
    return out


def rss_anon_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no RssAnon in /proc/PID/status")


def stop(served: Served) -> None:
    assert served.stop() == 0, served.log()


# -- descriptors --------------------------------------------------------------------------

NOFILE = 1024  # a common default soft limit: the one a stranger exhausted
MAPPED, POP_STATES = 32, 16


@pytest.mark.slow
def test_descriptors_stay_bounded_whatever_names_arrive(tmp_path, home, rocketmq):
    """10,000 group names and 10,000 new topics, under a 1,024-descriptor limit: the serve
    process holds a fixed number of descriptors throughout (before: two per group name and
    two per topic, for good, until receives answered "Too many open files" after 453 names),
    and answers normally afterwards."""
    names = 10_000
    yaml = deployment_yaml(
        tmp_path / "deploy.yaml", tmp_path / "store",
        server={"grpc_peer_max_new_topics": names + 3, "grpc_peer_max_new_groups": names + 4},
        # Segments and index files of a real store's order, so what grows with the number of
        # messages (their files) stays a handful: the names are what is measured.
        extra=f"commit_log: {{segment_bytes: 67108864}}\n"
              f"index: {{max_hash_slots: 65536, max_index_entries: 262144}}\n"
              f"consume_queue: {{file_units: 100, max_mapped_files: {MAPPED}}}\n"
              f"consumer: {{max_open_pop_states: {POP_STATES}}}\n")
    served = Served(yaml, tmp_path / "serve.log", home, nofile=NOFILE)
    raw = [Raw(served.endpoint) for _ in range(4)]
    try:
        assert raw[0].send("Named").code == Code.OK
        start = descriptors(served.proc.pid)
        bound = start + 2 * MAPPED + 2 * POP_STATES + 16  # + a few connections and files
        most = [start]
        # The workers (dispatch writes every new topic's queue files) have budgets too.
        workers_start = workers_descriptors(served.proc.pid)
        assert len(workers_start) == 2, workers_start
        workers_bound = max(workers_start.values()) + 2 * MAPPED + 2 * POP_STATES + 16
        workers_most = [max(workers_start.values())]

        def sample() -> None:
            most[0] = max(most[0], descriptors(served.proc.pid))
            workers_most[0] = max([workers_most[0], *workers_descriptors(served.proc.pid).values()])

        def spread(call, count):
            """``call(i)`` for every i < count, over the four connections at once."""
            errors = []

            def run(k):
                try:
                    for i in range(k, count, len(raw)):
                        code = call(raw[k], i)
                        if code not in (Code.OK, Code.MESSAGE_NOT_FOUND):
                            errors.append((i, code))
                            return
                        if i % 500 == 0:
                            sample()
                except Exception as exc:  # noqa: BLE001 - the test reports it
                    errors.append(exc)
            threads = [threading.Thread(target=run, args=(k,)) for k in range(len(raw))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert errors == [], served.log()[-3000:]

        spread(lambda r, i: r.receive(f"g{i}", "Named", batch=1)[0].status.code, names)
        spread(lambda r, i: r.send(f"t{i}").code, names)
        sample()
        print(f"\nserve's descriptors: {start} at start, at most {most[0]} over {names} group "
              f"names and {names} new topics (bound {bound}, limit {NOFILE}); its workers': "
              f"{sorted(workers_start.values())} at start, at most {workers_most[0]} "
              f"(bound {workers_bound})")
        assert most[0] <= bound
        # Each new topic's queue costs dispatch a file and three directories forced to disk,
        # in its flush pass once a second: after the flood it takes about a minute to catch
        # up, and a message sent now is received once it has.
        answers_normally(served, rocketmq, "After", catch_up_s=600)
        sample()
        assert most[0] <= bound
        assert workers_most[0] <= workers_bound
        assert "Too many open files" not in served.log()
    finally:
        for r in raw:
            r.close()
        stop(served)
    assert len(os.listdir(tmp_path / "store" / "consumequeue")) == names + 2
    # Restarted under the same limit, the store of ten thousand topics opens (its queues
    # mapped a budget's worth at a time), trusts the marker its close left, and answers.
    served = Served(yaml, tmp_path / "serve2.log", home, nofile=NOFILE)
    try:
        assert "clean-shutdown marker mqstore.clean trusted" in served.log()
        print(f"serve's descriptors after a restart on the {names + 2} topics: "
              f"{descriptors(served.proc.pid)}")
        assert descriptors(served.proc.pid) <= bound
        answers_normally(served, rocketmq, "Again")
    finally:
        stop(served)


def answers_normally(served: Served, rocketmq, topic: str, catch_up_s: float = 30) -> None:
    """A send and a receive through the official client, and /healthz."""
    clients = Clients(rocketmq, served.endpoint)
    try:
        producer = clients.producer(topic)
        sent = producer.send(clients.message(topic, b"still here")).message_id
        consumer = clients.consumer(topic.lower(), {topic: rocketmq.FilterExpression()})
        got = clients.receive_all(consumer, 1, timeout_s=catch_up_s)
        assert [m.message_id for m in got] == [sent]
    finally:
        clients.close()
    assert health(served._wait_for(HEALTH_URL)) == 200


@pytest.mark.slow
def test_connections_past_the_descriptor_limit_are_refused_not_served_into_exhaustion(
        tmp_path, home):
    """1,200 TCP connections that never speak, under a 1,024-descriptor limit and the default
    grpc_max_connections (1024). Before: gRPC accepted until serve's descriptors ran out,
    /healthz was reset and no new client could connect until the strangers left. Now gRPC
    accepts only what fits beside the store's own descriptors, closing the rest at once;
    serve stays under its limit, /healthz and a client already connected are answered, and
    new clients get in once the strangers leave."""
    import resource
    own = resource.getrlimit(resource.RLIMIT_NOFILE)
    if own[1] != resource.RLIM_INFINITY and own[1] < 1400:
        pytest.skip(f"this process may open {own[1]} descriptors, too few to play 1,200 peers")
    served = Served(deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store"),
                    tmp_path / "serve.log", home, nofile=NOFILE)
    want = 4096 if own[1] == resource.RLIM_INFINITY else min(own[1], 4096)
    if own[0] != resource.RLIM_INFINITY and own[0] < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, own[1]))
    client, strangers = Raw(served.endpoint), []
    host, port = served.endpoint.rsplit(":", 1)
    try:
        assert client.send("Crowded").code == Code.OK
        said = re.search(r"the gRPC endpoint accepts at most (\d+) connections, not "
                         r"server.grpc_max_connections \(1024\): the descriptor limit "
                         r"\(RLIMIT_NOFILE 1024\) leaves no more", served.log())
        assert said and 0 < int(said[1]) < NOFILE // 2, served.log()
        for _ in range(1200):
            strangers.append(socket.create_connection((host, int(port)), timeout=30))
        # Accepted and held, or accepted and closed: either way serve has seen them all.
        wait_for(lambda: descriptors(served.proc.pid) >= 1000 or all(
            closed(s) for s in strangers[-100:]), timeout=60, what="the crowd taken in")
        assert descriptors(served.proc.pid) <= NOFILE - 64, "the store's headroom was taken"
        assert health(served._wait_for(HEALTH_URL)) == 200
        assert client.send("Crowded").code == Code.OK
        for s in strangers:
            s.close()
        strangers.clear()
        late = Raw(served.endpoint)
        try:
            wait_for(lambda: late.send("Crowded").code == Code.OK, timeout=60,
                     what="a new client served once the strangers left")
        finally:
            late.close()
        assert "Too many open files" not in served.log()
        assert "File descriptor limit reached" not in served.log()
    finally:
        for s in strangers:
            s.close()
        client.close()
        resource.setrlimit(resource.RLIMIT_NOFILE, own)
        stop(served)


def test_a_host_creates_at_most_its_allowance_of_topics_and_groups(tmp_path, home):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store",
                           server={"grpc_peer_max_new_topics": 3,
                                   "grpc_peer_max_new_groups": 2})
    served = Served(yaml, tmp_path / "serve.log", home)
    first, second = Raw(served.endpoint), Raw(served.endpoint)
    try:
        assert [first.send(f"New{i}").code for i in range(3)] == [Code.OK] * 3
        # Another connection of the same host shares its allowance.
        refused = second.send("New3")
        assert refused.code == Code.TOPIC_NOT_FOUND
        assert refused.message == (
            "topic 'New3' does not exist, and client host 127.0.0.1 has created 3 topics, the "
            "most server.grpc_peer_max_new_topics lets one host create; create it with "
            "`mqstore topic create`")
        assert second.send("New0").code == Code.OK  # it exists: sends to it go on
        for group in ("a", "b"):
            assert first.receive(group, "New0", poll_s=10)[0].status.code == Code.OK
        refused = second.receive("c", "New0")[0].status
        assert refused.code == Code.CONSUMER_GROUP_NOT_FOUND
        assert refused.message == (
            "group 'c' has never received from topic 'New0', and client host 127.0.0.1 has "
            "started 2 groups, the most server.grpc_peer_max_new_groups lets one host start")
        assert second.receive("a", "New1")[0].status.code == Code.CONSUMER_GROUP_NOT_FOUND
        got = second.receive("a", "New0")  # a group that popped before goes on
        assert got[0].status.code in (Code.OK, Code.MESSAGE_NOT_FOUND)
        assert not os.path.exists(tmp_path / "store" / "consumequeue" / "New3")
    finally:
        first.close()
        second.close()
        stop(served)


# -- memory -------------------------------------------------------------------------------

MIB = 1 << 20
SERVER_BOUND, CONNECTION_BOUND = 64 * MIB, 16 * MIB


@pytest.mark.slow
def test_receives_nobody_reads_hold_no_more_than_the_bound(tmp_path, home, rocketmq):
    """Twenty receives of 32 x 1 MiB whose client never reads (before: 1.23 GB more RSS, for
    as long as the streams stayed open). Serve pops no more than the bound, closes the stalled
    connections after grpc_write_stall_ms, and every message comes back: none acknowledged,
    none lost."""
    yaml = deployment_yaml(
        tmp_path / "deploy.yaml", tmp_path / "store",
        server={"grpc_max_unwritten_bytes": SERVER_BOUND,
                "grpc_max_unwritten_bytes_per_connection": CONNECTION_BOUND,
                "grpc_write_stall_ms": 5000},
        extra="commit_log: {segment_bytes: 134217728}\n")
    served = Served(yaml, tmp_path / "serve.log", home)
    strangers = [Raw(served.endpoint) for _ in range(20)]
    try:
        bodies = {b"%03d" % i + os.urandom(MIB - 3) for i in range(96)}
        for body in bodies:
            assert strangers[0].send("Big", body).code == Code.OK
        for s in strangers:  # every connection up before the baseline
            assert s.heartbeat().code == Code.OK
        time.sleep(1)  # dispatch's first reads of the new segment settle
        before = rss_anon_mib(served.proc.pid)
        peak = [before]
        sampling = threading.Event()

        def sample():
            while not sampling.is_set():
                peak[0] = max(peak[0], rss_anon_mib(served.proc.pid))
                time.sleep(0.05)
        sampler = threading.Thread(target=sample)
        sampler.start()
        try:
            # Receives are served in turn: four take 15 messages each (their connection's 16
            # MiB), which fills the endpoint's 64 MiB; each of the others gets what is left
            # (a message, which the stranger's connection takes in), or a refusal.
            calls = [s.open_receive("g", "Big", batch=32, invisible_s=2) for s in strangers]
            wait_for(lambda: sum(c.done() for c in calls) >= SERVER_BOUND // CONNECTION_BOUND,
                     timeout=60, what="the stalled streams' connections were closed")
        finally:
            sampling.set()
            sampler.join()
        growth = peak[0] - before
        allowance = (SERVER_BOUND + 20 * MIB) / MIB + 4  # + one message a connection
        print(f"\nserve's RssAnon: {before:.0f} MiB, at most {peak[0]:.0f} MiB under 20 "
              f"unread receives of 32 x 1 MiB (bound {SERVER_BOUND // MIB} MiB)")
        assert growth <= allowance, served.log()[-3000:]
        ends = []
        for call in calls:  # read now: closed under the stalled ones, a refusal for the rest
            try:
                ends.append([r.status.code for r in call])
            except grpc.RpcError as exc:
                ends.append(exc.code())
        assert ends.count(grpc.StatusCode.UNAVAILABLE) == SERVER_BOUND // CONNECTION_BOUND
        for end in ends:  # the rest: a refusal, or the little there was room for
            assert end == grpc.StatusCode.UNAVAILABLE or end == [Code.TOO_MANY_REQUESTS] or (
                end[0] == Code.OK and set(end[1:]) == {0}), ends
        clients = Clients(rocketmq, served.endpoint)
        try:
            consumer = clients.consumer("g", {"Big": rocketmq.FilterExpression()})
            got: list = []
            deadline = time.monotonic() + 120
            while len(got) < len(bodies) and time.monotonic() < deadline:
                batch = consumer.receive(4, 60)  # 4 MiB a call: well within its deadline
                for m in batch:
                    consumer.ack(m)
                got += batch
            assert sorted(m.body for m in got) == sorted(bodies)  # each once: none acked
        finally:
            clients.close()
    finally:
        for s in strangers:
            s.close()
        stop(served)


# -- the admin service and signatures -----------------------------------------------------

def test_serve_refuses_an_open_admin_service_on_a_public_address(tmp_path, home):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store",
                           server={"grpc_listen": "0.0.0.0:0"})
    proc = subprocess.run([sys.executable, "-m", "mqstore.cli", "serve", "-c", str(yaml)],
                          capture_output=True, text=True, timeout=120,
                          env={**env(), "HOME": str(home)})
    assert proc.returncode == 2, proc.stderr
    error = [line for line in proc.stderr.splitlines() if line.startswith("Error:")]
    assert error == [
        "Error: server.grpc_listen '0.0.0.0:0' listens beyond loopback, and the admin service "
        "(mqstore.admin.v1.Admin: `mqstore topic|group --server`, which creates and updates "
        "topics, resets offsets and deletes groups) would answer anyone who reaches it: set "
        "server.grpc_admin_keys (['ADMIN_KEY:SECRET_KEY'], then `mqstore topic ... --server "
        "HOST:PORT --admin-access-key ADMIN_KEY` with MQSTORE_ADMIN_SECRET_KEY), or turn the "
        "admin service off with server.grpc_admin_enabled: false"]


def test_an_admin_service_turned_off_is_not_served(tmp_path, home):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store",
                           server={"grpc_listen": "0.0.0.0:0", "grpc_admin_enabled": False})
    served = Served(yaml, tmp_path / "serve.log", home)
    try:
        port = served.endpoint.rpartition(":")[2]
        raw = Raw(f"127.0.0.1:{port}")
        try:
            assert raw.send("Open").code == Code.OK
            with pytest.raises(grpc.RpcError) as off:
                raw.channel.unary_unary("/mqstore.admin.v1.Admin/CreateTopic")(
                    b'{"name": "Sneaky"}', timeout=30)
            assert off.value.code() is grpc.StatusCode.UNIMPLEMENTED
        finally:
            raw.close()
        assert "admin service off" in served.log()
    finally:
        stop(served)


def test_a_signature_is_good_only_near_the_servers_clock(tmp_path, home, rocketmq):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store",
                           server={"grpc_access_keys": ["app:s3cret"]})
    served = Served(yaml, tmp_path / "serve.log", home)
    try:
        stale = Raw(served.endpoint, signed_metadata("app", "s3cret", "20200101T000000Z"))
        fresh = Raw(served.endpoint, signed_metadata("app", "s3cret", now_date_time()))
        try:
            refused = stale.send("Signed")
            assert refused.code == Code.UNAUTHORIZED
            assert refused.message.startswith("x-mq-date-time 20200101T000000Z is ")
            assert "server.grpc_signature_skew_ms" in refused.message
            assert stale.heartbeat().code == Code.UNAUTHORIZED
            assert fresh.send("Signed").code == Code.OK
        finally:
            stale.close()
            fresh.close()
        clients = Clients(rocketmq, served.endpoint)  # signs with its clock (UTC here)
        try:
            producer = clients.producer("Signed", ak="app", sk="s3cret")
            assert producer.send(clients.message("Signed", b"now")).message_id
        finally:
            clients.close()
    finally:
        stop(served)


# -- names, tags, keys, filters, the log --------------------------------------------------

@pytest.fixture(scope="module")
def plain(tmp_path_factory, home):
    base = tmp_path_factory.mktemp("plain")
    served = Served(deployment_yaml(base / "deploy.yaml", base / "store"), base / "serve.log",
                    home)
    yield served
    stop(served)


@pytest.mark.parametrize("field, value, code, says", [
    ("tag", "paid|shipped", Code.ILLEGAL_MESSAGE_TAG, "contains '|'"),
    ("tag", " \t", Code.ILLEGAL_MESSAGE_TAG, "is blank"),
    ("tag", "paid\x7f", Code.ILLEGAL_MESSAGE_TAG, "contains a control character"),
    ("keys", ["order-1", "  "], Code.ILLEGAL_MESSAGE_KEY, "is blank"),
    ("keys", ["order\x00"], Code.ILLEGAL_MESSAGE_KEY, "contains a control character"),
    ("message_group", "g" * 64, Code.ILLEGAL_MESSAGE_GROUP, "it must be under 64"),
    ("message_group", "\x1b[31m", Code.ILLEGAL_MESSAGE_GROUP, "contains a control character"),
    ("user_properties", {"region": "eu\n"}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
     "contains a control character"),
    ("user_properties", {"re\u0085gion": "eu"}, Code.ILLEGAL_MESSAGE_PROPERTY_KEY,
     "contains a control character"),
])
def test_the_proxys_message_rules_refuse_with_its_codes(plain, field, value, code, says):
    raw = Raw(plain.endpoint)
    try:
        status = raw.send("Ruled", **{field: value})
        assert (status.code, says in status.message) == (code, True), status.message
        assert raw.send("Ruled", tag="paid", keys=["order-1"], message_group="g" * 63,
                        user_properties={"region": "eu"}).code == Code.OK
    finally:
        raw.close()


def test_every_name_is_checked_before_it_is_used(plain):
    long_topic, long_group = "T" * 256, "G" * 256
    raw = Raw(plain.endpoint)
    try:
        status = raw.send(long_topic)
        assert status.code == Code.ILLEGAL_TOPIC
        assert status.message == (f"topic {long_topic[:32]!r}... is 256 bytes; the limit is "
                                  f"127 (255 for %RETRY% topics)")
        assert raw.send("T" * 128).code == Code.ILLEGAL_TOPIC  # the proxy's 127
        assert raw.send("T" * 127).code == Code.OK
        status = raw.receive("g", long_topic)[0].status
        assert status.code == Code.ILLEGAL_TOPIC
        assert status.message == (f"topic {long_topic[:32]!r}... (256 characters) must match "
                                  f"^[%|a-zA-Z0-9_.-]+$, at most 255 characters, not only dots")
        status = raw.receive(long_group, "T" * 127)[0].status
        assert status.code == Code.ILLEGAL_CONSUMER_GROUP
        assert status.message.startswith(f"group {long_group[:32]!r}... (256 characters) ")
        from mqstore.endpoint.protocol import service_pb2
        from raw_grpc import Resource
        route = raw.stub.QueryRoute(service_pb2.QueryRouteRequest(
            topic=Resource(name=long_topic)), timeout=30)
        assert route.status.code == Code.ILLEGAL_TOPIC
        ack = raw.stub.AckMessage(service_pb2.AckMessageRequest(
            group=Resource(name=long_group), topic=Resource(name="T"),
            entries=[service_pb2.AckMessageEntry(receipt_handle="x")]), timeout=30)
        assert ack.status.code == Code.ILLEGAL_CONSUMER_GROUP
    finally:
        raw.close()
    assert "Traceback" not in plain.log() and "ValueError" not in plain.log()


def test_filters_are_bounded_in_size_and_depth(plain):
    raw = Raw(plain.endpoint)
    try:
        assert raw.send("Filtered", user_properties={"a": "1"}).code == Code.OK
        huge = "(" * (2 << 20) + "a = 1" + ")" * (2 << 20)  # 4 MB, deeply nested
        status = raw.receive("f", "Filtered", expression=huge, sql=True)[0].status
        assert status.code == Code.ILLEGAL_FILTER_EXPRESSION
        assert "is longer than 16384 characters, the longest this endpoint compiles" in (
            status.message)
        assert len(status.message) < 300  # the expression is not echoed back whole
        deep = "(" * 1025 + "a = 1" + ")" * 1025
        status = raw.receive("f", "Filtered", expression=deep, sql=True)[0].status
        assert status.code == Code.ILLEGAL_FILTER_EXPRESSION
        assert "parentheses nest deeper than the parenthesis depth limit of 1024" in (
            status.message)
        got = raw.receive("f", "Filtered", expression="(" * 100 + "a = 1" + ")" * 100, sql=True,
                          poll_s=10)
        assert got[0].status.code == Code.OK and len(got) == 3
    finally:
        raw.close()


def test_what_strangers_make_the_server_log_is_rate_limited(plain):
    raw = Raw(plain.endpoint)
    try:
        send = raw.channel.unary_unary("/apache.rocketmq.v2.MessagingService/SendMessage")
        for _ in range(30):
            with pytest.raises(grpc.RpcError):
                send(b"\xff\xff\xff", timeout=30)
        for _ in range(20):
            assert raw.send("Cancelled", os.urandom(16 << 10)).code == Code.OK
        for i in range(5):  # receives cancelled while their messages are written
            call = raw.open_receive(f"c{i}", "Cancelled", batch=20)
            call.cancel()
        assert raw.heartbeat().code == Code.OK
    finally:
        raw.close()
    log = plain.log()
    lines = [line for line in log.splitlines() if "DecodeError" in line]
    assert len(lines) == 1, log[-3000:]
    assert "Traceback" not in log

"""Failover with real processes on 127.0.0.1: two ``mqstore serve`` nodes (a master and a slave
with a gRPC endpoint each, mqstore's handshake, ``server.ha_peers``), the official RocketMQ 5
Python client configured with both endpoints, SIGKILLs, ``mqstore role`` on the command line.

docs/replication.md ("Failover") is the runbook these tests follow."""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import time

import grpc
import pytest

import yaml

from mqstore import MessageStore, load_config
from mqstore.config import coordination_listen_problem
from mqstore.endpoint.limits import check_exposure
from mqstore.storage.role_file import read_role

from cli_support import mqstore
from failover_support import (
    Clients, Node, child_serve_argv, commit_log_bytes, free_ports, wait_until,
)
from gate_proxy import GateProxy
from paths import DOCS

WAIT_S = 60.0


def pair(tmp_path, home, nodes, master_role: str, *, master_first: bool = True,
         segment_bytes: int | None = None) -> tuple[Node, Node]:
    """A master and its slave, both serving (the slave connected and told the master's
    endpoint); ``master_first``: whether the master's endpoint sorts first."""
    g1, g2 = free_ports(2)
    h1, h2 = free_ports(2)
    gm, gs = (g1, g2) if master_first else (g2, g1)
    m = Node(tmp_path, "m", master_role, gm, h1, h2, home, segment_bytes=segment_bytes)
    s = Node(tmp_path, "s", "slave", gs, h2, h1, home, segment_bytes=segment_bytes)
    nodes += [m, s]
    m.start()
    s.start()
    wait_until(lambda: s.role("status")["master_endpoint"] == m.endpoint, WAIT_S,
               "the slave connected and told the master's endpoint")
    return m, s


def configuration(rocketmq, *endpoints: str):
    return rocketmq.ClientConfiguration(";".join(endpoints), rocketmq.Credentials(),
                                        request_timeout=3)


def send(producer, rocketmq, body: bytes, topic: str = "orders"):
    msg = rocketmq.Message()
    msg.topic, msg.body = topic, body
    return producer.send(msg)


def receive_all(consumer, count: int) -> list[bytes]:
    got: list[bytes] = []
    deadline = time.monotonic() + WAIT_S
    while len(got) < count and time.monotonic() < deadline:
        for m in consumer.receive(16, 10):
            got.append(m.body)
            consumer.ack(m)
    return got


def log_end(node: Node) -> int:
    """The node's commit log end, from its ``/metrics``."""
    (end,) = re.findall(r"^mqstore_commit_log_max_offset_bytes (\S+)$", node.metrics(), re.M)
    return int(float(end))


def wait_disconnected(slave: Node) -> None:
    wait_until(lambda: not slave.role("status")["replication"]["connected"], WAIT_S,
               "the slave noticed its master gone")


@pytest.mark.parametrize("master_first", [True, False], ids=["master-sorts-first",
                                                            "slave-sorts-first"])
def test_a_client_listing_both_endpoints_reaches_the_promoted_slave(
        tmp_path, home, nodes, rocketmq, master_first):
    m, s = pair(tmp_path, home, nodes, "sync_master", master_first=master_first)
    config = configuration(rocketmq, m.endpoint, s.endpoint)  # the client sorts them itself
    producer = rocketmq.Producer(config, ("orders",))
    producer.startup()
    consumer = rocketmq.SimpleConsumer(config, "billing", {"orders": rocketmq.FilterExpression()},
                                       await_duration=2)
    consumer.startup()
    try:
        before = [b"before-%d" % i for i in range(20)]
        for body in before:
            send(producer, rocketmq, body)  # sync_master: PUT_OK once the slave has it
        assert sorted(receive_all(consumer, 20)) == sorted(before)
        # The client's channel is on the node whose address sorts first; a slave forwards.
        assert ("forwarding MessagingService calls" in s.log()) == (not master_first)

        killed = time.monotonic()
        m.kill()
        wait_disconnected(s)
        promoted = s.role("promote")
        assert (promoted["role"], promoted["epoch"], promoted["lacked"]) == (
            "async_master", 2, None)
        first_ok = None
        while time.monotonic() - killed < WAIT_S:
            try:
                receipt = send(producer, rocketmq, b"after")
            except Exception:  # noqa: BLE001 - refused until the client reaches it
                time.sleep(0.1)
                continue
            first_ok = time.monotonic() - killed
            break
        assert first_ok is not None, "no send succeeded on the promoted slave"
        print(f"first successful send {first_ok:.2f} s after the master's SIGKILL "
              f"(master sorts {'first' if master_first else 'second'})")
        assert receipt.offset >= 0
        # Receives reach it too. Its pop state is its own until the state mirror installs
        # the master's (design section 1): the group may get what it acked before again.
        got = wait_until(lambda: b"after" in receive_all(consumer, 1) or None, WAIT_S,
                         "the message sent after the failover received")
        assert got
    finally:
        producer.shutdown()
        consumer.shutdown()


@pytest.mark.slow
def test_under_async_master_only_the_in_flight_and_the_last_seconds_acks_come_back(
        tmp_path, home, nodes):
    """The measured outcome under async replication: an async_master answers an ack before
    a slave holds its state records, so besides what was in flight at the kill, what was
    acknowledged in the last moment may come back; nothing acknowledged a second or more
    before the kill does. The promotion is forced when the slave lacks the last puts."""
    m, s = pair(tmp_path, home, nodes, "async_master")
    mqstore("topic", "create", "orders", "-q", "8", "--server", m.endpoint)
    clients = Clients(tmp_path, home, f"{m.endpoint};{s.endpoint}", 2000)
    try:
        wait_until(lambda: len(clients.acked()) >= 150, WAIT_S, "acks under way")
        earlier, sent_earlier = clients.acked(), clients.sent()
        since = time.monotonic()
        wait_until(lambda: time.monotonic() - since >= 1.0
                   and len(clients.acked()) > len(earlier), WAIT_S, "a second more of acks")
        # "A second" is the replication's second: on a loaded machine the slave may lag more,
        # so the kill waits until the slave holds what the master held a second after.
        held = log_end(m)
        wait_until(lambda: log_end(s) >= held, WAIT_S,
                   "the slave holding what the master held a second after")
        m.kill()
        clients.at_kill()
        assert len(clients.sent()) < 2000  # mid-stream: sends and acks under way
        wait_disconnected(s)
        promoted = s.role("promote", "--force")
        assert (promoted["role"], promoted["epoch"]) == ("async_master", 2)
        assert "config/topics.json" in promoted["mirror"]["installed"]
        # The master answers before its slave hears of a put: sends answered in the last
        # moment may be lost even when the slave knows of nothing it lacks.
        clients.wait_all(lost_ok=True, kept=sent_earlier)
    finally:
        clients.close()
    out = clients.outcome()
    late = out["acked_before"] - earlier
    print(f"acked before the kill: {len(out['acked_before'])} ({len(late)} in its last "
          f"second or more), in flight: {len(out['in_flight'])}, redelivered: "
          f"{len(out['redelivered'])}")
    assert out["in_flight"] and out["redelivered"] <= out["in_flight"] | late
    assert not out["redelivered"] & earlier  # acknowledged a second before: never again
    assert not out["lost"] & sent_earlier  # answered a second before: on the slave


@pytest.mark.slow
def test_a_manual_promotion_mid_stream_redelivers_only_what_was_in_flight(tmp_path, home, nodes,
                                                                           rocketmq):
    """The measured outcome: "orders" of 8 queues, a producer and a SimpleConsumer group
    acking, each listing both endpoints; the master SIGKILLed, the slave promoted with `mqstore
    role promote`; the clients go on by themselves, and a producer started after the
    promotion sends to all 8 queues."""
    m, s = pair(tmp_path, home, nodes, "sync_master")
    mqstore("topic", "create", "orders", "-q", "8", "--server", m.endpoint)
    clients = Clients(tmp_path, home, f"{m.endpoint};{s.endpoint}", 400)
    try:
        wait_until(lambda: len(clients.acked()) >= 150, WAIT_S, "acks under way")
        m.kill()
        clients.at_kill()
        wait_disconnected(s)
        promoted = s.role("promote")
        assert (promoted["role"], promoted["epoch"], promoted["lacked"]) == (
            "async_master", 2, None)
        assert "config/topics.json" in promoted["mirror"]["installed"]
        clients.wait_all()
    finally:
        clients.close()
    out = clients.outcome()
    print(f"acked before the kill: {len(out['acked_before'])}, in flight: "
          f"{len(out['in_flight'])}, redelivered: {len(out['redelivered'])}")
    assert len(out["acked_before"]) >= 150 and out["in_flight"]
    assert not out["redelivered"] & out["acked_before"]  # nothing acknowledged comes back
    assert out["redelivered"] <= out["in_flight"]
    assert not out["lost"]  # every send answered OK was received
    # The clients' producer may have sent all it had before the kill: one started now takes
    # the promoted node's route.
    producer = rocketmq.Producer(configuration(rocketmq, m.endpoint, s.endpoint), ("orders",))
    producer.startup()
    try:
        for i in range(32):
            send(producer, rocketmq, b"after-%d" % i)
    finally:
        producer.shutdown()

    def queues():
        with MessageStore.open(s.root, load_config(str(s.yaml)), read_only=True) as store:
            assert store.queue_ids("orders") == list(range(8))
            return {q: len([m for m in store.read("orders", q, 0, 10_000)
                            if m.phys_offset >= promoted["start_offset"]]) for q in range(8)}
    wait_until(lambda: all(queues().values()), WAIT_S,
               "every queue took sends on the promoted node")
    assert sum(queues().values()) >= 32


def test_a_slave_behind_what_its_master_acknowledged_is_refused_and_force_says_what_it_lacks(
        tmp_path, home, nodes, rocketmq):
    # The slave reaches its master through a proxy: held while 32 MiB are acknowledged, then
    # trickling, so the slave's new handshake tells it the master's confirm offset while the
    # bytes up to it are minutes away.
    g1, g2 = free_ports(2)
    h1, h2 = free_ports(2)
    gate = GateProxy(f"127.0.0.1:{h1}")
    m = Node(tmp_path, "m", "async_master", g1, h1, h2, home, segment_bytes=8 << 20)
    s = Node(tmp_path, "s", "slave", g2, h2, h1, home, segment_bytes=8 << 20,
             server={"ha_master": gate.address})
    nodes += [m, s]
    m.start()
    s.start()
    producer = rocketmq.Producer(configuration(rocketmq, m.endpoint), ("orders",))
    producer.startup()
    try:
        for i in range(10):
            send(producer, rocketmq, b"small-%d" % i)
        wait_until(lambda: s.role("status")["max_offset"] == m.role("status")["max_offset"],
                   WAIT_S, "the slave caught up")
        gate.hold()
        for i in range(128):  # 32 MiB, acknowledged at once (async_master)
            send(producer, rocketmq, bytes([i]) * (256 << 10))
    finally:
        producer.shutdown()
    acknowledged = m.role("status")["replication"]["confirmed"]
    gate.trickle(64 << 10)
    gate.drop()
    wait_until(lambda: s.role("status")["master_confirmed"] >= acknowledged, WAIT_S,
               "the slave heard the master's confirm offset")
    m.kill()
    gate.close()
    wait_disconnected(s)
    end = s.role("status")["max_offset"]
    refused = s.role("promote", check=None)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    found = re.search(r"this slave's log ends at (\d+), but its master \S+ had answered PUT_OK "
                      r"up to (\d+) .* it lacks (\d+) bytes \[(\d+), (\d+)\)",
                      " ".join(refused.stderr.split()))
    assert found, refused.stderr
    at, confirmed, lacks = (int(found.group(i)) for i in (1, 2, 3))
    assert at == end and lacks == confirmed - end > 0 and found.group(4, 5) == (
        str(end), str(confirmed))
    assert s.role("status")["role"] == "slave"
    forced = s.role("promote", "--force")
    assert forced["lacked"] == {"from": end, "to": confirmed, "bytes": lacks}
    assert forced["forced"] is True and forced["role"] == "async_master"
    with MessageStore.open(m.root, load_config(str(m.yaml)), read_only=True) as dead:
        assert confirmed <= dead.max_phys_offset  # it had those bytes, acknowledged


def _lost_records(root, config, point: int) -> dict:
    """Per queue: the records of a killed master's log past ``point`` (read-only)."""
    out: dict = {}
    with MessageStore.open(root, config, read_only=True) as store:
        for topic in store.topics():
            for q in store.queue_ids(topic):
                for msg in store.read(topic, q, 0, 10_000):
                    if msg.phys_offset >= point:
                        e = out.setdefault(f"{topic}/{q}", {"records": 0,
                                                              "first_queue_offset": msg.queue_offset,
                                                              "last_queue_offset": msg.queue_offset})
                        e["records"] += 1
                        e["last_queue_offset"] = msg.queue_offset
    return out


def diverged(tmp_path, home, nodes, rocketmq, lost: int = 7, lost_bytes: int = 100):
    """A master that took ``lost`` puts its slave never got, killed; the slave promoted and
    given 5 puts of its own. Returns the nodes (the slave serving, the master down), the
    point where their logs part, the master's end, and what the master's log holds past the
    point, per queue."""
    m, s = pair(tmp_path, home, nodes, "async_master")
    producer = rocketmq.Producer(configuration(rocketmq, m.endpoint), ("orders",))
    producer.startup()
    consumer = rocketmq.SimpleConsumer(configuration(rocketmq, m.endpoint), "billing",
                                       {"orders": rocketmq.FilterExpression()}, await_duration=2)
    consumer.startup()
    try:
        for i in range(30):
            send(producer, rocketmq, b"shared-%d" % i)
        assert len(receive_all(consumer, 30)) == 30  # the master's own pop state
        caught_up = wait_until(lambda: (lambda a, b: a if a == b else None)(
            s.role("status")["max_offset"], m.role("status")["max_offset"]), WAIT_S,
            "the slave caught up")
        s.signal(signal.SIGSTOP)
        for i in range(lost):
            send(producer, rocketmq, b"lost-%d-" % i + b"x" * lost_bytes)
        m_end = m.role("status")["max_offset"]
    finally:
        producer.shutdown()
        consumer.shutdown()
    s.kill()  # stopped: what reached its socket is never appended
    m.kill()
    s.start()
    # Where the logs part: the slave's end (state records the master shipped between the look
    # above and the stop may have reached it; none of the lost puts did).
    point = s.role("status")["max_offset"]
    assert point >= caught_up
    expected = _lost_records(m.root, load_config(str(m.yaml)), point)
    assert sum(e["records"] for e in expected.values()) == lost
    promoted = s.role("promote")  # down master, nothing heard since the restart: allowed
    assert (promoted["start_offset"], promoted["epoch"]) == (point, 2)
    producer = rocketmq.Producer(configuration(rocketmq, s.endpoint), ("orders",))
    producer.startup()
    try:
        for i in range(5):
            send(producer, rocketmq, b"new-%d" % i)
    finally:
        producer.shutdown()
    return m, s, point, m_end, expected


def rejoined(m: Node, s: Node) -> None:
    def same():
        mine, theirs = m.role("status"), s.role("status")
        return (mine["role"] == "slave" and mine["replication"]["connected"]
                and mine["max_offset"] == theirs["max_offset"])
    wait_until(same, WAIT_S, "the old master following the new one, caught up")


def check_rejoin(m: Node, s: Node, point: int, m_end: int, expected: dict) -> None:
    report = json.loads((m.root / "quarantine" / f"rejoin-{point:020d}.json").read_text())
    assert (report["from"], report["to"], report["bytes"]) == (point, m_end, m_end - point)
    assert report["records"] == sum(e["records"] for e in expected.values())
    assert report["queues"] == expected
    assert report["master"] == s.ha and report["master_epoch"] == 2
    assert len((m.root / "quarantine" / report["file"]).read_bytes()) == m_end - point
    assert any(f.startswith("consumer/pop/") for f in report["set_aside"]["files"])
    assert commit_log_bytes(m.root) == commit_log_bytes(s.root)
    status = m.role("status")
    assert (status["role"], status["writable"], status["master"]) == ("slave", False, s.ha)
    assert status["epochs"] == s.role("status")["epochs"] == [[1, 0], [2, point]]
    record, problem = read_role(str(m.root))
    assert problem is None and record.cut is None and record.master == s.ha


def test_the_old_master_restarted_learns_it_was_replaced_and_rejoins_cutting_what_it_kept(
        tmp_path, home, nodes, rocketmq):
    m, s, point, m_end, expected = diverged(tmp_path, home, nodes, rocketmq)
    m.start()  # store.role: async_master; server.ha_peers names the new master
    rejoined(m, s)
    assert "holds epoch 2, newer than this master's 1" in m.log()
    check_rejoin(m, s, point, m_end, expected)
    # A send to the old master's endpoint goes on to the new master: it took none itself.
    producer = rocketmq.Producer(configuration(rocketmq, m.endpoint), ("orders",))
    producer.startup()
    try:
        before = s.role("status")["max_offset"]
        send(producer, rocketmq, b"through-the-old-master")
    finally:
        producer.shutdown()
    assert s.role("status")["max_offset"] > before
    rejoined(m, s)
    assert commit_log_bytes(m.root) == commit_log_bytes(s.root)


@pytest.fixture(scope="module")
def diverged_dirs(tmp_path_factory, home, rocketmq):
    """``diverged``'s directories, both nodes stopped (the slave cleanly), for the SIGKILL
    tests to copy."""
    base = tmp_path_factory.mktemp("diverged")
    started: list[Node] = []
    try:
        m, s, point, m_end, expected = diverged(base, home, started, rocketmq, lost_bytes=30_000)
        assert s.served.stop() == 0
    finally:
        for node in started:
            node.kill()
    return base, point, m_end, expected


@pytest.mark.parametrize("step", ["saved", "state", "segment", "done"])
def test_a_sigkill_during_the_cut_leaves_a_store_that_finishes_rejoining(
        tmp_path, home, nodes, diverged_dirs, step):
    base, point, m_end, expected = diverged_dirs
    g1, g2 = free_ports(2)
    h1, h2 = free_ports(2)
    m = Node(tmp_path, "m", "async_master", g1, h1, h2, home)
    s = Node(tmp_path, "s", "slave", g2, h2, h1, home)
    for node in (m, s):
        shutil.copytree(base / node.name, node.root)
    nodes += [m, s]
    s.start()  # promoted before (role.json): master in epoch 2
    m.start(argv=child_serve_argv(m.yaml, step))  # dies right after the cut's step
    assert m.served.proc.wait(WAIT_S) == -signal.SIGKILL, m.log()
    m.kill()  # its workers too
    record, _ = read_role(str(m.root))
    assert (record.cut is None) == (step == "done")
    m.start()
    rejoined(m, s)
    check_rejoin(m, s, point, m_end, expected)


def test_a_slave_that_cannot_forward_refuses_sends_with_forbidden_and_answers_routes(
        tmp_path, home, nodes, rocketmq):
    g, = free_ports(1)
    h1, h2 = free_ports(2)  # nothing listens on h2: its master never answered
    s = Node(tmp_path, "s", "slave", g, h1, h2, home)
    nodes.append(s)
    s.start()
    assert s.role("status")["master_endpoint"] is None
    producer = rocketmq.Producer(configuration(rocketmq, s.endpoint), ("orders",))
    producer.startup()  # the route query is answered here
    try:
        with pytest.raises(Exception) as refused:
            send(producer, rocketmq, b"nowhere")
    finally:
        producer.shutdown()
    assert type(refused.value).__name__ == "ForbiddenException"
    assert "40300" in str(refused.value) and "this node takes no writes (store role is " \
        "slave) and knows no master endpoint to forward to" in str(refused.value)
    assert s.role("status")["max_offset"] == 0


def test_a_slave_forwards_over_tls_checking_the_masters_certificate(tmp_path, home, nodes,
                                                                     rocketmq):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=mqstore", "-addext",
                    "subjectAltName=IP:127.0.0.1"], check=True, capture_output=True, timeout=60)
    tls = {"grpc_tls_cert_file": str(cert), "grpc_tls_key_file": str(key)}
    g1, g2 = free_ports(2)
    h1, h2 = free_ports(2)
    m = Node(tmp_path, "m", "async_master", g1, h1, h2, home, server=tls)
    s = Node(tmp_path, "s", "slave", g2, h2, h1, home, server=tls)
    nodes += [m, s]
    m.start()
    s.start()
    from rocketmq.grpc_protocol import MessagingServiceStub, definition_pb2 as d, service_pb2
    request = service_pb2.SendMessageRequest(messages=[d.Message(
        topic=d.Resource(name="orders"), body=b"sealed", system_properties=d.SystemProperties(
            message_id="0100000000000000000000000001", message_type=d.MessageType.NORMAL,
            body_encoding=d.Encoding.IDENTITY))])
    creds = grpc.ssl_channel_credentials(root_certificates=cert.read_bytes())
    with grpc.secure_channel(s.endpoint, creds) as channel:
        send_to_slave = MessagingServiceStub(channel).SendMessage

        def stored():  # refused (FORBIDDEN) until the slave was told the master's endpoint
            response = send_to_slave(request, timeout=10)
            return response if response.status.code == 20000 else None
        response = wait_until(stored, WAIT_S, "a send through the slave stored")
    assert response.entries[0].offset == 0
    assert f"forwarding MessagingService calls to the master's endpoint {m.endpoint}" in s.log()


def test_the_automatic_runbooks_node_configuration_passes_serves_checks():
    """The configuration docs/replication.md's automatic runbook gives each node passes what
    ``serve`` checks before it listens: its endpoint, beyond loopback, serves the admin
    service (``mqstore role --server``) only with admin keys; a coordinated node needs a
    replication address the others can dial, admitted as a master's must be."""
    runbook = (DOCS / "replication.md").read_text().split("### Runbook: automatic failover")[1]
    block = re.search(r"```yaml\n(.*?)```", runbook, re.S).group(1)
    config = load_config(overrides=yaml.safe_load(block))
    check_exposure(config.server, admin_served=True)
    assert coordination_listen_problem(config.server, config.coordination) is None
    assert config.coordination.etcd_endpoints and config.server.grpc_admin_keys

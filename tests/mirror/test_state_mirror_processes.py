"""The state mirror between real processes on 127.0.0.1, the default worker processes: masters
and slaves are ``mqstore serve`` deployments, clients the official RocketMQ 5 Python client in
processes of their own (``endpoint_client_proc.py``), other processes' state changes a
read-only store popping and committing (``state_churn_proc.py``).

The story they tell: an "orders" topic of 8 queues, a "billing" SimpleConsumer group acking, a
master SIGKILLed mid-stream and its slave promoted (stopped, its mirror installed, reopened as
master): the group receives again only what was in flight at the kill, nothing acknowledged,
and the topic keeps its 8 queues."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_support import env, mqstore, mqstore_json
from endpoint_support import Clients, Served
from mqstore import MessageStore, load_config
from mqstore.testing import patience
from mqstore.format.state_record import STATE_TOPIC
from mqstore.mirror.install import install_mirror_files
from mqstore.storage.state_files import state_files
from paths import SUPPORT
from replication_procs import SEG, Slave, base_config, wait_for, write_yaml

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("no_plugin_env", "watchdog")]
CLIENT_PROC = SUPPORT / "endpoint_client_proc.py"
CHURN_PROC = SUPPORT / "state_churn_proc.py"


# -- processes -----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def master_yaml(tmp_path: Path, root: Path, role: str, ha_port: int = 0) -> Path:
    config = base_config(role=role)
    config["store"]["root"] = str(root)
    config["flush"] = {"sync_timeout_ms": 3000}
    config["server"] = {"metrics_listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
                        "grpc_min_invisible_ms": 1000, "ha_listen": f"127.0.0.1:{ha_port}"}
    return write_yaml(tmp_path / f"{root.name}-{role}.yaml", config)


def ha_address(served: Served) -> str:
    wait_for(lambda: "listening for slaves on" in served.log(), "the HA listener")
    return re.search(r"listening for slaves on ([\d.]+:\d+)", served.log()).group(1)


class Proc:
    """A helper process whose output lines a test reads back."""

    def __init__(self, args: list[str], out: Path, home: Path) -> None:
        self.out = out
        with open(out, "w") as f:
            self.proc = subprocess.Popen([sys.executable, *map(str, args)], stdout=f,
                                         stderr=subprocess.STDOUT,
                                         env={**env(), "HOME": str(home),
                                              "PYTHONPATH": str(SUPPORT)},
                                         start_new_session=True)

    def lines(self) -> list[str]:
        return self.out.read_text().splitlines()

    def words(self, first: str) -> list[str]:
        return [line.split()[1] for line in self.lines() if line.startswith(first + " ")]

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(60)

    def wait(self) -> int:
        return self.proc.wait(120)


@pytest.fixture
def running():
    """Every process a test starts is gone when it ends."""
    started: list = []
    yield started
    for p in started:
        try:
            p.kill()
        except Exception:  # noqa: BLE001 - one already gone
            pass


def state_bytes(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in state_files(str(root))}


def mirrored(master: Path, slave: Path) -> bool:
    try:
        return state_bytes(master) == state_bytes(slave / "replica")
    except FileNotFoundError:  # replaced while read
        return False


def produce(endpoint: str, n: int) -> None:
    """``n`` messages to topic orders through ``mqstore produce --server``."""
    mqstore("produce", "-t", "orders", "--server", endpoint, "--summary", "-l", "-",
            input="".join(f"m{i}\n" for i in range(n)))


def queue_ends(root: Path, topic: str) -> dict[int, int]:
    store = MessageStore.open(root, config=load_config(overrides={
        "plugins": {"load_entry_points": False}}), read_only=True)
    try:
        return {q: store.max_offset(topic, q) for q in store.queue_ids(topic)}
    finally:
        store.close()


# -- the story -----------------------------------------------------------------------------------
def test_a_promoted_slave_redelivers_only_what_was_in_flight_at_the_masters_sigkill(
        tmp_path, home, rocketmq, running):
    master_root, slave_root = tmp_path / "master", tmp_path / "slave"
    master = Served(master_yaml(tmp_path, master_root, "sync_master"), tmp_path / "m.log", home)
    running.append(master)
    slave = Slave(slave_root, base_config(), ha_address(master), tmp_path / "s.log")
    running.append(slave)
    server = ("--server", master.endpoint)
    mqstore("topic", "create", "orders", "-q", "8", *server)
    mqstore("topic", "create", "audit", "-q", "4", *server)
    mqstore("topic", "update", "audit", "-w", "2", *server)
    wait_for(lambda: slave.metric("mqstore_replication_master_connected") == 1, "connected",
             logs=(slave.log_path,))
    producer = Proc([CLIENT_PROC, "produce", master.endpoint, "orders", "p", 400],
                    tmp_path / "producer.out", home)
    consumer = Proc([CLIENT_PROC, "consume", master.endpoint, "orders", "billing", "3,7",
                     tmp_path / "stop"], tmp_path / "consumer.out", home)
    running += [producer, consumer]
    wait_for(lambda: len(consumer.words("acked")) >= 150, "acks under way",
             logs=(tmp_path / "consumer.out", master.log_path))
    master.kill()  # SIGKILL, mid-stream: sends and acks under way
    producer.kill()
    consumer.kill()
    sent, got, acked = (set(producer.words("sent")), set(consumer.words("got")),
                        set(consumer.words("acked")))
    in_flight = got - acked
    assert len(acked) >= 150 and in_flight, (len(acked), len(in_flight))

    slave.stop()  # a clean stop: its dispatch covers every byte it received
    before = queue_ends(slave_root, "orders")
    report = install_mirror_files(str(slave_root))
    assert "config/topics.json" in report.installed
    assert (slave_root / "config/topics.json").read_bytes() == \
        (master_root / "config/topics.json").read_bytes()

    promoted = Served(master_yaml(tmp_path, slave_root, "async_master"), tmp_path / "p.log",
                      home)
    running.append(promoted)
    clients = Clients(rocketmq, promoted.endpoint)
    try:
        billing = clients.consumer("billing", {"orders": rocketmq.FilterExpression()},
                                   await_s=1)
        received, empty = [], 0
        # In-flight ones come back once their invisible time (2 s) runs out, counted from
        # their receive on the old master: receive until every message sent was received
        # before the kill or now, then until three receives in a row come back empty.
        deadline = time.monotonic() + patience(60)
        while empty < 3 or (not sent <= got | set(received) and time.monotonic() < deadline):
            batch = billing.receive(32, 30)
            for m in batch:
                billing.ack(m)
            received += [m.body.decode() for m in batch]
            empty = 0 if batch else empty + 1
        fresh = clients.producer("orders")
        for i in range(64):
            fresh.send(clients.message("orders", b"after-%d" % i))
    finally:
        clients.close()
    assert promoted.stop() == 0, promoted.log()
    again = set(received) & got
    print(f"in flight at the kill: {len(in_flight)}; received again: {len(again)}; "
          f"acked before the kill: {len(acked)}")
    assert len(received) == len(set(received))
    assert not set(received) & acked  # no acknowledged message comes back
    assert again <= in_flight and len(again) <= len(in_flight)
    assert sent <= got | set(received)  # nothing a send was answered for is lost
    # An in-flight message comes back, but for one whose ack the master took as it died (the
    # consumer acks one message at a time, and says so once the ack returned).
    assert len(in_flight - set(received)) <= 1, in_flight - set(received)
    # Topic configs and queue counts as on the master; new sends use all 8 queues.
    rows = {r["topic"]: r for r in mqstore_json("topic", "list", slave_root, "--json")}
    master_rows = {r["topic"]: r for r in mqstore_json("topic", "list", master_root, "--json")}
    for name in ("orders", "audit"):
        for key in ("read_queues", "write_queues", "perm"):
            assert rows[name][key] == master_rows[name][key]
    assert rows["orders"]["write_queues"] == 8 and rows["audit"]["write_queues"] == 2
    after = queue_ends(slave_root, "orders")
    assert sorted(after) == list(range(8)) and all(after[q] > before[q] for q in range(8))


def test_the_endpoint_keeps_system_topics_from_clients(tmp_path, home, rocketmq, running):
    import grpc

    from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2, service_pb2_grpc
    from mqstore.endpoint.resources import topic_to_write
    from mqstore.endpoint.status import EndpointError

    master_root = tmp_path / "master"
    master = Served(master_yaml(tmp_path, master_root, "async_master"), tmp_path / "m.log",
                    home)
    running.append(master)
    mqstore("topic", "create", "orders", "-q", "8", "--server", master.endpoint)
    wait_for(lambda: STATE_TOPIC in [r["topic"] for r in mqstore_json(
        "topic", "list", "--system", "--json", "--server", master.endpoint)],
        "the snapshot's records dispatched")
    assert [r["topic"] for r in mqstore_json("topic", "list", "--json", "--server",
                                             master.endpoint)] == ["orders"]
    with grpc.insecure_channel(master.endpoint) as channel:
        route = service_pb2_grpc.MessagingServiceStub(channel).QueryRoute(
            service_pb2.QueryRouteRequest(topic=definition_pb2.Resource(name=STATE_TOPIC)),
            timeout=10)
    assert route.status.code == Code.FORBIDDEN
    assert "is a system topic" in route.status.message and not route.message_queues
    with pytest.raises(EndpointError) as refused:  # what a SendMessage's topic meets
        topic_to_write(STATE_TOPIC)
    assert refused.value.code == Code.FORBIDDEN
    clients = Clients(rocketmq, master.endpoint)
    try:
        producer = clients.producer()
        with pytest.raises(Exception, match="route"):  # the client reports the refused route
            producer.send(clients.message(STATE_TOPIC, b"x"))
        assert producer.send(clients.message("orders", b"ok")).message_id
    finally:
        clients.close()


# -- a new slave, and other processes' changes -----------------------------------------------------
def test_a_new_slave_from_the_masters_last_segment_gets_all_state_from_a_snapshot(
        tmp_path, home, rocketmq, running):
    master_root, slave_root = tmp_path / "master", tmp_path / "slave"
    master = Served(master_yaml(tmp_path, master_root, "async_master"), tmp_path / "m.log",
                    home)
    running.append(master)
    mqstore("topic", "create", "orders", "-q", "8", "--server", master.endpoint)
    clients = Clients(rocketmq, master.endpoint)
    try:
        producer = clients.producer("orders")
        body = b"x" * 400
        for i in range(200):  # early state: acks in the first segments
            producer.send(clients.message("orders", body))
        billing = clients.consumer("billing", {"orders": rocketmq.FilterExpression()})
        clients.receive_all(billing, 120, invisible_s=60)
        for i in range(400):  # more segments after it
            producer.send(clients.message("orders", body))
    finally:
        clients.close()
    segments = sorted(os.listdir(master_root / "commitlog"))
    assert len(segments) >= 3
    slave = Slave(slave_root, base_config(), ha_address(master), tmp_path / "s.log")
    running.append(slave)
    wait_for(lambda: mirrored(master_root, slave_root), "the snapshot on connect",
             logs=(slave.log_path, master.log_path))
    assert sorted(os.listdir(slave_root / "commitlog")) == segments[-1:]
    assert "consumer/pop/orders@billing.journal" in state_files(str(slave_root / "replica"))


def test_other_processes_changes_reach_the_slave(tmp_path, home, running):
    master_root, slave_root = tmp_path / "master", tmp_path / "slave"
    master = Served(master_yaml(tmp_path, master_root, "async_master"), tmp_path / "m.log",
                    home)
    running.append(master)
    slave = Slave(slave_root, base_config(), ha_address(master), tmp_path / "s.log")
    running.append(slave)
    mqstore("topic", "create", "orders", "-q", "4", "--server", master.endpoint)
    produce(master.endpoint, 300)
    churn = Proc([CHURN_PROC, master_root, "orders", tmp_path / "stop"], tmp_path / "churn.out",
                 home)
    running.append(churn)
    wait_for(lambda: len(churn.lines()) >= 20, "rounds of pops, acks and commits",
             logs=(tmp_path / "churn.out",))
    (tmp_path / "stop").touch()
    assert churn.wait() == 0 and churn.lines()[-1] == "stopped", churn.out.read_text()
    # Only the read-only opener changed state: the writer heard of it through the feed.
    names = set(state_files(str(master_root)))
    assert {"consumer/pop/orders@churn-pop.journal",
            "consumer/groups/churn-commit/orders/recorded"} <= names
    wait_for(lambda: mirrored(master_root, slave_root), "the other process's changes",
             logs=(slave.log_path, master.log_path))


def test_shipper_and_applier_survive_sigkill(tmp_path, home, running):
    """The slave (its dispatch worker applying) and the master (its shipper) SIGKILLed while a
    read-only opener changes state: each restart converges to the master's files."""
    master_root, slave_root = tmp_path / "master", tmp_path / "slave"
    yaml = master_yaml(tmp_path, master_root, "async_master", ha_port=free_port())
    master = Served(yaml, tmp_path / "m1.log", home)
    running.append(master)
    address = ha_address(master)
    slave = Slave(slave_root, base_config(), address, tmp_path / "s.log")
    running.append(slave)
    mqstore("topic", "create", "orders", "-q", "4", "--server", master.endpoint)
    produce(master.endpoint, 2000)
    churn = Proc([CHURN_PROC, master_root, "orders", tmp_path / "stop"], tmp_path / "churn.out",
                 home)
    running.append(churn)
    logs = (slave.log_path, tmp_path / "churn.out")
    for kill in range(3):
        rounds = len(churn.lines())
        wait_for(lambda: len(churn.lines()) >= rounds + 10, "churn", logs=logs)
        slave.kill()  # mid-apply, whatever the worker was doing
        slave.start()
    rounds = len(churn.lines())
    wait_for(lambda: len(churn.lines()) >= rounds + 10, "churn", logs=logs)
    master.kill()  # the shipper mid-pass
    running.append(master := Served(yaml, tmp_path / "m2.log", home))
    assert ha_address(master) == address
    rounds = len(churn.lines())
    wait_for(lambda: len(churn.lines()) >= rounds + 10, "churn after the restart", logs=logs)
    (tmp_path / "stop").touch()
    assert churn.wait() == 0, churn.out.read_text()
    wait_for(lambda: mirrored(master_root, slave_root), "the mirror after the kills",
             logs=(slave.log_path, master.log_path))
    assert slave.metric("mqstore_replication_master_connected") == 1
    assert "passed over" not in slave.log_path.read_text()

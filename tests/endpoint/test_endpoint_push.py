"""The official client's PushConsumer against ``mqstore serve`` (default worker processes):
QueryAssignment, the listener's successes and failures, deliveries the endpoint renews while
a slow listener holds them, two consumer processes sharing a group, and a SIGKILL of serve
mid-consumption. Consumers run in processes of their own (``push_consumer_proc``), which say
what they were given and which acks the server answered OK."""

from __future__ import annotations

import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import grpc
import pytest

from cli_support import env, mqstore_json
from endpoint_support import Clients, Served, deployment_yaml, serving
from mqstore.testing import wait_for
from paths import SUPPORT

pytestmark = pytest.mark.usefixtures("no_plugin_env")
PUSH_PROC = SUPPORT / "push_consumer_proc.py"
INVISIBLE_MS = 3000  # server.grpc_push_invisible_ms here: renewals every 0.75 s


@pytest.fixture(scope="module")
def served(tmp_path_factory, home):
    with serving(tmp_path_factory.mktemp("served"), home,
                 server={"grpc_push_invisible_ms": INVISIBLE_MS}) as server:
        yield server


class PushProc:
    """A PushConsumer process (``push_consumer_proc``) and what it said."""

    def __init__(self, tmp_path: Path, home: Path, endpoint: str, topic: str, group: str,
                 name: str, fail: str = "", sleep_ms: int = 0, hold_after: int = 0) -> None:
        self.out = tmp_path / f"{name}.log"
        self.stop_file = tmp_path / f"{name}.stop"
        self.hold_file = tmp_path / f"{name}.hold"
        hold = [str(self.hold_file), str(hold_after)] if hold_after else []
        if hold:
            self.hold_file.touch()
        with open(self.out, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, str(PUSH_PROC), endpoint, topic, group, str(self.stop_file),
                 fail, str(sleep_ms), *hold], stdout=out, stderr=subprocess.STDOUT,
                env={**env(), "HOME": str(home), "PYTHONPATH": str(SUPPORT)})

    def lines(self) -> list[list[str]]:
        return [line.split() for line in self.out.read_text().splitlines()]

    def got(self) -> list[tuple[str, str, int, int]]:
        """(message id, body, attempt, ns) per delivery."""
        return [(w[1], w[2], int(w[3]), int(w[4])) for w in self.lines()
                if w[:1] == ["got"] and len(w) == 5]

    def acked(self) -> dict[str, int]:
        """message id -> when its ack was answered OK."""
        return {w[1]: int(w[2]) for w in self.lines() if w[:1] == ["acked"] and len(w) == 3}

    def received(self) -> list[tuple[str, int]]:
        """(message id, ns) per message a receive brought from the server."""
        return [(w[1], int(w[2])) for w in self.lines()
                if w[:1] == ["received"] and len(w) == 3]

    def settled(self) -> set[str]:
        """Message ids whose ack was answered: OK, or refused (an ack the server took before
        it was killed, answered to nobody, is refused when the client tries it again)."""
        return set(self.acked()) | {w[1] for w in self.lines()
                                    if w[:1] == ["ackfailed"] and w[2:] == ["BadRequestException"]}

    def wait_ready(self) -> None:
        wait_for(lambda: ["ready"] in self.lines() or self.proc.poll() is not None, 60,
                 what="the push consumer started")
        assert self.proc.poll() is None, self.out.read_text()

    def release(self) -> None:
        """Lets a listener held past ``hold_after`` deliveries go on."""
        self.hold_file.unlink(missing_ok=True)

    def stop(self) -> int:
        self.release()
        self.stop_file.touch()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            raise AssertionError(f"the push consumer did not stop:\n{self.out.read_text()}")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


def send(clients: Clients, topic: str, bodies) -> dict[str, str]:
    """body -> message id of each message sent (answered OK)."""
    producer = clients.producer(topic)
    return {b: producer.send(clients.message(topic, b.encode())).message_id for b in bodies}


def none_delivered_after_its_ack(*procs: PushProc) -> list:
    """Messages the server handed out (to any process) after their ack was answered OK. A
    listener may still see a message it received before another process acknowledged it:
    the client caches what it receives until a consumption thread is free."""
    acked: dict[str, int] = {}
    for p in procs:
        for mid, ns in p.acked().items():
            acked[mid] = min(ns, acked.get(mid, ns))
    return [(mid, ns - acked[mid]) for p in procs for mid, ns in p.received()
            if mid in acked and ns > acked[mid]]


def assert_nothing_left(clients: Clients, rocketmq, topic: str, group: str) -> None:
    """A SimpleConsumer of the group, polling past the push invisible time, finds nothing:
    every message was acknowledged (an unacknowledged one would be back by then)."""
    consumer = clients.consumer(group, {topic: rocketmq.FilterExpression()},
                                await_s=INVISIBLE_MS // 1000 + 3)
    assert consumer.receive(32, 10) == []


def test_query_assignment_answers_the_broker_once_with_every_queue(served):
    from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2, service_pb2_grpc
    dialled = definition_pb2.Endpoints(scheme=definition_pb2.IPv4, addresses=[
        definition_pb2.Address(host="10.1.2.3", port=9876)])
    with grpc.insecure_channel(served.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        reply = stub.QueryAssignment(service_pb2.QueryAssignmentRequest(
            topic=definition_pb2.Resource(name="Assigned"),
            group=definition_pb2.Resource(name="assigned-group"), endpoints=dialled),
            timeout=10)
        bad_group = stub.QueryAssignment(service_pb2.QueryAssignmentRequest(
            topic=definition_pb2.Resource(name="Assigned"),
            group=definition_pb2.Resource(name="bad group")), timeout=10)
        system = stub.QueryAssignment(service_pb2.QueryAssignmentRequest(
            topic=definition_pb2.Resource(name="rmq_sys_state"),
            group=definition_pb2.Resource(name="assigned-group")), timeout=10)
    assert Code.Name(reply.status.code) == "OK"
    (assignment,) = reply.assignments
    queue = assignment.message_queue
    assert (queue.topic.name, queue.id, queue.permission) == ("Assigned", -1,
                                                              definition_pb2.READ_WRITE)
    assert (queue.broker.name, queue.broker.id, queue.broker.endpoints) == ("mqstore", 0,
                                                                            dialled)
    assert Code.Name(bad_group.status.code) == "ILLEGAL_CONSUMER_GROUP"
    assert "bad group" in bad_group.status.message
    assert Code.Name(system.status.code) == "FORBIDDEN"


def test_every_message_reaches_the_listener_once_when_it_succeeds(tmp_path, home, served,
                                                                   clients, rocketmq):
    sent = send(clients, "PushOnce", [f"once-{i}" for i in range(100)])
    consumer = PushProc(tmp_path, home, served.endpoint, "PushOnce", "once-group", "once")
    try:
        consumer.wait_ready()
        wait_for(lambda: len(consumer.acked()) >= len(sent), 60,
                 what="every message acknowledged")
        assert consumer.stop() == 0, consumer.out.read_text()
    finally:
        consumer.kill()
    got = consumer.got()
    assert sorted((body, mid) for mid, body, _a, _ns in got) == sorted(sent.items())
    assert {attempt for _m, _b, attempt, _ns in got} == {1}
    assert set(consumer.acked()) == set(sent.values())
    assert_nothing_left(clients, rocketmq, "PushOnce", "once-group")


def test_a_failed_consumption_comes_back_until_it_succeeds(tmp_path, home, served, clients,
                                                            rocketmq):
    sent = send(clients, "PushRetry", [f"retry-{i}" for i in range(10)])
    consumer = PushProc(tmp_path, home, served.endpoint, "PushRetry", "retry-group", "retry",
                        fail="-3,-7")
    try:
        consumer.wait_ready()
        wait_for(lambda: len(consumer.acked()) >= len(sent), 60,
                 what="every message acknowledged, the failed ones at their second attempt")
        assert consumer.stop() == 0, consumer.out.read_text()
    finally:
        consumer.kill()
    attempts: dict[str, list[int]] = {}
    for _mid, body, attempt, _ns in consumer.got():
        attempts.setdefault(body, []).append(attempt)
    assert attempts == {b: [1, 2] if b in ("retry-3", "retry-7") else [1] for b in sent}
    assert set(consumer.acked()) == set(sent.values())
    assert_nothing_left(clients, rocketmq, "PushRetry", "retry-group")


def test_a_fifo_group_consumes_each_message_group_in_order(tmp_path, home, served, clients):
    """A FIFO group: the client consumes a message group's messages one after another, retries
    a failing one locally (its attempts outlast the push invisible time, so the endpoint
    renews it meanwhile), then forwards it to the DLQ; only then comes the group's next."""
    mqstore_json("group", "config", "--server", served.endpoint, "fifo-push", "--orderly",
                 "--retry-max-times", "2")
    producer = clients.producer("PushFifo")
    sent = {}
    for i in range(4):
        for g in ("ga", "gb"):
            m = clients.message("PushFifo", f"{g}-{i}".encode())
            m.message_group = g
            sent[f"{g}-{i}"] = producer.send(m).message_id
    consumer = PushProc(tmp_path, home, served.endpoint, "PushFifo", "fifo-push", "fifo",
                        fail="ga-1")
    try:
        consumer.wait_ready()
        wait_for(lambda: len(consumer.acked()) >= len(sent) - 1, 90,
                 what="every message but the failing one acknowledged")
        assert consumer.stop() == 0, consumer.out.read_text()
    finally:
        consumer.kill()
    calls: dict[str, list[str]] = {}
    for _mid, body, attempt, _ns in consumer.got():
        calls.setdefault(body.split("-")[0], []).append(body)
    assert calls == {"ga": ["ga-0", "ga-1", "ga-1", "ga-1", "ga-2", "ga-3"],
                     "gb": ["gb-0", "gb-1", "gb-2", "gb-3"]}, consumer.out.read_text()
    assert set(consumer.acked()) == set(sent.values()) - {sent["ga-1"]}
    dead = mqstore_json("group", "dlq", "--server", served.endpoint, "fifo-push")
    assert [(d["id"], d["origin_topic"]) for d in dead] == [(sent["ga-1"], "PushFifo")]


def test_a_listener_slower_than_the_invisible_time_is_given_each_message_once(
        tmp_path, home, served, clients, rocketmq):
    """Each listener call takes twice the invisible time: the endpoint renews what the
    consumer holds, so nothing comes back while it works, and its acks (of the handles it was
    given) are taken."""
    sent = send(clients, "PushSlow", [f"slow-{i}" for i in range(6)])
    consumer = PushProc(tmp_path, home, served.endpoint, "PushSlow", "slow-group", "slow",
                        sleep_ms=2 * INVISIBLE_MS)
    try:
        consumer.wait_ready()
        wait_for(lambda: len(consumer.acked()) >= len(sent), 60,
                 what="every slow message acknowledged")
        assert consumer.stop() == 0, consumer.out.read_text()
    finally:
        consumer.kill()
    assert Counter(body for _m, body, _a, _ns in consumer.got()) == Counter(list(sent))
    assert set(consumer.acked()) == set(sent.values())
    assert "ackfailed" not in consumer.out.read_text()
    assert_nothing_left(clients, rocketmq, "PushSlow", "slow-group")


def test_two_consumer_processes_share_a_group_and_one_left_gets_everything(
        tmp_path, home, served, clients, rocketmq):
    sent = send(clients, "PushShared", ["seed"])
    procs = [PushProc(tmp_path, home, served.endpoint, "PushShared", "shared-group", name,
                      sleep_ms=5) for name in ("a", "b")]
    try:
        for p in procs:
            p.wait_ready()
        # A consumer starts receiving a moment after it says it is ready: seeds, one at a
        # time, until each has one, so neither can drain everything before the other starts.
        producer = clients.producer("PushShared")

        def seeded() -> bool:
            if all(p.got() for p in procs):
                return True
            body = f"seed-{len(sent)}"
            sent[body] = producer.send(clients.message("PushShared", body.encode())).message_id
            return False
        wait_for(seeded, 60, interval=0.1, what="a seed given to each consumer")
        sent.update(send(clients, "PushShared", [f"shared-{i}" for i in range(300)]))
        wait_for(lambda: len(set(procs[0].acked()) | set(procs[1].acked())) >= len(sent), 90,
                 what="every message acknowledged by one of the two")
        assert all(p.got() for p in procs), "both consumers took a share"
        assert procs[0].stop() == 0, procs[0].out.read_text()
        later = send(clients, "PushShared", [f"later-{i}" for i in range(100)])
        wait_for(lambda: set(later.values()) <= set(procs[1].acked()), 60,
                 what="the consumer left acknowledged everything sent after the other left")
        assert procs[1].stop() == 0, procs[1].out.read_text()
    finally:
        for p in procs:
            p.kill()
    got = [(mid, body) for p in procs for mid, body, _a, _ns in p.got()]
    assert set(got) == {(mid, body) for body, mid in {**sent, **later}.items()}
    assert none_delivered_after_its_ack(*procs) == []
    assert not [mid for mid, _b, _a, _ns in procs[0].got() if mid in later.values()]
    assert_nothing_left(clients, rocketmq, "PushShared", "shared-group")


def test_what_a_client_holds_is_renewed_until_it_says_goodbye(served, clients, rocketmq):
    """The raw protocol, as the PushConsumer speaks it: a receive with auto_renew (and no
    invisible duration) is held past the invisible time while its client is known, and comes
    back (attempt 2) once the client sent NotifyClientTermination."""
    from google.protobuf.duration_pb2 import Duration
    from mqstore.endpoint.protocol import definition_pb2, service_pb2, service_pb2_grpc
    send(clients, "PushBye", ["bye-0"])
    group = definition_pb2.Resource(name="bye-group")
    metadata = (("x-mq-client-id", "bye-client"),)
    with grpc.insecure_channel(served.endpoint) as channel:
        stub = service_pb2_grpc.MessagingServiceStub(channel)
        answer = list(stub.ReceiveMessage(service_pb2.ReceiveMessageRequest(
            group=group, message_queue=definition_pb2.MessageQueue(
                topic=definition_pb2.Resource(name="PushBye"), id=-1),
            batch_size=32, auto_renew=True, long_polling_timeout=Duration(seconds=5)),
            metadata=metadata, timeout=30))
        assert [r.message.body for r in answer if r.HasField("message")] == [b"bye-0"]
        consumer = clients.consumer("bye-group", {"PushBye": rocketmq.FilterExpression()},
                                    await_s=INVISIBLE_MS // 1000 + 2)
        assert consumer.receive(32, 10) == []  # past its invisible time: renewed
        bye = stub.NotifyClientTermination(service_pb2.NotifyClientTerminationRequest(
            group=group), metadata=metadata, timeout=10)
        assert bye.status.code == 20000
    back = clients.receive_all(consumer, 1, timeout_s=30)
    assert [(m.body, m.delivery_attempt) for m in back] == [(b"bye-0", 2)]


@pytest.mark.slow
def test_sigkill_of_serve_mid_consumption_loses_nothing_and_redelivers_nothing_acked(
        tmp_path, home, rocketmq):
    from failover_support import free_ports
    (port,) = free_ports(1)
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store",
                           server={"grpc_listen": f"127.0.0.1:{port}",
                                   "grpc_push_invisible_ms": INVISIBLE_MS},
                           extra="flush: {policy: sync}\n")
    served = Served(yaml, tmp_path / "serve1.log", home)
    clients = Clients(rocketmq, served.endpoint)
    procs: list[PushProc] = []
    try:
        sent = send(clients, "PushKilled", ["seed"])
        # Each listener holds every delivery past its 40th until released: the consumers
        # are mid-way at the kill on a machine of any speed.
        procs += [PushProc(tmp_path, home, served.endpoint, "PushKilled", "killed-group",
                           name, sleep_ms=20, hold_after=40) for name in ("a", "b")]
        for p in procs:
            p.wait_ready()
        sent.update(send(clients, "PushKilled", [f"before-{i}" for i in range(300)]))
        clients.close()
        acked = lambda: set(procs[0].acked()) | set(procs[1].acked())  # noqa: E731
        settled = lambda: procs[0].settled() | procs[1].settled()  # noqa: E731
        wait_for(lambda: len(acked()) >= 40, 60, what="some messages acknowledged")
        served.kill()  # SIGKILL to serve and its workers, consumers mid-way
        assert 40 <= len(acked()) <= 80 < len(sent)
        served = Served(yaml, tmp_path / "serve2.log", home)
        assert served.endpoint == f"127.0.0.1:{port}"
        for p in procs:
            p.release()
        clients = Clients(rocketmq, served.endpoint)
        sent.update(send(clients, "PushKilled", [f"after-{i}" for i in range(50)]))
        wait_for(lambda: set(sent.values()) <= settled(), 120,
                 what="every message consumed and its ack answered after the restart")
        for p in procs:
            assert p.stop() == 0, p.out.read_text()
        assert_nothing_left(clients, rocketmq, "PushKilled", "killed-group")
    finally:
        for p in procs:
            p.kill()
        clients.close()
        code = served.stop()
    assert code == 0, served.log()
    assert "recovery" in served.log()
    # Nothing lost: every message reached a listener, and the group has nothing left
    # (assert_nothing_left above); nothing whose ack was answered OK came again.
    got = {(mid, body) for p in procs for mid, body, _a, _ns in p.got()}
    assert got == {(mid, body) for body, mid in sent.items()}
    assert none_delivered_after_its_ack(*procs) == []


def test_renewals_keep_what_a_client_holds_invisible_and_give_it_back(make_store,
                                                                      manual_clock,
                                                                      monkeypatch):
    """The endpoint's renewals on a store with a manual clock (NOTE [ Auto-renewed
    deliveries ]): renewed ahead of their invisible time, an ack of the handle the client was
    given takes the latest, a client gone gets its deliveries back a second later, one held
    past the longest hold comes back after the group's retry delay."""
    from mqstore.consumer import StaleReceiptHandleError
    from mqstore.consumer.receipt_handles import make_handle
    from mqstore.endpoint import renewals as renewals_module
    from mqstore.endpoint.protocol import Code
    from mqstore.endpoint.renewals import (
        GIVE_BACK_MS, MAX_HELD_PER_CLIENT, MAX_HOLD_MS, Renewals,
    )
    from mqstore.endpoint.status import EndpointError
    from mqstore.testing.stores import fill

    store = make_store()
    fill(store, 4, topic="Held", queues=1, body=lambda i: b"h%d" % i)
    store.wait_dispatched(10)
    popped = store.pop("held-group", "Held", 3, 3000, consume_from="first")
    renewals = Renewals(store, 3000, [7000, 9000])
    assert (renewals.ahead_ms, renewals.period_s) == (1500, 0.75)
    given = {f"id{i}": m.receipt_handle for i, m in enumerate(popped)}
    renewals.hold("c1", [(handle, 1) for handle in given.values()])
    manual_clock.advance(1000)
    assert renewals.renew_due(lambda client: True) == 0  # 2000 ms left: not yet
    manual_clock.advance(600)
    assert renewals.renew_due(lambda client: True) == 3  # 1400 ms left: renewed
    manual_clock.advance(2000)  # past the first invisible time, not the renewed one
    (fourth,) = store.pop("held-group", "Held", 4, 3000)
    assert fourth.body == b"h3" and store.ack([fourth.receipt_handle]) == [None]
    latest = renewals.take("c1", given["id0"])
    assert latest != given["id0"]
    assert store.ack([latest]) == [None]
    assert renewals.take("c1", given["id0"]) == given["id0"]
    assert renewals.take("c1", "not a handle") == "not a handle"
    with pytest.raises(StaleReceiptHandleError):
        store.ack(given["id0"])
    # The client is gone: what it holds is visible again GIVE_BACK_MS later.
    assert renewals.renew_due(lambda client: False) == 0 and len(renewals) == 0
    manual_clock.advance(GIVE_BACK_MS - 1)
    assert store.pop("held-group", "Held", 4, 3000) == []
    manual_clock.advance(1)
    again = store.pop("held-group", "Held", 4, 60_000)
    assert sorted((m.body, m.delivery_attempt) for m in again) == [(b"h1", 2), (b"h2", 2)]
    # Held past MAX_HOLD_MS: no more renewals; back after the retry delay of its attempt.
    renewals.hold("c2", [(again[0].receipt_handle, 2)])
    manual_clock.advance(MAX_HOLD_MS)
    assert renewals.renew_due(lambda client: True) == 0 and renewals.held("c2") == 0
    manual_clock.advance(9000 - 1)
    assert [m.body for m in store.pop("held-group", "Held", 4, 60_000)] == [b"h2"]
    manual_clock.advance(1)
    assert [m.body for m in store.pop("held-group", "Held", 4, 60_000)] == [again[0].body]
    # A client holding all it may is refused more until it acknowledges some.
    handles = [make_handle("T", "g", 0, i, 1, i) for i in range(MAX_HELD_PER_CLIENT)]
    renewals.hold("c3", [(h, 1) for h in handles])
    with pytest.raises(EndpointError) as refused:
        renewals.check_room("c3")
    assert refused.value.code == Code.TOO_MANY_REQUESTS
    assert f"holds {MAX_HELD_PER_CLIENT} unacknowledged messages" in refused.value.message
    assert renewals.take("c3", handles[0]) == handles[0]
    renewals.check_room("c3")
    assert len(renewals) == MAX_HELD_PER_CLIENT - 1
    monkeypatch.setattr(renewals_module, "MAX_HELD", MAX_HELD_PER_CLIENT - 1)
    with pytest.raises(EndpointError) as refused:
        renewals.check_room("c4")  # all clients together hold all they may
    assert refused.value.code == Code.TOO_MANY_REQUESTS
    assert "push consumers hold 8191 unacknowledged messages" in refused.value.message
    assert renewals.give_back("c3") == MAX_HELD_PER_CLIENT - 1 and len(renewals) == 0
    renewals.check_room("c4")

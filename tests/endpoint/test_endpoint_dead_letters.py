"""Retries and dead letters through ``mqstore serve`` (a subprocess, default worker processes)
with the official client: the group's config set with ``mqstore group config --server``, its
attempts announced in the Settings, a SimpleConsumer that never acks sees exactly that many
deliveries, then the message sits in %DLQ%<group> (``mqstore group dlq`` lists it, /metrics
counts it, ``--resend`` sends it back); ForwardMessageToDeadLetterQueue; and serve SIGKILLed
while dead-lettering leaves every message pending or in the DLQ once."""

from __future__ import annotations

import re
import signal
import time

import grpc
import pytest

from cli_support import mqstore_json
from endpoint_support import Clients, Served, consumer_settings, deployment_yaml
from mqstore.testing import patience, wait_for
from serve_support import scrape

pytestmark = pytest.mark.usefixtures("no_plugin_env")


def metrics_url(served: Served) -> str:
    return re.search(r"serving metrics on (\S+)/metrics", served.log()).group(1)


def telemetry_attempts(endpoint: str, group: str) -> int:
    return consumer_settings(endpoint, group).backoff_policy.max_attempts


def drain_without_acks(consumer, quiet_s: float, limit_s: float) -> list:
    """Every delivery a never-acking consumer sees until ``quiet_s`` pass without one."""
    seen: list = []
    last = time.monotonic()
    deadline = last + patience(limit_s)
    while time.monotonic() - last < quiet_s and time.monotonic() < deadline:
        batch = consumer.receive(32, 1)  # invisible for 1 s: due again soon
        if batch:
            seen += batch
            last = time.monotonic()
    return seen


def test_a_consumer_that_never_acks_sees_max_attempts_then_the_dlq(served, rocketmq):
    ep = served.endpoint
    assert telemetry_attempts(ep, "never-acks") == 17  # RocketMQ's 16 retries + 1
    config = mqstore_json("group", "config", "--server", ep, "never-acks",
                          "--retry-max-times", "2")
    assert (config["retry_max_times"], config["max_attempts"]) == (2, 3)
    assert telemetry_attempts(ep, "never-acks") == 3
    with Clients(rocketmq, ep) as clients:
        producer = clients.producer("Failing")
        sent = producer.send(clients.message("Failing", b"always fails", tag="T1",
                                             keys="fk-1")).message_id
        consumer = clients.consumer("never-acks", {"Failing": rocketmq.FilterExpression()})
        seen = drain_without_acks(consumer, quiet_s=6.0, limit_s=90)
    assert [(m.message_id, m.delivery_attempt) for m in seen] == [(sent, 1), (sent, 2),
                                                                 (sent, 3)]
    (dead,) = mqstore_json("group", "dlq", "--server", ep, "never-acks")
    assert (dead["offset"], dead["id"], dead["origin_topic"], dead["attempts"]) == (
        0, sent, "Failing", 3)
    assert (dead["tags"], dead["keys"]) == ("T1", ["fk-1"])
    m = wait_for(lambda: (got := scrape(metrics_url(served))).get(
        ("mqstore_dead_letters_total", (("group", "never-acks"),))) == 1 and got,
        what="the dead letter counted")
    assert m[("mqstore_dead_letters_total", (("group", "never-acks"),))] == 1
    assert m[("mqstore_consumer_dead_letters_total", (("group", "never-acks"),))] == 1
    resent = mqstore_json("group", "dlq", "--server", ep, "never-acks", "--resend", "--all")
    assert [(r["offset"], r["id"], r["topic"]) for r in resent["resent"]] == [
        (0, sent, "Failing")]
    with Clients(rocketmq, ep) as clients:
        consumer = clients.consumer("never-acks", {"Failing": rocketmq.FilterExpression()})
        (again,) = clients.receive_all(consumer, 1, timeout_s=patience(30))
    assert (again.message_id, again.delivery_attempt, again.body) == (sent, 1, b"always fails")


def test_forward_to_the_dead_letter_queue_acks_the_message(served, rocketmq):
    from mqstore.endpoint.protocol import definition_pb2, service_pb2, service_pb2_grpc
    with Clients(rocketmq, served.endpoint) as clients:
        producer = clients.producer("Forwarded")
        sent = producer.send(clients.message("Forwarded", b"to the dlq")).message_id
        consumer = clients.consumer("fwd", {"Forwarded": rocketmq.FilterExpression()})
        (msg,) = clients.receive_all(consumer, 1, ack=False, timeout_s=patience(30))
        with grpc.insecure_channel(served.endpoint) as channel:
            stub = service_pb2_grpc.MessagingServiceStub(channel)

            def forward(group="fwd", handle=msg.receipt_handle):
                return stub.ForwardMessageToDeadLetterQueue(
                    service_pb2.ForwardMessageToDeadLetterQueueRequest(
                        group=definition_pb2.Resource(name=group),
                        topic=definition_pb2.Resource(name="Forwarded"),
                        receipt_handle=handle, message_id=sent, delivery_attempt=1,
                        max_delivery_attempts=17), timeout=10)
            assert definition_pb2.Code.Name(forward("other").status.code) == \
                "INVALID_RECEIPT_HANDLE"
            assert definition_pb2.Code.Name(forward().status.code) == "OK"
            again = forward()
            assert definition_pb2.Code.Name(again.status.code) == "INVALID_RECEIPT_HANDLE"
            assert "acknowledged" in again.status.message
        assert consumer.receive(32, 1) == []
    (dead,) = mqstore_json("group", "dlq", "--server", served.endpoint, "fwd")
    assert (dead["id"], dead["origin_topic"], dead["attempts"]) == (sent, "Forwarded", 1)
    m = scrape(metrics_url(served))
    assert m[("mqstore_consumer_dead_letters_total", (("group", "fwd"),))] == 1


def dispatched(root, topic: str) -> int:
    """Messages of ``topic`` in its consume queues, read beside the running server."""
    from mqstore import MessageStore, load_config
    config = load_config(overrides={"plugins": {"load_entry_points": False}})
    with MessageStore.open(root, config=config, read_only=True) as store:
        return sum(store.max_offset(topic, q) for q in store.queue_ids(topic))


FAULTS = ("plugins: {load_entry_points: false, modules: [mqstore.testing.faults]}\n"
          "writer: {kind: mmap_ctrl_c}\n")


@pytest.mark.slow
def test_sigkill_between_the_dead_letters_put_and_its_record_writes_each_once(
        tmp_path, home, rocketmq, monkeypatch):
    """serve is SIGKILLed right after the commit log took the dead letters' bytes, before the
    pop state recorded them (the fault writer kills its process group after write N: N - 1
    sends, one at a time, then the dead letters' one put). Restarted, it finds them in the
    log and writes none again; nothing is delivered again."""
    count = 20
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store")
    yaml.write_text(yaml.read_text().replace("plugins: {load_entry_points: false}\n", FAULTS))
    monkeypatch.setenv("MQSTORE_FAULT_SIGKILL_AFTER_WRITES", str(count + 1))
    served = Served(yaml, tmp_path / "serve1.log", home)
    try:
        mqstore_json("group", "config", "--server", served.endpoint, "doomed",
                     "--retry-max-times", "0")
        with Clients(rocketmq, served.endpoint) as clients:
            producer = clients.producer("Doomed")
            sent = [producer.send(clients.message("Doomed", b"d%03d" % i)).message_id
                    for i in range(count)]
            consumer = clients.consumer("doomed", {"Doomed": rocketmq.FilterExpression()})
            # All dispatched first, so one receive takes them all: receives spread over more
            # than their invisible second would bury the first ones before the test means to.
            wait_for(lambda: dispatched(tmp_path / "store", "Doomed") == count, 60,
                     what="every message dispatched")
            first = consumer.receive(32, 1)
            assert sorted(m.message_id for m in first) == sorted(sent)
            time.sleep(1.1)  # every invisible time has passed: the next receive buries them
            with pytest.raises(Exception):  # noqa: B017 - the server dies under the call
                consumer.receive(1, 1)
        assert served.proc.wait(patience(30)) == -signal.SIGKILL, served.log()
    finally:
        served.kill()
    monkeypatch.delenv("MQSTORE_FAULT_SIGKILL_AFTER_WRITES")
    served = Served(yaml, tmp_path / "serve2.log", home)
    try:
        # The dead letters' bytes survived the kill: recovery kept and dispatched them.
        before = wait_for(lambda: mqstore_json("group", "dlq", "--server", served.endpoint,
                                               "doomed"),
                          what="the dead letters written before the kill")
        with Clients(rocketmq, served.endpoint) as clients:
            consumer = clients.consumer("doomed", {"Doomed": rocketmq.FilterExpression()})
            redelivered = drain_without_acks(consumer, quiet_s=4.0, limit_s=60)
        after = mqstore_json("group", "dlq", "--server", served.endpoint, "doomed")
    finally:
        served.kill()
    assert redelivered == []
    assert {d["id"] for d in before} <= set(sent)
    assert sorted(d["id"] for d in after) == sorted(sent)  # none lost, none written twice

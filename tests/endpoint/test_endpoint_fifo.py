"""FIFO consumer groups through ``mqstore serve`` (a subprocess, default worker processes) with
the official client: a group made FIFO with ``mqstore group config --orderly`` is announced
``fifo`` in its Settings; its SimpleConsumer gets each message group's messages in order, an
unacknowledged one again before anything newer of its message group, max attempts then the
DLQ then the next; two consumer processes of the group keep each message group's order; and
serve SIGKILLed mid-sequence keeps the order after its restart."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from cli_support import env, mqstore_json
from endpoint_support import Clients, consumer_settings, serving
from mqstore.testing import patience, wait_for
from paths import SUPPORT

pytestmark = pytest.mark.usefixtures("no_plugin_env")

GROUPS = ("ga", "gb", "gc")


def telemetry_fifo(endpoint: str, group: str) -> bool:
    return consumer_settings(endpoint, group).subscription.fifo


def make_fifo(endpoint: str, group: str, **more) -> dict:
    args = ["group", "config", "--server", endpoint, group, "--orderly"]
    for name, value in more.items():
        args += [f"--{name.replace('_', '-')}", str(value)]
    return mqstore_json(*args)


def send_groups(clients, topic: str, per_group: int, groups=GROUPS) -> list[str]:
    """Messages ``<group>-<i>`` of each message group, interleaved; their bodies in order."""
    producer = clients.producer(topic)
    bodies = []
    for i in range(per_group):
        for g in groups:
            m = clients.message(topic, f"{g}-{i}".encode())
            m.message_group = g
            producer.send(m)
            bodies.append(f"{g}-{i}")
    return bodies


def by_group(bodies) -> dict[str, list[int]]:
    out: dict = {}
    for body in bodies:
        g, i = body.rsplit("-", 1)
        out.setdefault(g, []).append(int(i))
    return out


def test_a_fifo_group_is_announced_and_keeps_each_message_groups_order(served, clients,
                                                                         rocketmq):
    ep = served.endpoint
    assert telemetry_fifo(ep, "ordered") is False
    assert make_fifo(ep, "ordered")["consume_message_orderly"] is True
    assert telemetry_fifo(ep, "ordered") is True
    assert telemetry_fifo(ep, "plain") is False
    sent = send_groups(clients, "Ordered", 5)
    consumer = clients.consumer("ordered", {"Ordered": rocketmq.FilterExpression()})
    withheld = None
    order: list = []  # (body, attempt) as delivered
    done: set = set()
    deadline = time.monotonic() + patience(90)
    while len(done) < len(sent) and time.monotonic() < deadline:
        for m in consumer.receive(1, 30):
            body = m.body.decode()
            order.append((body, m.delivery_attempt))
            if withheld is None:  # not acked: it comes back in 1 s, before its next
                withheld = body
                consumer.change_invisible_duration(m, 1)
                continue
            consumer.ack(m)
            done.add(body)
    assert done == set(sent)
    assert [d for d in order if d[1] != 1] == [(withheld, 2)]
    assert by_group([b for b, a in order if a == 1]) == {g: list(range(5)) for g in GROUPS}
    group = withheld.rsplit("-", 1)[0]
    before = order[:order.index((withheld, 2))]
    assert [b for b, _a in before if b.startswith(group + "-")] == [withheld]


def test_max_attempts_then_the_dlq_then_the_next(served, clients, rocketmq):
    ep = served.endpoint
    make_fifo(ep, "twice", retry_max_times=1)
    send_groups(clients, "Poison", 3, groups=("only",))
    consumer = clients.consumer("twice", {"Poison": rocketmq.FilterExpression()})
    seen: list = []
    deadline = time.monotonic() + patience(90)
    while len(seen) < 4 and time.monotonic() < deadline:
        for m in consumer.receive(1, 30):
            body = m.body.decode()
            seen.append((body, m.delivery_attempt))
            if body == "only-0":
                consumer.change_invisible_duration(m, 1)  # fails: back in 1 s
            else:
                consumer.ack(m)
    assert seen == [("only-0", 1), ("only-0", 2), ("only-1", 1), ("only-2", 1)]
    (dead,) = mqstore_json("group", "dlq", "--server", ep, "twice")
    assert (dead["origin_topic"], dead["attempts"]) == ("Poison", 2)


def test_two_consumer_processes_keep_each_message_groups_order(served, clients, tmp_path,
                                                                home):
    ep = served.endpoint
    make_fifo(ep, "shared")
    names = [f"g{i}" for i in range(6)]
    sent = send_groups(clients, "Shared", 1, groups=["seed"])  # the topic exists first
    stop = tmp_path / "stop"
    logs = [tmp_path / f"consumer{i}.log" for i in range(2)]
    env_ = {**env(), "HOME": str(home), "PYTHONPATH": str(SUPPORT)}
    procs = []
    for path in logs:
        with open(path, "w") as out:
            procs.append(subprocess.Popen(
                [sys.executable, str(SUPPORT / "endpoint_client_proc.py"), "fifo-consume", ep,
                 "Shared", "shared", str(stop)], stdout=out, stderr=subprocess.STDOUT,
                env=env_))

    def lines():
        return [(i, line.split()) for i, path in enumerate(logs)
                for line in path.read_text().splitlines()]
    try:
        # both consumers wait before the messages come, so both take part
        wait_for(lambda: {i for i, w in lines() if w == ["ready"]} == {0, 1}, timeout=60,
                 what="both consumers started")
        sent += send_groups(clients, "Shared", 15, groups=names)
        wait_for(lambda: len({w[1] for _i, w in lines() if w[0] == "acking"}) == len(sent),
                 timeout=patience(120), what="every message acknowledged")
    finally:
        stop.touch()
        for p in procs:
            try:
                p.wait(patience(60))
            except subprocess.TimeoutExpired:
                p.kill()
    got = [(w[1], int(w[2]), float(w[3]), i) for i, w in lines() if w[0] == "got"]
    acking = {w[1]: float(w[2]) for _i, w in lines() if w[0] == "acking"}
    assert sorted(b for b, _a, _t, _i in got) == sorted(sent)  # each once, at attempt 1
    assert {a for _b, a, _t, _i in got} == {1}
    assert {i for *_rest, i in got} == {0, 1}  # both processes consumed
    # Each message was handed out in one receive with the one before it in its message
    # group (the same batch of its queue), or after that one was being acknowledged,
    # whichever process held it.
    handed = {b: (t, p) for b, _a, t, p in got}
    for g in names:
        for i in range(1, 15):
            now, earlier = handed[f"{g}-{i}"], handed[f"{g}-{i - 1}"]
            assert now == earlier or now[0] > acking[f"{g}-{i - 1}"], (g, i, now, earlier)


def test_sigkill_of_serve_mid_sequence_keeps_the_order(tmp_path, home, rocketmq):
    # Each block ends with a SIGKILL to serve and its workers: the first with only-0 in flight.
    with serving(tmp_path, home, clean=False, log="serve1.log") as served, \
            Clients(rocketmq, served.endpoint) as clients:
        make_fifo(served.endpoint, "survivor")
        send_groups(clients, "Kept", 3, groups=("only",))
        consumer = clients.consumer("survivor", {"Kept": rocketmq.FilterExpression()})
        first = wait_for(lambda: consumer.receive(1, 2), timeout=30,
                         what="the first message received")[0]
        assert (first.body, first.delivery_attempt) == (b"only-0", 1)
    with serving(tmp_path, home, clean=False, log="serve2.log") as served, \
            Clients(rocketmq, served.endpoint) as clients:
        assert telemetry_fifo(served.endpoint, "survivor") is True
        consumer = clients.consumer("survivor", {"Kept": rocketmq.FilterExpression()})
        seen = [(m.body.decode(), m.delivery_attempt)
                for m in clients.receive_all(consumer, 3, timeout_s=patience(60))]
    assert seen == [("only-0", 2), ("only-1", 1), ("only-2", 1)]

"""RocketMQ's C++ client (PyPI ``rocketmq==0.4.4``, remoting protocol) against ``mqstore
serve``: its producer and push consumer told the broker's own port as their NameServer."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from mqstore.format.remoting_message import decode_batch
from mqstore.testing import wait_for

from cpp_client_support import cpp_env
from remoting_support import Served, Wire, deployment_yaml, pull_ext, records

pytestmark = pytest.mark.slow
PROC = Path(__file__).resolve().parents[1] / "support" / "cpp_client_proc.py"
TIMEOUT_S = 120


def run(cpp_client, home, *args) -> dict:
    out = subprocess.run([sys.executable, str(PROC), *map(str, args)], capture_output=True,
                         text=True, timeout=TIMEOUT_S, env=cpp_env(cpp_client, home))
    assert out.returncode == 0, out.stdout + out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_producer_and_push_consumer_round_trip_keys_tags_and_properties(served, cpp_client,
                                                                        tmp_path):
    sent = run(cpp_client, tmp_path, "produce", served.address, "CppT", 6)["sent"]
    assert [s["status"] for s in sent] == [0] * 6  # SEND_OK
    consumed = run(cpp_client, tmp_path, "consume", served.address, "CppT", "cpp-all", 6, "*")
    got = sorted(consumed["got"], key=lambda m: int(m["order"]))
    assert [m["body"] for m in got] == [f"body-{i}" for i in range(6)]
    assert [m["keys"] for m in got] == [f"key-{i}" for i in range(6)]
    assert [m["tags"] for m in got] == ["TagA", "TagB"] * 3
    assert all(m["topic"] == "CppT" and m["reconsume_times"] == 0 for m in got)
    # A second group with a tag filter gets only its tag.
    tagged = run(cpp_client, tmp_path, "consume", served.address, "CppT", "cpp-a", 3, "TagA")
    assert sorted(m["body"] for m in tagged["got"]) == ["body-0", "body-2", "body-4"]


def test_the_client_message_id_comes_back_to_the_consumer(served, cpp_client, tmp_path):
    (sent,) = run(cpp_client, tmp_path, "produce", served.address, "CppIdT", 1)["sent"]
    (msg,) = run(cpp_client, tmp_path, "consume", served.address, "CppIdT", "cpp-id", 1,
                 "*")["got"]
    # SendResult.msg_id is the client's UNIQ_KEY; the consumer's message id is the same.
    assert msg["id"] == sent["msg_id"] and len(sent["msg_id"]) == 32
    assert (msg["queue_id"], msg["queue_offset"]) == (msg["queue_id"], sent["offset"])


def test_send_batch_is_stored_as_the_java_broker_stores_it(served, cpp_client, tmp_path):
    r = run(cpp_client, tmp_path, "batch", served.address, "CppBatchT")
    assert r["status"] == 0
    # The client sends code 10 with batch "1", false to Java's parser: the whole batch body is
    # one message (its body holds NUL bytes, which the binding cannot hand over: read it raw).
    with Wire(served.address) as wire:
        def stored():
            bodies = []
            for q in range(4):
                pulled = wire.call(11, pull_ext("g", "CppBatchT", q, 0))
                if pulled.code == 0:
                    bodies += [m.body for m in records(pulled.body)]
            return bodies
        (body,) = wait_for(stored, what="the batch dispatched")
    assert [item.body for item in decode_batch(body, 10)] == [b"batch-0", b"batch-1"]


@pytest.fixture(scope="module")
def served_short_delays(tmp_path_factory):
    """A serve whose delay levels are 1 s, 2 s and 3 s."""
    tmp = tmp_path_factory.mktemp("served_delays")
    yaml = deployment_yaml(tmp / "deploy.yaml", tmp / "root")
    yaml.write_text(yaml.read_text().replace(
        "store: {root:", 'store: {message_delay_levels: "1s 2s 3s", root:'))
    server = Served(yaml, tmp / "serve.log")
    yield server
    server.stop()


def test_a_send_at_a_delay_level_is_consumed_once_due(served_short_delays, cpp_client,
                                                     tmp_path):
    address = served_short_delays.address
    sent = run(cpp_client, tmp_path, "delay", address, "CppDelayT", 3, 2)["sent"]
    assert [s["status"] for s in sent] == [0] * 3
    consumed = run(cpp_client, tmp_path, "consume", address, "CppDelayT", "cpp-delay", 3, "*")
    assert sorted(m["body"] for m in consumed["got"]) == [f"body-{i}" for i in range(3)]
    with Wire(address) as wire:
        kept = records(wire.call(11, pull_ext("g", "SCHEDULE_TOPIC_XXXX", 1, 0)).body or b"")
        delivered = [m for q in range(4) for m in records(
            wire.call(11, pull_ext("g", "CppDelayT", q, 0)).body or b"")]
    assert len(kept) == 3 and len(delivered) == 3  # once each
    due = {m.uniq_key: m.store_timestamp + 2_000 for m in kept}
    assert all(m.store_timestamp >= due[m.uniq_key] for m in delivered)
    assert {m.uniq_key for m in delivered} == {s["msg_id"] for s in sent}

"""The gRPC endpoint as a deployment runs it: killed with SIGKILL and restarted, stopped with
SIGTERM mid-receive, several client processes at once, a RocketMQ broker's store directory
served as it is, TLS with access keys, and ``mqstore produce|consume --server``. Every
``mqstore serve`` here is a subprocess with the default worker processes."""

from __future__ import annotations

import base64
import functools
import json
import shutil
import subprocess
import sys
import textwrap
import threading
import time
from collections import Counter
from pathlib import Path

import pytest

from cli_support import env
from mqstore.testing import wait_for
from mqstore.endpoint.wire import SYSTEM_PROPERTY_NAMES
from endpoint_support import CLIENT_REQUEST_TIMEOUT_S, Clients, Served, deployment_yaml
from paths import SUPPORT

pytestmark = pytest.mark.usefixtures("no_plugin_env")
CLIENT_PROC = SUPPORT / "endpoint_client_proc.py"


def client_env(home: Path, **extra) -> dict:
    return {**env(), "HOME": str(home), "PYTHONPATH": str(SUPPORT), **extra}


@pytest.mark.slow
def test_sigkill_between_send_and_receive_loses_nothing_acknowledged(tmp_path, home, rocketmq):
    """Sync flush: a send answered OK is on disk; acks and deliveries in flight are in the pop
    state, which a SIGKILL does not roll back."""
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store",
                           extra="flush: {policy: sync}\n")
    served = Served(yaml, tmp_path / "serve1.log", home)
    clients = Clients(rocketmq, served.endpoint)
    try:
        producer = clients.producer("Durable")
        sent = [producer.send(clients.message("Durable", b"d%02d" % i)).message_id
                for i in range(30)]
        consumer = clients.consumer("durable-group", {"Durable": rocketmq.FilterExpression()})
        acked: list = []
        while len(acked) < 10:
            batch = consumer.receive(10 - len(acked), 30)
            for m in batch:
                consumer.ack(m)
            acked += batch
        in_flight = consumer.receive(5, 1)  # popped, never acknowledged
        assert len(acked) == 10 and len(in_flight) == 5
    finally:
        clients.close()
        served.kill()  # SIGKILL to serve and its workers
    assert "store closed" not in served.log()
    assert (tmp_path / "store" / "abort").exists()

    served = Served(yaml, tmp_path / "serve2.log", home)
    clients = Clients(rocketmq, served.endpoint)
    try:
        consumer = clients.consumer("durable-group", {"Durable": rocketmq.FilterExpression()})
        rest = clients.receive_all(consumer, 20, timeout_s=30)
        extra = consumer.receive(32, 30)
    finally:
        clients.close()
        assert served.stop() == 0, served.log()
    ids = [m.message_id for m in rest]
    assert sorted(ids) == sorted(set(sent) - {m.message_id for m in acked}), served.log()
    assert extra == []
    assert {m.message_id: m.delivery_attempt for m in rest if m.delivery_attempt > 1} == {
        m.message_id: 2 for m in in_flight}
    assert "recovery" in served.log()


def test_sigterm_ends_receives_in_flight_and_closes_the_store_cleanly(tmp_path, home,
                                                                      rocketmq):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store")
    serve_home = tmp_path / "serve-home"
    serve_home.mkdir()
    served = Served(yaml, tmp_path / "serve.log", serve_home)
    clients = Clients(rocketmq, served.endpoint)
    results: list = []
    try:
        producer = clients.producer("Quiet")
        producer.send(clients.message("Quiet", b"only"))
        consumers = [clients.consumer(f"quiet-{i}", {"Quiet": rocketmq.FilterExpression()},
                                      await_s=20) for i in range(3)]
        for c in consumers:  # every group takes the one message, then waits for more
            assert [m.body for m in clients.receive_all(c, 1)] == [b"only"]

        def receive(c):
            started = time.monotonic()
            try:
                results.append((c.receive(32, 30), time.monotonic() - started))
            except Exception as exc:  # noqa: BLE001 - recorded for the assertion
                results.append((exc, time.monotonic() - started))
        threads = [threading.Thread(target=receive, args=(c,)) for c in consumers]
        for t in threads:
            t.start()
        wait_for(lambda: served.long_polls() == 3, 30, what="all three long-polling on the server")
        stopped_at = time.monotonic()
        code = served.stop()
        stop_s = time.monotonic() - stopped_at
        for t in threads:
            t.join(30)
    finally:
        clients.close()
    log = served.log()
    assert code == 0, log
    assert [r for r, _s in results] == [[], [], []], results
    assert max(s for _r, s in results) < 10, results  # not the 20 s the polls asked for
    assert stop_s < 10, log
    assert "long polls end with what they have" in log and "store closed cleanly" in log
    assert not (tmp_path / "store" / "abort").exists()
    assert list(serve_home.iterdir()) == []  # the server imports no client logging


@pytest.mark.slow
def test_four_producers_and_four_consumers_lose_nothing(tmp_path, home, rocketmq):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store")
    served = Served(yaml, tmp_path / "serve.log", home)
    stop_file = tmp_path / "stop"
    per_producer = 25
    logs = []

    def start(*args):
        out = open(tmp_path / f"proc{len(logs)}.log", "w")
        proc = subprocess.Popen([sys.executable, str(CLIENT_PROC), *args], stdout=out,
                                stderr=subprocess.STDOUT, env=client_env(home))
        logs.append((proc, out.name))
        return proc
    try:
        # The topic exists before the consumers start (a receive from an unknown topic is
        # TOPIC_NOT_FOUND): one message from here.
        clients = Clients(rocketmq, served.endpoint)
        clients.producer("Busy").send(clients.message("Busy", b"seed-0"))
        clients.close()
        consumers = [start("consume", served.endpoint, "Busy", "busy-group", "-3,-7",
                           str(stop_file)) for _ in range(4)]
        producers = [start("produce", served.endpoint, "Busy", f"p{i}", str(per_producer))
                     for i in range(4)]
        for p in producers:
            assert p.wait(120) == 0
        expected = {"seed-0"} | {f"p{i}-{j}" for i in range(4) for j in range(per_producer)}
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            acked = Counter(line.split()[1] for _p, path in logs
                            for line in Path(path).read_text().splitlines()
                            if line.startswith("acked "))
            if set(acked) >= expected:
                break
            time.sleep(0.2)
        stop_file.write_text("stop")
        for c in consumers:
            assert c.wait(60) == 0
    finally:
        stop_file.write_text("stop")
        for proc, _path in logs:
            if proc.poll() is None:
                proc.kill()
        code = served.stop()
    lines = [line.split() for _p, path in logs for line in Path(path).read_text().splitlines()]
    sent = [w[1] for w in lines if w[0] == "sent"]
    acked = Counter(w[1] for w in lines if w[0] == "acked")
    got = Counter(w[1] for w in lines if w[0] == "got")
    stale = {w[1] for w in lines if w[0] == "stale"}
    assert len(sent) == 4 * per_producer and set(sent) | {"seed-0"} == expected
    assert set(acked) == expected and max(acked.values()) == 1  # each acknowledged once
    withheld = {b for b in expected if b.endswith(("-3", "-7"))}
    duplicates = {b for b, n in got.items() if n > 1}
    assert withheld <= duplicates <= withheld | stale, (duplicates - withheld, stale)
    assert code == 0, served.log()


def test_a_rocketmq_brokers_store_is_served_as_it_is(rocketmq_dir, manifest, tmp_path, home,
                                                     rocketmq):
    yaml = deployment_yaml(tmp_path / "deploy.yaml", rocketmq_dir)
    served = Served(yaml, tmp_path / "serve.log", home)
    clients = Clients(rocketmq, served.endpoint)
    want = {}
    for m in manifest["messages"]:
        if m["topic"] in ("OrderEvents", "audit-log"):
            want[m["uniqKey"] or m["msgId"]] = m
    try:
        consumer = clients.consumer("fixture-reader", {
            "OrderEvents": rocketmq.FilterExpression(), "audit-log": rocketmq.FilterExpression()},
            await_s=1)
        got = clients.receive_all(consumer, len(want), timeout_s=60)
    finally:
        clients.close()
        assert served.stop() == 0, served.log()
    assert sorted(m.message_id for m in got) == sorted(want)
    for m in got:
        w = want[m.message_id]
        body = base64.b64decode(w["bodyUncompressed"] if w["bodyCompressed"] else w["body"])
        assert (m.topic, m.body, m.tag) == (w["topic"], body, w["tags"]), w["index"]
        assert m.keys == set((w["keys"] or "").split()), w["index"]
        # What RocketMQ's own decoder reads (a property with an empty value is dropped), less
        # its system properties.
        assert m.properties == {k: v for k, v in w["propertiesDecoded"].items()
                                if k not in SYSTEM_PROPERTY_NAMES}, w["index"]
        assert m.born_timestamp == w["bornTimestamp"], w["index"]
        assert m._Message__store_timestamp == w["storeTimestamp"], w["index"]
        assert m.born_host == w["bornHost"]["ip"], w["index"]
        assert not m.corrupted and m.delivery_attempt == 1


def test_tls_and_access_keys(tmp_path, home):
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command to make a certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt",
                    "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key), "-out",
                    str(cert), "-days", "2", "-subj", "/CN=localhost", "-addext",
                    "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True, timeout=60)
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store", server={
        "grpc_tls_cert_file": str(cert), "grpc_tls_key_file": str(key),
        "grpc_access_keys": ["app:s3cret"]})
    served = Served(yaml, tmp_path / "serve.log", home)
    script = textwrap.dedent("""
        import json, sys
        import rocketmq
        from rocketmq.v5.exception import ClientException
        endpoint, tls, secret = sys.argv[1], sys.argv[2] == "tls", sys.argv[3]
        config = rocketmq.ClientConfiguration(endpoint, rocketmq.Credentials("app", secret),
                                              request_timeout=int(sys.argv[5]))
        out = {}
        if tls:  # the route query itself, signed as the client signs every call
            import grpc
            from rocketmq.grpc_protocol import MessagingServiceStub, QueryRouteRequest, Resource
            from rocketmq.v5.util import Signature
            with open(sys.argv[4], "rb") as f:
                creds = grpc.ssl_channel_credentials(root_certificates=f.read())
            with grpc.secure_channel(endpoint, creds) as channel:
                route = MessagingServiceStub(channel).QueryRoute(
                    QueryRouteRequest(topic=Resource(name="Secure")), timeout=10,
                    metadata=Signature.metadata(config, "probe@1"))
            out["route"] = [route.status.code, route.status.message]
        producer = rocketmq.Producer(config, ("Secure",), tls_enable=tls)
        producer.startup()
        msg = rocketmq.Message(); msg.topic = "Secure"; msg.body = b"sealed"
        try:
            out["sent"] = producer.send(msg).message_id
        except Exception as exc:
            out["error"] = str(exc)
        if "sent" in out:
            consumer = rocketmq.SimpleConsumer(config, "secure-group",
                {"Secure": rocketmq.FilterExpression()}, await_duration=2, tls_enable=tls)
            consumer.startup()
            got = consumer.receive(32, 30)
            for m in got:
                consumer.ack(m)
            out["got"] = [m.body.decode() for m in got]
            consumer.shutdown()
        producer.shutdown()
        print(json.dumps(out))
    """)

    def run(tls: str, secret: str) -> dict:
        proc = subprocess.run([sys.executable, "-c", script, served.endpoint, tls, secret,
                               str(cert), str(CLIENT_REQUEST_TIMEOUT_S)],
                              env=client_env(home, GRPC_DEFAULT_SSL_ROOTS_FILE_PATH=str(cert)),
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        return json.loads(proc.stdout.splitlines()[-1])
    try:
        good = run("tls", "s3cret")
        bad = run("tls", "wrong")
        plain = run("plain", "s3cret")
    finally:
        code = served.stop()
    assert "on 127.0.0.1" in served.log() and "TLS, access keys checked" in served.log()
    assert good["got"] == ["sealed"] and good["route"][0] == 20000, good
    assert bad["route"][0] == 40100, bad  # UNAUTHORIZED
    assert "access key 'app' does not match its secret key" in bad["route"][1]
    assert "error" in bad and "sent" not in bad
    assert "error" in plain and "sent" not in plain  # a plaintext client gets nowhere
    assert code == 0, served.log()


def test_produce_and_consume_through_the_server(tmp_path, home, rocketmq, monkeypatch):
    """The commands in this process (CliRunner), the client already imported with HOME=home."""
    from click.testing import CliRunner
    from mqstore.cli import main

    # The commands leave the client's RPC deadline at its default (3 s); a loaded machine
    # may answer a route query later.
    monkeypatch.setattr(rocketmq, "ClientConfiguration", functools.partial(
        rocketmq.ClientConfiguration, request_timeout=CLIENT_REQUEST_TIMEOUT_S))

    def cli(*args, code=0):
        result = CliRunner().invoke(main, list(args))
        assert result.exit_code == code, (args, result.output, result.exception)
        return result.stdout if code == 0 else result.output
    yaml = deployment_yaml(tmp_path / "deploy.yaml", tmp_path / "store")
    served = Served(yaml, tmp_path / "serve.log", home)
    try:
        sent = json.loads(cli("produce", "--server", served.endpoint, "-t", "Cli", "first",
                              "second", "--tags", "A", "--keys", "k1", "-p", "region=eu",
                              "--json"))
        assert sent["count"] == 2 and sent["topic"] == "Cli"
        got = [json.loads(line) for line in cli(
            "consume", "--server", served.endpoint, "-t", "Cli", "-g", "cli-group", "-n", "2",
            "--json").splitlines()]
        again = cli("consume", "--server", served.endpoint, "-t", "Cli", "-g", "cli-group",
                    "--json")
        refused = cli("consume", "--server", served.endpoint, "-t", "Cli", "-g", "g",
                      "--from", "first", code=2)
        down = cli("produce", "--server", "127.0.0.1:1", "-t", "Cli", "x", code=1)
    finally:
        code = served.stop()
    assert sorted(g["body"] for g in got) == ["first", "second"]
    assert sorted(g["msg_id"] for g in got) == sorted(m["msg_id"] for m in sent["messages"])
    assert all(g["tags"] == "A" and g["keys"] == ["k1"] and g["properties"] == {"region": "eu"}
               and g["delivery_attempt"] == 1 for g in got)
    assert again == ""  # acknowledged: the group has nothing left
    assert "--from" in refused and "--server" in refused
    assert "127.0.0.1:1: send failed" in down
    assert code == 0, served.log()

"""The operator's kit against a running deployment: the gRPC endpoint's RPC metrics as the
official client drives them, and every metric the shipped Grafana dashboard
(``config/grafana/``) and Prometheus rules (``config/prometheus/``) name found in ``/metrics``
of a master ``mqstore serve`` with its endpoint and a slave; the rules checked and unit-tested
by promtool, the systemd unit (``config/systemd/``) verified by systemd-analyze.

promtool and systemd-analyze come from Debian's packages (``make tools``, which ``make test``
runs): without them these checks skip, naming the reason, except under CI, where they fail.
"""

from __future__ import annotations

import configparser
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import grpc
import promql_parser as promql
import pytest
import yaml

from mqstore import load_config
from mqstore.ops.http_server import FD_HEADROOM
from mqstore.testing import wait_for
from cli_support import SMALL_CONFIG
from endpoint_support import Clients, Served, client_module, deployment_yaml
from paths import REPO
from serve_support import STOP_TIMEOUT_S, scrape, start

pytestmark = [pytest.mark.usefixtures("no_plugin_env"), pytest.mark.slow]

DASHBOARD = REPO / "config" / "grafana" / "mqstore-dashboard.json"
RULES = REPO / "config" / "prometheus" / "mqstore-alerts.yml"
RULE_TESTS = REPO / "config" / "prometheus" / "mqstore-alerts.test.yml"
UNIT = REPO / "config" / "systemd" / "mqstore.service"
MESSAGING = "apache.rocketmq.v2.MessagingService"
ADMIN = "mqstore.admin.v1.Admin"
# Series the rules may name that Prometheus makes itself, not serve.
PROMETHEUS_OWN = {"up"}
# What Grafana puts in for its variables before a query reaches Prometheus.
GRAFANA_VARIABLES = {"$__rate_interval": "5m", "$instance": ".*"}


def tool(name: str, local: Path | None = None) -> str:
    found = shutil.which(name) or (str(local) if local is not None and local.exists() else None)
    if found is None:
        why = f"{name} is not installed (`make tools` installs it from Debian's packages)"
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    return found


def metric_names(expression: str) -> set[str]:
    """The metric names a PromQL expression selects."""
    names: set[str] = set()

    def visit(node):
        if isinstance(node, promql.VectorSelector):
            names.add(node.name or next(m.value for m in node.matchers.matchers
                                        if m.name == "__name__"))
    promql.walk(promql.parse(expression), visit)
    return names


def dashboard_expressions() -> list[str]:
    """Every query of the dashboard, Grafana's variables put in as Grafana would."""
    board = json.loads(DASHBOARD.read_text())
    panels = [p for top in board["panels"] for p in [top, *top.get("panels", [])]]
    exprs = [t["expr"] for p in panels for t in p.get("targets", [])]
    for variable in board["templating"]["list"]:
        if variable["type"] == "query":  # label_values(SELECTOR, LABEL)
            exprs.append(re.fullmatch(r"label_values\((.+), *\w+\)",
                                      variable["query"]["query"])[1])
    out = []
    for expr in exprs:
        for name, value in GRAFANA_VARIABLES.items():
            expr = expr.replace(name, value)
        out.append(expr)
    return out


def rule_expressions() -> list[str]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule["expr"] for group in groups for rule in group["rules"]]


# -- a master serving gRPC with a slave, driven by the official client -------------------------
@pytest.fixture(scope="module")
def deployment(tmp_path_factory):
    """A master ``serve`` (gRPC endpoint, replication port) and a slave following it; the
    official client's traffic run once; their ``/metrics`` scraped at the end."""
    base = tmp_path_factory.mktemp("opskit")
    home = base / "home"
    home.mkdir()
    rocketmq = client_module(home)
    yaml_path = deployment_yaml(base / "master.yaml", base / "master",
                                server={"ha_listen": "127.0.0.1:0"})
    master = Served(yaml_path, base / "master.log", home)
    slave = None
    try:
        ha = re.search(r"master listening for slaves on ([\d.]+:\d+)", master.log())[1]
        slave_yaml = base / "slave.yaml"
        slave_yaml.write_text(
            SMALL_CONFIG + f"store: {json.dumps({'root': str(base / 'slave'), 'role': 'slave'})}\n"
            f"server: {json.dumps({'metrics_listen': '127.0.0.1:0', 'ha_master': ha})}\n")
        slave, slave_url = start(slave_yaml, base / "slave.log")
        master_url = re.search(r"serving metrics on (http://[\d.:]+)/metrics", master.log())[1]
        traffic = _traffic(rocketmq, master, master_url)
        wait_for(lambda: scrape(master_url).get(("mqstore_replication_slaves", ())) == 1,
                 60, what="the slave connected")
        wait_for(lambda: scrape(slave_url).get(("mqstore_replication_master_connected", ()))
                 == 1, 60, what="the slave's master connection")
        yield {"master": scrape(master_url), "slave": scrape(slave_url), **traffic}
    finally:
        if slave is not None:
            os.killpg(slave.pid, signal.SIGTERM)
            assert slave.wait(STOP_TIMEOUT_S) == 0, (base / "slave.log").read_text()
        assert master.stop() == 0, master.log()


def _traffic(rocketmq, master: Served, url: str) -> dict:
    """Sends, receives, a redelivery, a stale ack, a long poll, refusals: what the metrics
    count."""
    clients = Clients(rocketmq, master.endpoint)
    try:
        producer = clients.producer("Metered")
        for i in range(3):
            producer.send(clients.message("Metered", b"m%d" % i))
        consumer = clients.consumer("metered-group", {"Metered": rocketmq.FilterExpression()},
                                    await_s=2)
        first = clients.receive_all(consumer, 3, invisible_s=1, ack=False)
        again = clients.receive_all(consumer, 3, ack=True)  # each back with attempt 2
        from rocketmq.v5.exception import BadRequestException
        with pytest.raises(BadRequestException):
            consumer.ack(first[0])  # a stale handle: INVALID_RECEIPT_HANDLE
        polls_seen = _long_poll_seen(clients, rocketmq, url)
    finally:
        clients.close()
    with grpc.insecure_channel(master.endpoint) as channel:
        for path in (f"/{MESSAGING}/RecallMessage", f"/{MESSAGING}/NoSuchMethod"):
            with pytest.raises(grpc.RpcError) as refused:
                channel.unary_unary(path)(b"", timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED
        topics = json.loads(channel.unary_unary(f"/{ADMIN}/ListTopics")(b"{}", timeout=10))
        channel.unary_unary(f"/{ADMIN}/ResetOffset")(json.dumps({
            "group": "lagging-group", "topic": "Metered", "offset": 0}).encode(), timeout=10)
    return {"first": first, "again": again, "polls_seen": polls_seen, "topics": topics}


def _long_poll_seen(clients, rocketmq, url: str) -> float:
    """``mqstore_rpc_long_polls`` while a receive of the group that acknowledged everything
    waits."""
    waiting = clients.consumer("metered-group", {"Metered": rocketmq.FilterExpression()},
                               await_s=8)
    receiver = threading.Thread(target=waiting.receive, args=(32, 30))
    receiver.start()
    try:
        return wait_for(lambda: scrape(url).get(("mqstore_rpc_long_polls",
                                                 (("protocol", "grpc"),))), 20,
                        what="a long poll counted")
    finally:
        receiver.join(30)


def rpc(metrics: dict, name: str, method: str, service: str = MESSAGING, **labels) -> float:
    key = (name, tuple(sorted({"protocol": "grpc", "service": service, "method": method,
                               **labels}.items())))
    return metrics.get(key, 0.0)


def test_rpcs_are_counted_by_method_code_and_time(deployment):
    m = deployment["master"]
    assert rpc(m, "mqstore_rpc_requests_total", "SendMessage") == 3
    assert rpc(m, "mqstore_rpc_duration_seconds_count", "SendMessage") == 3
    assert rpc(m, "mqstore_rpc_duration_seconds_bucket", "SendMessage", le="+Inf") == 3
    assert rpc(m, "mqstore_rpc_duration_seconds_sum", "SendMessage") > 0
    assert rpc(m, "mqstore_rpc_in_flight_requests", "SendMessage") == 0
    # Refusals by their code; an empty receive (MESSAGE_NOT_FOUND) is no error.
    assert rpc(m, "mqstore_rpc_errors_total", "AckMessage", code="INVALID_RECEIPT_HANDLE") == 1
    assert rpc(m, "mqstore_rpc_errors_total", "RecallMessage", code="UNIMPLEMENTED") == 1
    assert rpc(m, "mqstore_rpc_requests_total", "ListTopics", service=ADMIN) == 1
    assert rpc(m, "mqstore_rpc_requests_total", "ResetOffset", service=ADMIN) == 1
    errors = {labels for (name, labels) in m if name == "mqstore_rpc_errors_total"}
    assert {dict(labels)["code"] for labels in errors} == {"INVALID_RECEIPT_HANDLE",
                                                           "UNIMPLEMENTED"}, errors
    # A method the endpoint does not serve adds no label value.
    assert not [key for key in m if ("method", "NoSuchMethod") in key[1]]
    assert rpc(m, "mqstore_rpc_requests_total", "ReceiveMessage") >= 3
    assert deployment["polls_seen"] == 1


def test_deliveries_redeliveries_and_dead_letters_by_group(deployment):
    m = deployment["master"]
    assert [x.delivery_attempt for x in deployment["first"]] == [1, 1, 1]
    assert [x.delivery_attempt for x in deployment["again"]] == [2, 2, 2]
    group = (("group", "metered-group"), ("protocol", "grpc"))
    assert m[("mqstore_consumer_deliveries_total", group)] == 6
    assert m[("mqstore_consumer_redeliveries_total", group)] == 3
    assert m[("mqstore_consumer_dead_letters_total", (("group", "metered-group"),))] == 0


def test_histogram_buckets_are_cumulative(deployment):
    m = deployment["master"]
    bounds = sorted(((float(dict(labels)["le"]), v) for (name, labels), v in m.items()
                     if name == "mqstore_rpc_duration_seconds_bucket"
                     and ("method", "SendMessage") in labels))
    assert len(bounds) == 17 and bounds[-1] == (float("inf"), 3)
    counts = [v for _le, v in bounds]
    assert counts == sorted(counts)


def test_every_metric_the_dashboard_and_the_rules_name_is_served(deployment):
    served = {name for name, _labels in deployment["master"]} | \
             {name for name, _labels in deployment["slave"]}
    named_by_board = set().union(*map(metric_names, dashboard_expressions()))
    named_by_rules = set().union(*map(metric_names, rule_expressions()))
    assert sorted(named_by_board - served) == []
    assert sorted(named_by_rules - served - PROMETHEUS_OWN) == []
    # And the dashboard shows every family serve exposes but the per-queue offsets.
    families = {re.sub(r"_(bucket|sum|count)$", "", name) for name in served}
    shown = {re.sub(r"_(bucket|sum|count)$", "", name) for name in named_by_board}
    assert sorted(families - shown) == ["mqstore_flushed_offset_bytes",
                                        "mqstore_queue_max_offset", "mqstore_queue_min_offset"]


def test_every_served_metric_is_in_the_operations_guide(deployment):
    guide = (REPO / "docs" / "operations.md").read_text()
    served = {name for scrape_ in (deployment["master"], deployment["slave"])
              for name, _labels in scrape_}
    assert sorted(name for name in served if f"`{name}`" not in guide) == []


def test_promtool_accepts_the_rules_and_their_unit_tests_pass():
    promtool = tool("promtool", REPO / ".tools" / "usr" / "bin" / "promtool")
    for args in (["check", "rules", str(RULES)], ["test", "rules", str(RULE_TESTS)]):
        done = subprocess.run([promtool, *args], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stdout + done.stderr
        assert "SUCCESS" in done.stdout, done.stdout


def test_systemd_accepts_the_unit(tmp_path):
    analyze = tool("systemd-analyze")
    # The unit as installed, with its ExecStart pointed at this checkout's command (verify
    # needs the program to exist).
    unit = tmp_path / "mqstore.service"
    command = Path(sys.executable).parent / "mqstore"
    unit.write_text(UNIT.read_text().replace("/opt/mqstore/bin/mqstore", str(command)))
    done = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True,
                          timeout=60)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_the_unit_stops_with_sigterm_restarts_on_failure_and_has_descriptors_for_the_caps():
    parser = configparser.ConfigParser(interpolation=None, strict=False)
    parser.optionxform = str
    parser.read_string(UNIT.read_text())
    service = parser["Service"]
    server = load_config().server
    assert service["ExecStart"].split()[1:] == ["serve", "-c", "/etc/mqstore/mqstore.yaml"]
    assert (service["KillSignal"], service["Restart"]) == ("SIGTERM", "on-failure")
    assert service["ExecReload"] == "/bin/kill -HUP $MAINPID"
    # The default caps' connections with as much again seven times over for the store's files.
    assert int(service["LimitNOFILE"]) >= (server.grpc_max_connections + server.max_connections
                                           + FD_HEADROOM) * 8

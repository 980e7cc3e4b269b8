"""RocketMQ 4.9.8's own tools (``mqadmin``) and NameServer against ``mqstore serve``: run only
when ``MQSTORE_ROCKETMQ_CLASSPATH`` holds the classpath of RocketMQ 4.9.8's NameServer, tools,
client and their dependencies (docs/remoting.md, "Clients verified";
``tests/support/java/build_rocketmq_java.sh`` builds one from the sources).

``mqadmin`` sends with its producer, pulls with its pull consumer, and reads topics, routes,
clusters, broker status, consumer progress and messages by key and id, first from ``serve``
answering as its own NameServer, then through a real NameServer (``NamesrvStartup``) that
``serve`` registers with (``server.namesrv_addr``), as a master and as its slave."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess

import pytest

from mqstore.format import remoting_json
from mqstore.testing import wait_for

from failover_support import free_ports
from remoting_support import Served, Wire, deployment_yaml

CLASSPATH = os.environ.get("MQSTORE_ROCKETMQ_CLASSPATH")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    not CLASSPATH, reason="MQSTORE_ROCKETMQ_CLASSPATH does not point at RocketMQ 4.9.8's jars")]
LOGBACK = """<configuration><root level="OFF"/></configuration>\n"""


@pytest.fixture(scope="module")
def java_served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("java")
    yaml = deployment_yaml(tmp / "deploy.yaml", tmp / "root")
    served = Served(yaml, tmp / "serve.log")
    yield served
    served.stop()


def mqadmin(tmp_path, *args, check: bool = True) -> str:
    home = tmp_path / "rocketmq-home"
    (home / "conf").mkdir(parents=True, exist_ok=True)
    (home / "conf" / "logback_tools.xml").write_text(LOGBACK)
    out = subprocess.run(["java", "-cp", CLASSPATH, f"-Drocketmq.client.logRoot={tmp_path}",
                          "org.apache.rocketmq.tools.command.MQAdminStartup", *args],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ROCKETMQ_HOME": str(home)})
    assert out.returncode == 0 or not check, out.stdout + out.stderr
    return out.stdout


def test_mqadmin_sends_pulls_and_reads_the_broker(java_served, tmp_path):
    ns = ["-n", java_served.address]
    sent = mqadmin(tmp_path, "sendMessage", *ns, "-t", "JavaT", "-p", "from java", "-k",
                   "jkey", "-c", "jtag")
    assert "SEND_OK" in sent
    assert "JavaT" in mqadmin(tmp_path, "topicList", *ns).split()
    cluster = mqadmin(tmp_path, "clusterList", *ns)
    assert re.search(r"DefaultCluster\s+mqstore\s+0\s+" + re.escape(java_served.address), cluster)
    status = mqadmin(tmp_path, "topicStatus", *ns, "-t", "JavaT")
    assert re.search(r"mqstore\s+\d\s+0\s+1\s", status)
    created = mqadmin(tmp_path, "updateTopic", *ns, "-b", java_served.address, "-t", "JavaNew",
                      "-r", "3", "-w", "3")
    assert "success" in created
    assert '"readQueueNums":3' in mqadmin(tmp_path, "topicRoute", *ns, "-t", "JavaNew")
    found = mqadmin(tmp_path, "queryMsgByKey", *ns, "-t", "JavaT", "-k", "jkey")
    (msg_id,) = re.findall(r"^([0-9A-F]{32,})\s", found, flags=re.M)
    by_unique = mqadmin(tmp_path, "queryMsgByUniqueKey", *ns, "-t", "JavaT", "-i", msg_id)
    assert "Keys:                [jkey]" in by_unique and "Tags:                [jtag]" in by_unique
    queue = re.search(r"Queue ID:\s+(\d+)", by_unique).group(1)
    pulled = mqadmin(tmp_path, "consumeMessage", *ns, "-t", "JavaT", "-b", "mqstore", "-i",
                     queue, "-o", "0", "-c", "1")
    assert "BODY: from java" in pulled
    info = mqadmin(tmp_path, "brokerStatus", *ns, "-b", java_served.address)
    assert re.search(r"brokerVersionDesc\s+: V4_9_8", info)


NAMESRV_LOGBACK = """<configuration>
  <appender name="F" class="ch.qos.logback.core.FileAppender">
    <file>{log}</file><encoder><pattern>%d %p %c %m%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="F"/></root>
</configuration>
"""


class JavaNameServer:
    """RocketMQ 4.9.8's NameServer on a free port (dialled at 127.0.0.1; 4.9.8 has no option
    to bind one interface only), its ROCKETMQ_HOME, config, KV store and logs (``log``: its
    route manager's lines) under ``home``."""

    def __init__(self, home, port: int | None = None) -> None:
        (home / "conf").mkdir(parents=True)
        self.log_path = home / "logs" / "namesrv.log"
        (home / "conf" / "logback_namesrv.xml").write_text(
            NAMESRV_LOGBACK.format(log=self.log_path))
        (port,) = free_ports(1) if port is None else (port,)
        self.port = port
        self.address = f"127.0.0.1:{port}"
        conf = home / "namesrv.properties"
        conf.write_text(f"listenPort={port}\nkvConfigPath={home / 'kvConfig.json'}\n")
        self.out_path = home / "stdout.log"
        with open(self.out_path, "w") as out:
            self.proc = subprocess.Popen(
                ["java", "-Xmx256m", "-cp", CLASSPATH, f"-Duser.home={home}",
                 "-Dtls.server.mode=disabled",
                 "org.apache.rocketmq.namesrv.NamesrvStartup", "-c", str(conf)],
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                env={**os.environ, "ROCKETMQ_HOME": str(home)})
        wait_for(lambda: self.proc.poll() is not None or "boot success" in self.output(),
                 timeout=120, what="the NameServer's start")
        assert self.proc.poll() is None, self.output()

    def output(self) -> str:
        return self.out_path.read_text()

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(60)


@pytest.fixture(scope="module")
def java_namesrv(tmp_path_factory):
    namesrv = JavaNameServer(tmp_path_factory.mktemp("namesrv") / "home")
    yield namesrv
    namesrv.stop()


def registered_serve(tmp_path, namesrv: JavaNameServer, name: str, cluster: str,
                     server: dict | None = None, role: str | None = None) -> Served:
    label = f"{name}-{role or 'master'}"
    yaml = deployment_yaml(tmp_path / f"{label}.yaml", tmp_path / label, {
        "namesrv_addr": namesrv.address, "remoting_broker_name": name,
        "remoting_cluster": cluster, **(server or {})})
    if role is not None:
        yaml.write_text(yaml.read_text().replace("store: {root:", f"store: {{role: {role}, root:"))
    return Served(yaml, tmp_path / f"{label}.log")


def cluster_rows(tmp_path, namesrv: JavaNameServer, cluster: str) -> list[tuple[str, str, str]]:
    """(broker name, id, address) of each line of ``clusterList`` for ``cluster``."""
    out = mqadmin(tmp_path, "clusterList", "-n", namesrv.address, check=False)
    return re.findall(r"^" + re.escape(cluster) + r"\s+(\S+)\s+(\d+)\s+([\d.]+:\d+)\s", out,
                      flags=re.M)


def route(tmp_path, namesrv: JavaNameServer, topic: str) -> dict:
    """``topicRoute`` through the NameServer: {broker name: {"addrs": {id: address},
    "queues": (read, write, perm)}}, {} while it knows no route."""
    out = mqadmin(tmp_path, "topicRoute", "-n", namesrv.address, "-t", topic, check=False)
    if '"queueDatas"' not in out:
        return {}
    doc = remoting_json.loads(out[out.index("{"):].encode())
    queues = {q["brokerName"]: (q["readQueueNums"], q["writeQueueNums"], q["perm"])
              for q in doc["queueDatas"]}
    return {b["brokerName"]: {"addrs": b["brokerAddrs"], "queues": queues[b["brokerName"]]}
            for b in doc["brokerDatas"]}


def heartbeat_body(group: str, topic: str) -> bytes:
    """HEART_BEAT's body as the Java client sends it: one consumer of ``group`` on ``topic``."""
    return json.dumps({"clientID": "127.0.0.1@jtest", "consumerDataSet": [{
        "groupName": group, "consumeType": "CONSUME_PASSIVELY", "messageModel": "CLUSTERING",
        "consumeFromWhere": "CONSUME_FROM_LAST_OFFSET", "subscriptionDataSet": [{
            "topic": topic, "subString": "*", "subVersion": 1, "expressionType": "TAG"}]}],
        "producerDataSet": []}).encode()


def test_serve_registers_with_a_java_namesrv_and_clients_route_through_it(
        java_namesrv, tmp_path):
    ns = ["-n", java_namesrv.address]
    served = registered_serve(tmp_path, java_namesrv, "jbroker-a", "JClusterA",
                              {"ha_listen": "127.0.0.1:0"})
    try:
        rows = wait_for(lambda: cluster_rows(tmp_path, java_namesrv, "JClusterA"),
                        what="the broker in the NameServer's cluster list")
        assert rows == [("jbroker-a", "0", served.address)]
        ha = served.wait_for(r"master listening for slaves on ([\d.]+:\d+)")
        assert f"new broker registered, {served.address} HAServer: {ha}" in java_namesrv.log()
        # TBW102 came with the first registration: its route names this broker's queues.
        assert route(tmp_path, java_namesrv, "TBW102")["jbroker-a"]["addrs"] == {
            0: served.address}
        # A topic created on serve after its start is routed soon (registration after a change).
        created = mqadmin(tmp_path, "updateTopic", *ns, "-b", served.address, "-t", "JRouted",
                          "-r", "3", "-w", "3")
        assert "success" in created
        routed = wait_for(lambda: route(tmp_path, java_namesrv, "JRouted"),
                          what="JRouted in the NameServer's route")
        assert routed == {"jbroker-a": {"addrs": {0: served.address}, "queues": (3, 3, 6)}}
        sent = mqadmin(tmp_path, "sendMessage", *ns, "-t", "JRouted", "-p", "via namesrv",
                       "-k", "nkey")
        assert "SEND_OK" in sent and "jbroker-a" in sent
        queue_id = re.search(r"^jbroker-a\s+(\d+)\s+SEND_OK", sent, flags=re.M).group(1)
        pulled = mqadmin(tmp_path, "consumeMessage", *ns, "-t", "JRouted", "-b", "jbroker-a",
                         "-i", queue_id, "-o", "0", "-c", "1")
        assert "BODY: via namesrv" in pulled
        # A topic the producer only finds through TBW102's route: serve creates it at the
        # first send and registers it (oneway) at once.
        assert "SEND_OK" in mqadmin(tmp_path, "sendMessage", *ns, "-t", "JAuto", "-p", "auto")
        auto = wait_for(lambda: route(tmp_path, java_namesrv, "JAuto"),
                        what="JAuto in the NameServer's route")
        assert auto["jbroker-a"]["addrs"] == {0: served.address}
        # A consumer's heartbeat creates its group's retry topic: routed too, so mqadmin finds
        # the group's progress through the NameServer.
        with Wire(served.address) as wire:
            assert wire.call(34, {}, heartbeat_body("JGroup", "JRouted")).code == 0
            assert wire.call(15, {"consumerGroup": "JGroup", "topic": "JRouted",
                                  "queueId": queue_id, "commitOffset": 1}).code == 0
        retry = wait_for(lambda: route(tmp_path, java_namesrv, "%RETRY%JGroup"),
                         what="%RETRY%JGroup in the NameServer's route")
        assert retry["jbroker-a"]["addrs"] == {0: served.address}
        progress = mqadmin(tmp_path, "consumerProgress", *ns, "-g", "JGroup")
        assert re.search(rf"^JRouted\s+jbroker-a\s+{queue_id}\s+1\s+1\s", progress, flags=re.M)
        assert "Diff Total: 0" in progress
        status = mqadmin(tmp_path, "topicStatus", *ns, "-t", "JRouted")
        assert len(re.findall(r"^jbroker-a\s+\d\s", status, flags=re.M)) == 3
        assert served.stop() == 0
        wait_for(lambda: cluster_rows(tmp_path, java_namesrv, "JClusterA") == [],
                 what="the broker gone from the NameServer's cluster list")
        assert route(tmp_path, java_namesrv, "JRouted") == {}
        # UNREGISTER_BROKER removed it (not only the closed connection), every registration
        # passed the NameServer's body CRC check.
        log = java_namesrv.log()
        assert f"unregisterBroker, remove addr from brokerAddrTable OK, {served.address}" in log
        assert "crc32 not match" not in log
    finally:
        served.kill()


def test_a_slave_serve_registers_as_broker_id_1_with_its_ha_address(java_namesrv, tmp_path):
    master = registered_serve(tmp_path, java_namesrv, "jbroker-b", "JClusterB",
                              {"ha_listen": "127.0.0.1:0"})
    slave = None
    try:
        ha = master.wait_for(r"master listening for slaves on ([\d.]+:\d+)")
        (port,) = free_ports(1)
        own = f"127.0.0.1:{port}"
        slave = registered_serve(tmp_path, java_namesrv, "jbroker-b", "JClusterB",
                                 {"ha_master": ha, "ha_listen": own}, role="slave")
        rows = wait_for(lambda: len(cluster_rows(tmp_path, java_namesrv, "JClusterB")) == 2
                        and cluster_rows(tmp_path, java_namesrv, "JClusterB"),
                        what="master and slave in the NameServer's cluster list")
        assert sorted(rows) == [("jbroker-b", "0", master.address),
                                ("jbroker-b", "1", slave.address)]
        log = java_namesrv.log()
        assert f"new broker registered, {master.address} HAServer: {ha}" in log
        assert f"new broker registered, {slave.address} HAServer: {own}" in log
        # The NameServer answered the slave's registration with its master's address.
        assert slave.wait_for(r"master of jbroker-b is ([\d.]+:\d+)") == master.address
        assert route(tmp_path, java_namesrv, "TBW102")["jbroker-b"]["addrs"] == {
            0: master.address, 1: slave.address}
        assert slave.stop() == 0
        wait_for(lambda: cluster_rows(tmp_path, java_namesrv, "JClusterB")
                 == [("jbroker-b", "0", master.address)], what="the slave gone, the master left")
        assert (f"unregisterBroker, remove addr from brokerAddrTable OK, {slave.address}"
                in java_namesrv.log())
    finally:
        if slave is not None:
            slave.kill()
        master.kill()


def test_serve_registers_again_with_a_restarted_namesrv(tmp_path):
    """A restarted NameServer knows no broker until the broker's next periodic registration
    (10 s after start, then every 30 s), which reopens the connection the restart closed."""
    namesrv = JavaNameServer(tmp_path / "ns-first")
    served = None
    try:
        served = registered_serve(tmp_path, namesrv, "jbroker-c", "JClusterC")
        row = [("jbroker-c", "0", served.address)]
        wait_for(lambda: cluster_rows(tmp_path, namesrv, "JClusterC") == row,
                 what="the broker in the first NameServer's cluster list")
        namesrv.stop()
        namesrv = JavaNameServer(tmp_path / "ns-again", port=namesrv.port)
        wait_for(lambda: cluster_rows(tmp_path, namesrv, "JClusterC") == row, timeout=60,
                 interval=0.5, what="the broker in the restarted NameServer's cluster list")
    finally:
        if served is not None:
            served.kill()
        namesrv.stop()


def test_serve_registers_with_each_of_two_java_namesrvs(java_namesrv, tmp_path):
    other = JavaNameServer(tmp_path / "ns-other")
    served = None
    try:
        served = registered_serve(tmp_path, java_namesrv, "jbroker-d", "JClusterD",
                                  {"namesrv_addr": f"{java_namesrv.address};{other.address}"})
        row = [("jbroker-d", "0", served.address)]
        for namesrv in (java_namesrv, other):
            wait_for(lambda: cluster_rows(tmp_path, namesrv, "JClusterD") == row,
                     what=f"the broker in {namesrv.address}'s cluster list")
        assert served.stop() == 0
        for namesrv in (java_namesrv, other):
            assert cluster_rows(tmp_path, namesrv, "JClusterD") == []
            assert (f"unregisterBroker, remove addr from brokerAddrTable OK, {served.address}"
                    in namesrv.log())
    finally:
        if served is not None:
            served.kill()
        other.stop()

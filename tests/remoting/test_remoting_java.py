"""RocketMQ 4.9.8's own tools (``mqadmin``) against ``mqstore serve``: run only when
``MQSTORE_ROCKETMQ_CLASSPATH`` holds the classpath of RocketMQ 4.9.8's tools, client and their
dependencies (docs/remoting.md, "Clients verified": no Java build is part of this repository).

``mqadmin`` sends with its producer, pulls with its pull consumer, and reads topics, routes,
clusters, broker status, consumer progress and messages by key and id."""

from __future__ import annotations

import os
import re
import subprocess

import pytest

from remoting_support import Served, deployment_yaml

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


def mqadmin(tmp_path, *args) -> str:
    home = tmp_path / "rocketmq-home"
    (home / "conf").mkdir(parents=True, exist_ok=True)
    (home / "conf" / "logback_tools.xml").write_text(LOGBACK)
    out = subprocess.run(["java", "-cp", CLASSPATH, f"-Drocketmq.client.logRoot={tmp_path}",
                          "org.apache.rocketmq.tools.command.MQAdminStartup", *args],
                         capture_output=True, text=True, timeout=120,
                         env={**os.environ, "ROCKETMQ_HOME": str(home)})
    assert out.returncode == 0, out.stdout + out.stderr
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

"""A master and its slave (RocketMQ's HA protocol), both serving remoting: the slave serves
pulls of what it replicated with ``server.remoting_slave_read_enable``, and sends it refuses;
without it a pull is told to go to the master (PULL_RETRY_IMMEDIATELY, broker id 0)."""

from __future__ import annotations

import pytest

from mqstore.testing import wait_for

from remoting_support import Served, Wire, deployment_yaml, pull_ext, records, send_ext

pytestmark = pytest.mark.slow


def slave_yaml(path, root, master_ha: str, read: bool):
    yaml = deployment_yaml(path, root, {"ha_master": master_ha,
                                        "remoting_slave_read_enable": read})
    yaml.write_text(yaml.read_text().replace("store: {root:", "store: {role: slave, root:"))
    return yaml


def test_a_slave_serves_pulls_of_what_it_replicated(tmp_path):
    master = Served(deployment_yaml(tmp_path / "m.yaml", tmp_path / "master",
                                    {"ha_listen": "127.0.0.1:0"}), tmp_path / "master.log")
    servers = [master]
    try:
        ha = master.wait_for(r"master listening for slaves on ([\d.]+:\d+)")
        slave = Served(slave_yaml(tmp_path / "s.yaml", tmp_path / "slave", ha, True),
                       tmp_path / "slave.log")
        servers.append(slave)
        closed = Served(slave_yaml(tmp_path / "s2.yaml", tmp_path / "slave2", ha, False),
                        tmp_path / "slave2.log")
        servers.append(closed)
        with Wire(master.address) as m:
            for i in range(3):
                assert m.call(10, send_ext("RepT", 0), b"r%d" % i).code == 0
        with Wire(slave.address) as s:
            def pulled():
                r = s.call(11, pull_ext("g", "RepT", 0, 0))
                return r if r.code == 0 and len(records(r.body)) == 3 else None
            r = wait_for(pulled, timeout=60, what="the slave serving the replicated messages")
            assert [m.body for m in records(r.body)] == [b"r0", b"r1", b"r2"]
            assert r.ext["suggestWhichBrokerId"] == "0" and r.ext["maxOffset"] == "3"
            r = s.call(10, send_ext("RepT", 0), b"no")
            assert r.code == 14 and "slave" in r.remark
            # A pull's commit offset is not stored on a slave.
            s.call(11, pull_ext("g2", "RepT", 0, 0, sysflag=5, commitOffset=2))
            assert s.call(14, {"consumerGroup": "g2", "topic": "RepT", "queueId": 0}).ext[
                "offset"] == "0"
        with Wire(closed.address) as c:
            wait_for(lambda: c.call(30, {"topic": "RepT", "queueId": 0}).ext["offset"] == "3",
                     timeout=60, what="the second slave replicating")
            r = c.call(11, pull_ext("g", "RepT", 0, 0))
            assert r.code == 20 and r.ext["suggestWhichBrokerId"] == "0" and not r.body
    finally:
        for server in reversed(servers):
            server.stop()


def test_a_promoted_slave_takes_sends_as_broker_0(tmp_path):
    import json as jsonlib

    from cli_support import mqstore
    master = Served(deployment_yaml(tmp_path / "m.yaml", tmp_path / "master",
                                    {"ha_listen": "127.0.0.1:0"}), tmp_path / "master.log")
    servers = [master]
    try:
        ha = master.wait_for(r"master listening for slaves on ([\d.]+:\d+)")
        yaml = slave_yaml(tmp_path / "s.yaml", tmp_path / "slave", ha, True)
        yaml.write_text(yaml.read_text().replace('"remoting_listen"',
                                                 '"grpc_listen": "127.0.0.1:0", "remoting_listen"'))
        slave = Served(yaml, tmp_path / "slave.log")
        servers.append(slave)
        grpc = slave.wait_for(r"serving gRPC \S+ on ([\d.]+:\d+)")
        with Wire(master.address) as m:
            assert m.call(10, send_ext("RepT", 0), b"r0").code == 0
        with Wire(slave.address) as s:
            wait_for(lambda: s.call(30, {"topic": "RepT", "queueId": 0}).ext["offset"] == "1",
                     timeout=60, what="the slave replicating")
            refused = s.call(10, send_ext("RepT", 0), b"no")
            assert refused.code == 14 and "slave" in refused.remark
            master.stop()
            servers.remove(master)
            promoted = jsonlib.loads(mqstore("role", "promote", "--server", grpc, "--force",
                                             "--json").stdout)
            assert promoted["role"] == "async_master"
            r = s.call(10, send_ext("RepT", 0), b"r1")
            assert r.code == 0, r.remark
            wait_for(lambda: s.call(30, {"topic": "RepT", "queueId": 0}).ext["offset"] == "2",
                     timeout=60, what="the send dispatched")
            r = s.call(11, pull_ext("g", "RepT", 0, 0))
            assert [m.body for m in records(r.body)] == [b"r0", b"r1"]
            assert r.ext["suggestWhichBrokerId"] == "0"
    finally:
        for server in reversed(servers):
            server.stop()

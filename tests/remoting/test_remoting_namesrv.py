"""``mqstore serve`` registering with RocketMQ NameServers (``server.namesrv_addr``), checked
field by field by a frame-level fake NameServer that answers as a 4.9.8 NameServer does."""

from __future__ import annotations

import logging
import socket
import threading
import time

import pytest

from mqstore.format import remoting_frame as rf
from mqstore.format import remoting_json as fj
from mqstore.hashing import crc32
from mqstore.testing import wait_for

from remoting_support import Served, Wire, deployment_yaml, send_ext

pytestmark = pytest.mark.slow


class FakeNameServer:
    """Accepts brokers, records every frame, answers REGISTER_BROKER (as a master's, or a
    slave's with the master's addresses) and UNREGISTER_BROKER with SUCCESS."""

    def __init__(self, unregister_delay_s: float = 0.0, tell: threading.Event | None = None,
                 hold: threading.Event | None = None) -> None:
        """``tell``: set when a REGISTER_BROKER arrives; ``hold``: awaited (20 s at most)
        before answering one."""
        self.unregister_delay_s = unregister_delay_s
        self.tell, self.hold = tell, hold
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.frames: list[rf.Command] = []
        self.connections = 0
        self._lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self._lock:
                self.connections += 1
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        buf = b""
        with conn:
            while True:
                try:
                    chunk = conn.recv(1 << 16)
                except OSError:
                    return
                if not chunk:
                    return
                buf += chunk
                while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    n = int.from_bytes(buf[:4], "big")
                    cmd, buf = rf.decode(buf[4:4 + n]), buf[4 + n:]
                    with self._lock:
                        self.frames.append(cmd)
                    if cmd.code == 103 and self.tell is not None:
                        self.tell.set()
                    if cmd.code == 103 and self.hold is not None:
                        self.hold.wait(20)
                    if not cmd.is_oneway:
                        if cmd.code == 104:
                            time.sleep(self.unregister_delay_s)
                        ext = {}
                        if cmd.code == 103 and cmd.ext.get("brokerId") != "0":
                            ext = {"haServerAddr": "127.0.0.1:10912",
                                   "masterAddr": "127.0.0.1:10911"}
                        conn.sendall(rf.encode(cmd.response(0, None, ext)))

    def of(self, code: int) -> list[rf.Command]:
        with self._lock:
            return [f for f in self.frames if f.code == code]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def namesrv():
    ns = FakeNameServer()
    yield ns
    ns.close()


def check_registration(cmd: rf.Command, served: Served, name: str, broker_id: str,
                       ha: str | None) -> dict:
    assert cmd.code == 103 and cmd.serialize_type == rf.JSON
    assert cmd.ext["brokerName"] == name
    assert cmd.ext["brokerAddr"] == served.address
    assert cmd.ext["clusterName"] == "ClusterX"
    assert cmd.ext["brokerId"] == broker_id
    assert cmd.ext["compressed"] == "false"
    assert cmd.ext["haServerAddr"] == (ha or "")
    assert cmd.ext["bodyCrc32"] == str(crc32(cmd.body))
    body = fj.loads(cmd.body)
    assert list(body) == ["filterServerList", "topicConfigSerializeWrapper"]
    assert body["filterServerList"] == []
    wrapper = body["topicConfigSerializeWrapper"]
    assert set(wrapper["dataVersion"]) == {"counter", "timestamp"}
    return wrapper


def test_a_master_registers_at_start_after_topic_changes_and_unregisters(tmp_path, namesrv):
    server_cfg = {"namesrv_addr": namesrv.address, "remoting_broker_name": "broker-x",
                  "remoting_cluster": "ClusterX", "ha_listen": "127.0.0.1:0"}
    served = Served(deployment_yaml(tmp_path / "d.yaml", tmp_path / "root", server_cfg),
                    tmp_path / "serve.log")
    try:
        ha = served.wait_for(r"master listening for slaves on ([\d.]+:\d+)")
        wait_for(lambda: namesrv.of(103), what="the first registration")
        first = check_registration(namesrv.of(103)[0], served, "broker-x", "0", ha)
        assert first["topicConfigTable"]["TBW102"]["perm"] == 7
        with Wire(served.address) as wire:
            # The broker answers no name-server requests itself when NameServers exist.
            assert wire.call(105, {"topic": "TBW102"}).code == 3
            r = wire.call(17, {"topic": "RegT", "readQueueNums": 2, "writeQueueNums": 2,
                               "perm": 6, "topicFilterType": "SINGLE_TAG", "topicSysFlag": 0,
                               "order": "false"})
            assert r.code == 0
            wait_for(lambda: any("RegT" in fj.loads(c.body)["topicConfigSerializeWrapper"][
                "topicConfigTable"] for c in namesrv.of(103)), what="a registration with RegT")
            count = len(namesrv.of(103))
            assert wire.call(10, send_ext("AutoRegT"), b"x").code == 0  # auto-created
            wait_for(lambda: len(namesrv.of(103)) > count, what="the auto-create registration")
        later = [check_registration(c, served, "broker-x", "0", ha) for c in namesrv.of(103)]
        assert later[-1]["topicConfigTable"]["AutoRegT"]["readQueueNums"] == 4
        versions = [w["dataVersion"]["counter"] for w in later]
        assert versions == sorted(versions) and versions[-1] > versions[0]
        assert namesrv.connections == 1  # one connection kept open
        assert served.stop() == 0
        (bye,) = namesrv.of(104)
        assert bye.ext == {"brokerName": "broker-x", "brokerAddr": served.address,
                           "clusterName": "ClusterX", "brokerId": "0"}
    finally:
        served.kill()


def test_a_slave_registers_with_its_id(tmp_path, namesrv):
    server_cfg = {"namesrv_addr": namesrv.address, "remoting_broker_name": "broker-x",
                  "remoting_cluster": "ClusterX", "ha_master": "127.0.0.1:1"}
    yaml = deployment_yaml(tmp_path / "d.yaml", tmp_path / "root", server_cfg)
    yaml.write_text(yaml.read_text().replace("store: {root:", "store: {role: slave, root:"))
    served = Served(yaml, tmp_path / "serve.log")
    try:
        wait_for(lambda: namesrv.of(103), what="the slave's registration")
        check_registration(namesrv.of(103)[0], served, "broker-x", "1", None)
        assert "master of broker-x is 127.0.0.1:10911" in served.wait_for(
            r"(master of broker-x is [\d.:]+)")
        with Wire(served.address) as wire:
            r = wire.call(10, send_ext("SlaveT"), b"x")
            assert r.code == 14 and "slave" in r.remark
    finally:
        served.stop()


def test_registrations_repeat_first_after_the_first_wait_then_every_interval(namesrv,
                                                                              monkeypatch):
    import asyncio
    import time
    from types import SimpleNamespace

    from mqstore.remoting import registration

    monkeypatch.setattr(registration, "FIRST_REPEAT_S", 0.3)
    monkeypatch.setattr(registration, "INTERVAL_S", 0.6)
    topics = SimpleNamespace(wrapper_doc=lambda: {"dataVersion": {"counter": 1, "timestamp": 2},
                                                  "topicConfigTable": {}})
    broker = SimpleNamespace(name="b", address="127.0.0.1:1", cluster="c", broker_id=0,
                             ha_address=None, topics=topics)

    async def until(count: int) -> None:
        while len(namesrv.of(103)) < count:
            await asyncio.sleep(0.01)

    async def schedule() -> float:
        reg = registration.Registration(broker, namesrv.address)
        start = time.monotonic()
        reg.start()
        await until(3)
        at = time.monotonic() - start
        await reg.stop()
        return at

    async def changed() -> None:
        reg = registration.Registration(broker, namesrv.address)
        reg.start()
        await until(4)
        reg.soon(oneway=True)  # a topic changed: at once (the next repeat is an hour away)
        await until(5)
        await reg.stop()
    third = asyncio.run(schedule())
    assert third >= 0.3 + 0.6 - 0.05  # start, +FIRST_REPEAT_S, +INTERVAL_S
    assert [f.is_oneway for f in namesrv.of(103)] == [False, False, False]
    assert namesrv.of(104)[0].ext["brokerName"] == "b"
    monkeypatch.setattr(registration, "FIRST_REPEAT_S", 3600)
    asyncio.run(changed())
    assert [f.is_oneway for f in namesrv.of(103)[3:]] == [False, True]


def test_registration_follows_the_role_with_the_brokers_own_ha_address(tmp_path, namesrv):
    """A slave names its own HA port (as a 4.9.8 slave does); promoted, it registers as id 0
    at once with the port it now listens on; demoted, as a slave again."""
    import json as jsonlib

    from cli_support import mqstore
    from failover_support import free_ports

    master = Served(deployment_yaml(tmp_path / "m.yaml", tmp_path / "master",
                                    {"ha_listen": "127.0.0.1:0"}), tmp_path / "master.log")
    slave = None
    try:
        ha = master.wait_for(r"master listening for slaves on ([\d.]+:\d+)")
        (port,) = free_ports(1)
        own = f"127.0.0.1:{port}"
        yaml = deployment_yaml(tmp_path / "s.yaml", tmp_path / "slave", {
            "namesrv_addr": namesrv.address, "remoting_broker_name": "broker-x",
            "remoting_cluster": "ClusterX", "ha_master": ha, "ha_listen": own,
            "grpc_listen": "127.0.0.1:0"})
        yaml.write_text(yaml.read_text().replace("store: {root:", "store: {role: slave, root:"))
        slave = Served(yaml, tmp_path / "slave.log")
        grpc = slave.wait_for(r"serving gRPC \S+ on ([\d.]+:\d+)")
        wait_for(lambda: namesrv.of(103), what="the slave's registration")
        check_registration(namesrv.of(103)[0], slave, "broker-x", "1", own)
        master.stop()
        promoted = jsonlib.loads(mqstore("role", "promote", "--server", grpc, "--force",
                                         "--json").stdout)
        assert promoted["role"] == "async_master"
        assert slave.wait_for(r"master listening for slaves on ([\d.]+:\d+)") == own
        # Within ROLE_POLL_S, not at the next 10 s / 30 s registration.
        wait_for(lambda: namesrv.of(103)[-1].ext["brokerId"] == "0", timeout=8,
                 what="a registration as the master")
        check_registration(namesrv.of(103)[-1], slave, "broker-x", "0", own)
        count = len(namesrv.of(103))
        mqstore("role", "demote", "--server", grpc, "--master", ha, "--json")
        wait_for(lambda: namesrv.of(103)[-1].ext["brokerId"] == "1", timeout=8,
                 what="a registration as a slave again")
        assert len(namesrv.of(103)) > count
        check_registration(namesrv.of(103)[-1], slave, "broker-x", "1", own)
    finally:
        if slave is not None:
            slave.stop()
        master.kill()


def test_unregistration_gives_up_after_3_s_as_a_4_9_8_broker_does(caplog):
    """BrokerOuterAPI.unregisterBroker waits 3 s for each NameServer (registrations wait
    registerBrokerTimeoutMills, 6 s): a NameServer answering after 4.5 s holds the shutdown
    3 s, not until its answer."""
    import asyncio
    from types import SimpleNamespace

    from mqstore.remoting import registration

    slow = FakeNameServer(unregister_delay_s=4.5)
    topics = SimpleNamespace(wrapper_doc=lambda: {"dataVersion": {"counter": 1, "timestamp": 2},
                                                  "topicConfigTable": {}})
    broker = SimpleNamespace(name="b", address="127.0.0.1:1", cluster="c", broker_id=0,
                             ha_address=None, topics=topics)

    async def run() -> float:
        reg = registration.Registration(broker, slow.address)
        reg.start()
        while reg.registered < 1:
            await asyncio.sleep(0.01)
        start = time.monotonic()
        await reg.stop()
        return time.monotonic() - start
    try:
        with caplog.at_level(logging.WARNING, logger="mqstore.remoting.registration"):
            took = asyncio.run(run())
        wait_for(lambda: slow.of(104), what="the unregistration")
        assert took >= 3.0 - 0.05
        assert [r.getMessage() for r in caplog.records] == [
            f"unregister broker from name server {slow.address} failed: "
            "no answer within 3.0 s"]
    finally:
        slow.close()


def test_registrations_go_to_every_namesrv_at_once():
    """As BrokerOuterAPI.registerBrokerAll (a task per NameServer): a NameServer slow to answer
    holds back no other's registration. The first answers only once the second has its
    registration, well within the 6 s a registration waits."""
    import asyncio
    from types import SimpleNamespace

    from mqstore.remoting import registration

    second_has_it = threading.Event()
    first = FakeNameServer(hold=second_has_it)
    second = FakeNameServer(tell=second_has_it)
    topics = SimpleNamespace(wrapper_doc=lambda: {"dataVersion": {"counter": 1, "timestamp": 2},
                                                  "topicConfigTable": {}})
    broker = SimpleNamespace(name="b", address="127.0.0.1:1", cluster="c", broker_id=0,
                             ha_address=None, topics=topics)

    async def run() -> int:
        reg = registration.Registration(broker, f"{first.address};{second.address}")
        try:
            await reg.register_all()
        finally:
            for link in reg.links:
                await link.close()
        return reg.registered
    try:
        assert asyncio.run(run()) == 2
        (one,), (two,) = first.of(103), second.of(103)
        assert one.body == two.body and one.ext == two.ext  # one snapshot of the topics
    finally:
        second_has_it.set()
        first.close()
        second.close()


def test_a_namesrv_that_takes_no_connection_holds_the_shutdown_3_s(caplog):
    """NettyClientConfig.connectTimeoutMillis: 3 s to connect. A NameServer whose accept
    queue is full (its SYNs unanswered) holds each call that long, not the 6 s a registration
    waits for its answer."""
    import asyncio
    from types import SimpleNamespace

    from mqstore.remoting import registration

    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    queued = socket.create_connection(address)  # fills the queue: later SYNs go unanswered
    broker = SimpleNamespace(name="b", address="127.0.0.1:1", cluster="c", broker_id=0,
                             ha_address=None, topics=None)

    async def run() -> float:
        reg = registration.Registration(broker, f"{address[0]}:{address[1]}")
        start = time.monotonic()
        await reg.stop()
        return time.monotonic() - start
    try:
        with caplog.at_level(logging.WARNING, logger="mqstore.remoting.registration"):
            took = asyncio.run(run())
        assert [r.getMessage() for r in caplog.records] == [
            f"unregister broker from name server {address[0]}:{address[1]} failed: "
            "no connection within 3.0 s"]
        assert 3.0 - 0.05 <= took < 5.9
    finally:
        queued.close()
        listener.close()

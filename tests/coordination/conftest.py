"""A real etcd for every test here: ``etcd`` is one server per test process (each test its own
cluster name, so tests sharing it never see each other's keys); ``own_etcd`` is a server of the
test's own, for tests that kill and restart it. ``settings(node, ...)`` are fast test settings
(TTL 2 s) for the test's cluster; ``coordinators`` starts nodes and stops them at teardown."""

from __future__ import annotations

import itertools

import pytest

from coordination_support import NodeProc, Recorder, fast
from etcd_support import EtcdServer, TcpProxy, stop_process
from mqstore.coordination import Coordinator, CoordinationSettings

_clusters = itertools.count()


@pytest.fixture(scope="session")
def etcd(tmp_path_factory):
    server = EtcdServer(tmp_path_factory.mktemp("etcd")).start()
    yield server
    server.kill()


@pytest.fixture
def own_etcd(tmp_path):
    server = EtcdServer(tmp_path / "etcd").start()
    yield server
    server.kill()


@pytest.fixture
def cluster(request) -> str:
    return f"t{next(_clusters)}-{abs(hash(request.node.nodeid)) % 10**8}"


@pytest.fixture
def settings(etcd, cluster):
    def make(node: str, endpoints=None, **changes) -> CoordinationSettings:
        return fast(endpoints or [etcd.endpoint], cluster, node, **changes)
    return make


@pytest.fixture
def coordinators():
    started: list[Coordinator] = []

    def start(settings: CoordinationSettings, offset: int = 0, **kwargs):
        recorder = Recorder()
        node = Coordinator(settings, offset=offset, on_elected=recorder("elected"),
                           on_fenced=recorder("fenced"),
                           on_leader_changed=recorder("leader"), **kwargs)
        node.recorder = recorder
        node.start()
        started.append(node)
        return node

    yield start
    for node in started:
        node.stop()


@pytest.fixture
def proxies():
    made: list[TcpProxy] = []

    def make(target: str) -> TcpProxy:
        made.append(TcpProxy(target))
        return made[-1]

    yield make
    for proxy in made:
        proxy.close()


@pytest.fixture
def node_procs():
    made: list[NodeProc] = []

    def make(settings: CoordinationSettings, offset: int = 0) -> NodeProc:
        made.append(NodeProc(settings, offset))
        return made[-1]

    yield make
    for node in made:
        stop_process(node.proc)

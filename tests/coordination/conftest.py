"""A real etcd for every test here: ``etcd`` is one server per test process (each test its own
cluster name, so tests sharing it never see each other's keys); ``own_etcd`` is a server of the
test's own, for tests that kill and restart it. ``settings(node, ...)`` are fast test settings
(TTL 2 s) for the test's cluster; ``coordinators`` starts nodes and stops them at teardown."""

from __future__ import annotations

import dataclasses
import itertools
import json
import subprocess
import sys
import threading

import pytest

from etcd_support import EtcdServer, TcpProxy, stop_process
from mqstore.coordination import Coordinator, CoordinationSettings
from paths import SUPPORT

_clusters = itertools.count()


def fast(endpoints, cluster: str, node: str, **changes) -> CoordinationSettings:
    """TTL 2 s (etcd's minimum under its default election timeout), renewals every 0.2 s."""
    base = CoordinationSettings(endpoints=tuple(endpoints), cluster=cluster, node=node, ttl_s=2,
                                renew_s=0.2, retry_s=0.4, margin_s=0.5)
    return dataclasses.replace(base, **changes)


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


class Recorder:
    """Callbacks that record (kind, value) in order; ``kinds(k)`` lists one kind's values."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    def __call__(self, kind: str):
        def record(value=None):
            with self.lock:
                self.events.append((kind, value))
        return record

    def kinds(self, kind: str) -> list:
        with self.lock:
            return [v for k, v in self.events if k == kind]


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


class NodeProc:
    """``coordination_proc.py`` run as a child; ``events`` is what it printed so far."""

    def __init__(self, settings: CoordinationSettings, offset: int) -> None:
        args = {**dataclasses.asdict(settings), "offset": offset}
        args["endpoints"] = list(settings.endpoints)
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "coordination_proc.py"), json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict]:
        return [e for e in list(self.events) if e["event"] == kind]


@pytest.fixture
def node_procs():
    made: list[NodeProc] = []

    def make(settings: CoordinationSettings, offset: int = 0) -> NodeProc:
        made.append(NodeProc(settings, offset))
        return made[-1]

    yield make
    for node in made:
        stop_process(node.proc)

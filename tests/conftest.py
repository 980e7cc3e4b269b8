"""Shared fixtures: a store factory that closes what it opens, a settable clock, and a
scheduler a test moves by hand."""

from __future__ import annotations

import faulthandler
import json
import os
import tarfile
from pathlib import Path

import pytest

from mqstore.clock import ManualClock
from mqstore.scheduler import ManualScheduler
from mqstore.testing import StoreFactory, merged, suite_defaults

# A store written by RocketMQ 4.9.8 and its answers; CI clones main next to shared/.
FIXTURE = Path(__file__).resolve().parents[1].parent / "shared" / "fixtures" / "rocketmq-4.9.8"
if not FIXTURE.exists():
    FIXTURE = Path(os.environ.get("MQSTORE_FIXTURES", "/work/shared/fixtures")) / "rocketmq-4.9.8"

BORN_HOST = "127.0.0.1:50000"


SPARK_TESTS = Path(__file__).resolve().parent / "spark"


def pytest_collection_modifyitems(items):
    """Every Spark test is slow (``-m "not slow"`` leaves them out): its session starts a JVM,
    and each job runs Python workers beside it."""
    for item in items:
        if SPARK_TESTS in item.path.parents:
            item.add_marker(pytest.mark.slow)


@pytest.fixture
def manual_clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def manual_scheduler() -> ManualScheduler:
    """The loops' intervals on a clock that stands still: ``manual_scheduler.run("cleanup")``
    runs a periodic job now (pass it to ``make_store(scheduler=...)``)."""
    return ManualScheduler()


@pytest.fixture
def store_dir(tmp_path):
    return tmp_path / "store"


@pytest.fixture
def make_store(request, store_dir, manual_clock):
    """``make_store(overrides=None, root=None, read_only=False, clock=manual_clock,
    scheduler=None)``.

    Overrides merge over small test defaults (``mqstore.testing.suite_defaults``: 1 MiB
    segments, Java hash so RocketMQ's vectors apply, 24 GiB of "physical memory"). The loops
    run as the default configuration runs them, in worker processes; a test that needs them on
    threads of the test process (it patches code they run, or registers plugin modules only
    this process can import) says so with ``@pytest.mark.loops("thread")``. Every store is
    closed at teardown.
    """
    marker = request.node.get_closest_marker("loops")
    loops = marker.args[0] if marker is not None else "process"
    factory = StoreFactory(store_dir, defaults=suite_defaults(loops=loops), clock=manual_clock)

    def make(overrides=None, *, root=None, read_only=False, clock=manual_clock,
             hash_kind="java", scheduler=None):
        return factory(merged({"store": {"hash": hash_kind}}, overrides), root=root,
                       read_only=read_only, clock=clock, scheduler=scheduler)

    yield make
    factory.close_all()


@pytest.fixture(scope="session")
def manifest():
    """The RocketMQ fixture's MANIFEST.json: every message and RocketMQ's own answers."""
    with open(FIXTURE / "MANIFEST.json", encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def rocketmq_dir(tmp_path_factory):
    """A fresh extraction of the RocketMQ store directory (mtimes kept), one per module."""
    dest = tmp_path_factory.mktemp("rocketmq")
    with tarfile.open(FIXTURE / "store.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
    return dest / "store"


@pytest.fixture
def no_plugin_env(monkeypatch):
    """No plugin-selection variables from the environment (modules opt in with usefixtures)."""
    for name in ("MQSTORE_LOAD_PLUGINS", "MQSTORE_DISABLE_PLUGINS", "MQSTORE_TRACE_PLUGINS"):
        monkeypatch.delenv(name, raising=False)


FAULT_TEST_WATCHDOG_S = 120.0


@pytest.fixture
def watchdog():
    """Bound a fault test in time, its in-process parts included: dump every thread and exit."""
    faulthandler.dump_traceback_later(FAULT_TEST_WATCHDOG_S, exit=True)
    yield
    faulthandler.cancel_dump_traceback_later()

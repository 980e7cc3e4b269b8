"""Shared fixtures: a store factory that closes what it opens, a settable clock, and a
scheduler a test moves by hand."""

from __future__ import annotations

import faulthandler
import json
import os
import shutil
import tarfile
import tempfile
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
SHARED_SCOPES = ("module", "class")
# Module-scoped, yet cheap to make on every worker: they do not keep a module on one worker.
CHEAP_SHARED = frozenset({"config", "home", "rocketmq", "rocketmq_dir"})


def pytest_configure(config):
    """A home of this process's own for the whole run (each pytest-xdist worker has one), so
    nothing a test starts writes under the real one or shares a file there with another worker
    (the RocketMQ client logs to ``~/logs/rocketmq_python``)."""
    home = tempfile.mkdtemp(prefix="mqstore-test-home-")
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    os.environ["HOME"] = home


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist's worker reads the groups
def pytest_collection_modifyitems(items):
    """Every Spark test is slow (``-m "not slow"`` leaves them out): its session starts a JVM,
    and each job runs Python workers beside it. Under pytest-xdist (``--dist loadgroup``) the
    Spark tests share one worker and so one session, and the tests of a module that share a
    module- or class-scoped fixture (a served store, a store a writer process left) run on one
    worker, which makes it once."""
    for item in items:
        if SPARK_TESTS in item.path.parents:
            item.add_marker(pytest.mark.slow)
            item.add_marker(pytest.mark.xdist_group("spark"))
        elif _shares_a_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.path.stem))


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook
def pytest_xdist_node_collection_finished(node, ids):
    """The run stops when a pytest-xdist worker's ``--dist loadgroup`` lost the groups: each
    worker would start a Spark session of its own and make every module fixture again (with
    pytest 9.2, pytest-xdist 3.8 marks the groups where pytest no longer reads them)."""
    lost = [nodeid for nodeid in ids
            if nodeid.startswith("tests/spark/") and not nodeid.endswith("@spark")]
    if lost and node.config.getoption("dist") == "loadgroup":
        pytest.exit(f"--dist loadgroup did not group {len(lost)} Spark tests on {node.gateway.id} "
                    f"(first: {lost[0]}): this pytest-xdist cannot mark groups on this pytest; "
                    f"install the versions the test extra in pyproject.toml pins", returncode=3)


def _shares_a_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    return info is not None and any(
        defs and defs[-1].scope in SHARED_SCOPES and not name.startswith("_")
        and name not in CHEAP_SHARED for name, defs in info.name2fixturedefs.items())


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


@pytest.fixture(scope="session")
def broker_fixture():
    """The RocketMQ 4.9.8 broker fixture's folder (delays, transactions, a DLQ)."""
    return FIXTURE.parent / "rocketmq-4.9.8-broker"


@pytest.fixture(scope="module")
def rocketmq_dir(tmp_path_factory):
    """A fresh extraction of the RocketMQ store directory (mtimes kept), one per module."""
    dest = tmp_path_factory.mktemp("rocketmq")
    with tarfile.open(FIXTURE / "store.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
    return dest / "store"


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    """A home directory of the module's own for the official RocketMQ client (it writes its
    logs under ``~/logs``)."""
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def rocketmq(home):
    """The official RocketMQ 5 client, loaded once per module with ``home`` as its home."""
    from endpoint_support import client_module
    return client_module(home)


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

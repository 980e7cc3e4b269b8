"""``mqstore serve``: a deployment from YAML in a subprocess; /metrics and /healthz scraped,
``stats`` beside it, and SIGTERM or SIGINT to its process group leaving a clean store."""

from __future__ import annotations

import json
import os
import re
import signal
import urllib.request

import pytest

from mqstore import Message, MessageBatch, MessageStore, load_config
from mqstore.errors import ConfigError
from mqstore.ops.metrics import StoreCollector
from mqstore.storage.shared_segment import store_segment_name
from mqstore.lifecycle.store_meta import load_meta
from mqstore.storage.store_id import recorded_id
from mqstore.testing import wait_for
from cli_support import SMALL_CONFIG, mqstore_json
from paths import REPO
from serve_support import STOP_TIMEOUT_S, scrape, start

pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.fixture
def deployment(tmp_path):
    """A store with 40 messages over 4 queues, and a YAML naming it as store.root."""
    root = tmp_path / "store"
    cfg = load_config(overrides={"commit_log": {"segment_bytes": 65536},
                                 "plugins": {"load_entry_points": False},
                                 "index": {"max_hash_slots": 64, "max_index_entries": 256},
                                 "dispatch": {"worker": "thread"}, "flush": {"worker": "thread"}})
    with MessageStore.open(root, config=cfg) as store:
        store.put_batch(MessageBatch(topic="orders", bodies=[b"m%d" % i for i in range(40)],
                                     queue_ids=[i % 4 for i in range(40)]))
        end = store.max_phys_offset
    yaml = tmp_path / "deploy.yaml"
    yaml.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}}}\n"
                    "server: {metrics_listen: \"127.0.0.1:0\", log_level: info}\n")
    return root, yaml, end


def test_serve_metrics_count_the_pending_delayed_messages(deployment, tmp_path):
    root, yaml, _end = deployment
    with MessageStore.open(root, config=load_config(overrides={
            "plugins": {"load_entry_points": False}})) as store:
        for i in range(3):
            store.put(Message("later", b"d%d" % i, properties={"DELAY": "18"}))  # 2 h
    proc, url = start(yaml, tmp_path / "serve.log")
    try:
        m = wait_for(lambda: (got := scrape(url)).get(
            ("mqstore_scheduled_pending_messages", (("level", "18"),))) == 3 and got,
            what="the pending level-18 messages")
        assert m[("mqstore_scheduled_delivered_total", ())] == 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0


def test_serve_checks_open_transactions_and_counts_the_discarded(deployment, tmp_path):
    root, yaml, _end = deployment
    with MessageStore.open(root, config=load_config(overrides={
            "plugins": {"load_entry_points": False}})) as store:
        for i in range(2):
            store.put(Message("orders", b"t%d" % i, properties={"TRAN_MSG": "true",
                                                                 "PGROUP": "shop"}))
    yaml.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}, "
                    "transaction_timeout_ms: 50, transaction_check_interval_ms: 50, "
                    "transaction_check_max: 1}\n"
                    "server: {metrics_listen: \"127.0.0.1:0\", log_level: info}\n")
    proc, url = start(yaml, tmp_path / "serve.log")
    try:
        # No producer answers: each is checked once (its half re-appended), then discarded.
        m = wait_for(lambda: (got := scrape(url)).get(
            ("mqstore_transactions_discarded_total", ())) == 2 and got,
            what="both transactions discarded")
        assert m[("mqstore_transactions_checks_total", ())] == 2
        assert m[("mqstore_transactions_open", ())] == 0
        assert m[("mqstore_transactions_committed_total", ())] == 0
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        assert proc.wait(STOP_TIMEOUT_S) == 0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_serve_metrics_health_and_clean_shutdown(deployment, tmp_path, signum):
    root, yaml, end = deployment
    proc, url = start(yaml, tmp_path / "serve.log")
    try:
        m = scrape(url)
        assert m[("mqstore_commit_log_max_offset_bytes", ())] == end
        assert m[("mqstore_flushed_offset_bytes", ())] == end
        assert m[("mqstore_dispatch_lag_bytes", ())] == 0
        assert m[("mqstore_put_messages_total", ())] == 0
        for q in range(4):
            labels = (("queue_id", str(q)), ("topic", "orders"))
            assert m[("mqstore_queue_depth_messages", labels)] == 10
            assert m[("mqstore_queue_max_offset", labels)] == 10
        for worker in ("dispatch", "flush"):
            assert m[("mqstore_worker_up", (("worker", worker),))] == 1
            assert m[("mqstore_worker_restarts_total", (("worker", worker),))] == 0
        assert ("mqstore_fsync_seconds_count", ()) in m and m[("mqstore_writable", ())] == 1
        guide = (REPO / "docs" / "operations.md").read_text()
        assert sorted({name for name, _labels in m if f"`{name}`" not in guide}) == []
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            assert r.status == 200 and json.loads(r.read())["status"] == "ok"
        stats = mqstore_json("stats", root)  # read-only, beside the running writer
        assert stats["store"]["writer"] == "running" and stats["store"]["writer_pid"] == proc.pid
        assert stats["flush"]["live"] and stats["flush"]["flushed"] == end
        assert stats["dispatch"]["live"] and stats["dispatch"]["dispatched"] == end
    finally:
        os.killpg(proc.pid, signum)  # the whole group, as a terminal or a supervisor sends it
        code = proc.wait(STOP_TIMEOUT_S)
    log = (tmp_path / "serve.log").read_text()
    assert code == 0, log
    assert f"{signal.Signals(signum).name} received: shutting down" in log
    assert "store closed cleanly" in log
    assert not (root / "abort").exists()
    for kind in ("positions", "pool"):
        name = store_segment_name(recorded_id(load_meta(str(root))[0]), kind)
        assert not os.path.exists(f"/dev/shm/{name}"), name
    assert mqstore_json("check", root)["clean"]
    # A shutdown is a stop, not a crash: the workers got the signal too, and the store process
    # stopped them in order; nothing died, was restarted or printed a traceback.
    for noise in ("ERROR", "Traceback", "restarting", "exited with code", "Error:",
                  "is gone"):
        assert noise not in log, log
    with MessageStore.open(root, config=load_config(yaml)) as store:
        report = store.recovery_report
        assert not report.abnormal and report.clean and report.trusted_end == end, report


def test_put_counts_reach_the_collector(tmp_path):
    cfg = load_config(overrides={
        "commit_log": {"segment_bytes": 65536}, "plugins": {"load_entry_points": False},
        "index": {"enabled": False}, "dispatch": {"worker": "thread"},
        "flush": {"worker": "thread"}})
    with MessageStore.open(tmp_path / "s", config=cfg) as store:
        result = store.put_batch(MessageBatch(topic="t", bodies=[b"x"] * 5, queue_ids=0))
        refused = store.put_batch(MessageBatch(topic="t", bodies=[b"x", None], queue_ids=0))
        store.wait_dispatched()
        samples = {s.name: s.value for family in StoreCollector(store).collect()
                   for s in family.samples if not s.labels}
    assert not refused.status.stored
    assert samples["mqstore_put_messages_total"] == 5
    assert samples["mqstore_put_bytes_total"] == result.wrote_bytes
    assert samples["mqstore_put_refused_total"] == 1


@pytest.mark.parametrize("server, needle", [
    ({"metrics_listen": "127.0.0.1:9108", "colour": "blue"}, "server.colour: unknown key"),
    ({"metrics_listen": "localhost"}, "server.metrics_listen"),
    ({"metrics_listen": "127.0.0.1:70000"}, "server.metrics_listen"),
    ({"log_level": "chatty"}, "server.log_level"),
    ({"max_connections": 0}, "server.max_connections"),
    ({"idle_timeout_ms": 0}, "server.idle_timeout_ms"),
    ({"request_timeout_ms": "10s"}, "server.request_timeout_ms"),
    ({"max_header_bytes": 100}, "server.max_header_bytes"),
])
def test_server_section_is_validated(server, needle):
    with pytest.raises(ConfigError, match=re.escape(needle)):
        load_config(overrides={"server": server})


def test_server_defaults():
    cfg = load_config()
    assert (cfg.server.metrics_listen, cfg.server.log_level, cfg.store.root) == (
        "127.0.0.1:9108", "info", None)
    assert (cfg.server.max_connections, cfg.server.idle_timeout_ms,
            cfg.server.request_timeout_ms, cfg.server.max_header_bytes) == (
        64, 10_000, 10_000, 16_384)


@pytest.mark.parametrize("server, needle", [
    ({"metrics_listen": "127.0.0.1:0"},
     "server.ha_listen (None) gives no fixed port for its slaves to dial"),
    ({"metrics_listen": "127.0.0.1:0", "ha_listen": "127.0.0.1:0"},
     "server.ha_listen ('127.0.0.1:0') gives no fixed port"),
    ({"metrics_listen": "127.0.0.1:0", "ha_listen": "0.0.0.0:10912",
      "ha_secret_file": "/nonexistent-but-named"},
     "set coordination.ha_address to the HOST:PORT the other nodes dial"),
])
def test_serve_refuses_coordination_it_cannot_lead_with_and_touches_nothing(tmp_path, server,
                                                                             needle):
    root = tmp_path / "store"
    yaml = tmp_path / "deploy.yaml"
    import yaml as yamllib
    config = yamllib.safe_load(SMALL_CONFIG)
    config.update({"store": {"root": str(root)}, "server": server,
                   "coordination": {"etcd_endpoints": ["127.0.0.1:2379"], "node": "a"}})
    yaml.write_text(json.dumps(config))
    from cli_support import mqstore
    proc = mqstore("serve", "-c", yaml, check=2)  # a configuration error
    assert needle in " ".join(proc.stderr.split()), proc.stderr
    assert not root.exists() or not os.listdir(root)

"""Configuration: the YAML file, validation errors that name the key, overrides, renamed keys."""

from __future__ import annotations

import re
import subprocess
import sys
from importlib import metadata

import pytest
import yaml

import cli_support
from cli_support import SMALL_CONFIG
from mqstore import MessageStore, hookimpl, load_config
from mqstore.plugin_api import manager as plugins_manager
from mqstore.config import RENAMED_KEYS, StoreConfig, parse_delay_levels
from mqstore.errors import ConfigError, PluginError
from mqstore.plugin_api.registry import Registry
from paths import REPO

CONFIG = REPO / "config" / "mqstore.yaml"


def test_shipped_file_equals_the_defaults():
    assert load_config(str(CONFIG)) == StoreConfig()
    assert load_config() == StoreConfig()


def test_shipped_file_lists_every_key_with_a_comment():
    data = yaml.safe_load(CONFIG.read_text())
    text = CONFIG.read_text().splitlines()
    for section, model in StoreConfig.model_fields.items():
        keys = set(model.annotation.model_fields)
        assert set(data[section]) == keys, section
        for key in keys:
            line = next(l for l in text if re.match(rf"\s+{key}:", l))
            assert "#" in line and "default" in line, line


@pytest.mark.parametrize("overrides, needle", [
    ({"flush": {"policy": ""}}, "flush.policy"),
    ({"flush": {"policy": 1}}, "flush.policy"),
    ({"flush": {"bogus": 1}}, "flush.bogus: unknown key"),
    ({"nonsense": {}}, "nonsense: unknown key"),
    ({"commit_log": {"segment_bytes": "1GiB"}}, "commit_log.segment_bytes"),
    ({"commit_log": {"segment_bytes": 1.5}}, "commit_log.segment_bytes"),
    ({"consume_queue": {"file_units": 0}}, "consume_queue.file_units"),
    ({"get": {"access_in_memory_max_ratio": 101}}, "get.access_in_memory_max_ratio"),
    ({"store": {"store_host": "localhost"}}, "store.store_host"),
    ({"store": {"hash": "md5"}}, "store.hash"),
    ({"store": {"message_delay_levels": "1x"}}, "store.message_delay_levels"),
    ({"flush": {"interval_ms": True}}, "flush.interval_ms"),
    ({"server": {"grpc_listen": "8081"}}, "server.grpc_listen"),
    ({"server": {"grpc_tls_cert_file": "c.pem"}}, "grpc_tls_key_file (None) go together"),
    ({"server": {"grpc_access_keys": ["app:"]}}, "access key 'app' has an empty secret key"),
    ({"server": {"grpc_max_request_bytes": 10}}, "server.grpc_max_request_bytes"),
    ({"server": {"ha_peers": ["127.0.0.1:10912"]}},
     "server.ha_peers (['127.0.0.1:10912']) needs server.ha_secret_file or server.ha_tls_*"),
    ({"server": {"ha_peers": ["127.0.0.1:0"], "ha_secret_file": "s"}},
     "server.ha_peers entry '127.0.0.1:0': port 0 cannot be dialled"),
])
def test_bad_values_are_rejected_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(str(CONFIG), overrides=overrides)
    assert needle in str(err.value)


def test_a_slave_may_listen_for_clients_and_for_slaves_of_its_own_promotion():
    cfg = load_config(str(CONFIG), overrides={
        "store": {"role": "slave"},
        "server": {"grpc_listen": "127.0.0.1:8081", "ha_listen": "127.0.0.1:10912",
                   "ha_master": "127.0.0.1:10913", "ha_peers": ["127.0.0.1:10913"],
                   "ha_secret_file": "ha.secret"}})
    assert (cfg.server.grpc_listen, cfg.server.ha_peers) == ("127.0.0.1:8081",
                                                             ("127.0.0.1:10913",))


def test_bad_file(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("flush: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(str(bad))
    bad.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="cannot read"):
        load_config(str(tmp_path / "missing.yaml"))


def test_overrides_merge_over_the_file_and_over_defaults(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("flush:\n  interval_ms: 250\ncommit_log:\n  segment_bytes: 4096\n")
    cfg = load_config(str(f), overrides={"flush": {"policy": "sync"}})
    assert (cfg.flush.policy, cfg.flush.interval_ms, cfg.commit_log.segment_bytes) == ("sync", 250, 4096)
    assert cfg.flush.sync_timeout_ms == 5000
    assert load_config(overrides={"flush": {"policy": "sync"}}).flush.interval_ms == 500
    assert cfg.replace(get={"max_filter_bytes": 100}).get.max_filter_bytes == 100


# -- renamed keys --------------------------------------------------------------------------
OLD_NAMES_YAML = """\
flush:
  mode: sync            # flush.policy since the flush policies became plugins
  interval_ms: 250
dispatch:
  mode: thread          # dispatch.worker
"""


def test_a_file_with_the_old_key_names_loads_with_a_warning_naming_the_new_ones(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text(OLD_NAMES_YAML)
    with pytest.warns(DeprecationWarning) as caught:
        cfg = load_config(str(f))
    assert cfg == load_config(overrides={"flush": {"policy": "sync", "interval_ms": 250},
                                         "dispatch": {"worker": "thread"}})
    assert sorted(str(w.message) for w in caught) == [
        f"configuration key dispatch.mode in {f} was renamed dispatch.worker: the old name "
        f"still sets it but is deprecated",
        f"configuration key flush.mode in {f} was renamed flush.policy: the old name still "
        f"sets it but is deprecated",
    ]
    assert {w.filename for w in caught} == {__file__}  # attributed to the caller


def test_old_key_names_in_overrides_and_replace(tmp_path):
    with pytest.warns(DeprecationWarning, match="flush.mode in overrides was renamed flush.policy"):
        assert load_config(overrides={"flush": {"mode": "sync"}}).flush.policy == "sync"
    with pytest.warns(DeprecationWarning, match="dispatch.mode in overrides was renamed "
                                                "dispatch.worker"):
        assert StoreConfig().replace(dispatch={"mode": "thread"}).dispatch.worker == "thread"
    # The file's old name and an override's new one: the override wins, as for any key.
    f = tmp_path / "old.yaml"
    f.write_text(OLD_NAMES_YAML)
    with pytest.warns(DeprecationWarning):
        cfg = load_config(str(f), overrides={"dispatch": {"worker": "process"}})
    assert (cfg.dispatch.worker, cfg.flush.policy) == ("process", "sync")


def test_old_and_new_name_together_must_agree():
    with pytest.warns(DeprecationWarning):
        cfg = load_config(overrides={"flush": {"mode": "sync", "policy": "sync"}})
    assert cfg.flush.policy == "sync"
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"flush": {"mode": "sync", "policy": "async"}})
    assert str(err.value) == (
        "invalid configuration in overrides: flush.mode is the old name of flush.policy, and "
        "they disagree ('sync' and 'async'); keep flush.policy only")


def test_the_rename_table_maps_removed_names_to_current_keys():
    for (section, old), new in RENAMED_KEYS.items():
        keys = StoreConfig.model_fields[section].annotation.model_fields
        assert new in keys and old not in keys, (section, old, new)


def test_the_command_line_says_which_key_was_renamed(tmp_path):
    f = tmp_path / "old.yaml"
    f.write_text(OLD_NAMES_YAML + SMALL_CONFIG)
    env = {k: v for k, v in cli_support.env().items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run(
        [sys.executable, "-m", "mqstore.cli", "produce", str(tmp_path / "store"), "-t", "T",
         "-c", str(f), "--summary", "hello"],
        capture_output=True, text=True, env=env, timeout=cli_support.CLI_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("stored 1 message(s)")
    assert f"WARNING mqstore: DeprecationWarning: configuration key flush.mode in {f} was " \
           f"renamed flush.policy: the old name still sets it but is deprecated\n" in proc.stderr


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.flush.policy = "sync"


def test_consume_queue_file_size_rounds_to_whole_units(make_store, store_dir):
    from mqstore import Message
    store = make_store({"consume_queue": {"file_units": 7}})
    store.put(Message(topic="T", body=b"x", queue_id=0))
    store.wait_dispatched()
    files = list((store_dir / "consumequeue" / "T" / "0").iterdir())
    assert [f.stat().st_size for f in files] == [140]


def test_hash_choice_is_recorded_and_kept(make_store, store_dir, tmp_path):
    import json
    store = make_store(hash_kind="mmh3")
    assert json.loads((store_dir / "mqstore.json").read_text())["hash"] == "mmh3"
    store.close()
    again = make_store(hash_kind="java")  # the directory's record wins over the config
    assert again.hash_kind == "mmh3"


# -- names that plugins provide --------------------------------------------------------------

NO_EP = {"load_entry_points": False}


pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.mark.parametrize("overrides, needle", [
    ({"flush": {"policy": "syncc"}},
     "flush.policy: unknown flush policy 'syncc'; registered: async, sync"),
    ({"writer": {"kind": "transient"}},
     "writer.kind: unknown writer 'transient'; registered: mmap, transient_pool"),
    ({"queue_select": {"selector": "keyhash"}},
     "queue_select.selector: unknown queue selector 'keyhash'; registered: key_hash, random, "
     "round_robin"),
    ({"plugins": {"disable": ["mqstore.plugins.queue_select_random"]},
      "queue_select": {"selector": "random"}},
     "queue_select.selector: unknown queue selector 'random'; registered: key_hash, round_robin"),
    ({"plugins": {"disable": ["nosuchplugin"]}},
     "plugins.disable: no plugin is named 'nosuchplugin' (known: mqstore.plugins.writer_mmap, "
     "mqstore.plugins.writer_transient, "),
    ({"plugins": {"modules": ["no_such_mqstore_module"]}},
     "plugins: plugin module 'no_such_mqstore_module' cannot be imported"),
])
def test_names_no_plugin_provides_are_refused_before_the_directory_is_touched(
        overrides, needle, tmp_path):
    overrides = {**overrides, "plugins": {**NO_EP, **overrides.get("plugins", {})}}
    cfg = load_config(str(CONFIG), overrides=overrides)  # the model holds; plugins decide
    with pytest.raises(ConfigError) as err:
        plugins_manager.check_config(cfg, str(CONFIG))
    assert str(err.value).startswith(f"invalid configuration in {CONFIG}: ")
    assert needle in str(err.value)
    # Callers that caught the open-time lookup error still catch this one.
    assert isinstance(err.value, PluginError)
    with pytest.raises(ConfigError) as err:
        MessageStore.open(tmp_path / "s", config=cfg)
    assert needle in str(err.value)
    assert not (tmp_path / "s").exists()


def test_every_problem_is_reported_at_once():
    with pytest.raises(ConfigError) as err:
        plugins_manager.build_hooks(load_config(overrides={
            "plugins": {**NO_EP, "disable": ["nope"]}, "flush": {"policy": "syncc"},
            "writer": {"kind": "nvme"}}))
    message = str(err.value)
    assert "plugins.disable: no plugin is named 'nope'" in message
    assert "writer.kind: unknown writer 'nvme'" in message
    assert "flush.policy: unknown flush policy 'syncc'" in message


def checked(**params) -> StoreConfig:
    """``load_config(**params)`` with its plugin names checked, as an open checks them."""
    cfg = load_config(**params)
    plugins_manager.build_hooks(cfg)
    return cfg


class ThirdPartyPlugin:
    @hookimpl
    def register_writers(self, registry):
        registry.add("nvme", object)

    @hookimpl
    def register_flush_policies(self, registry):
        registry.add("fast", object)


@pytest.fixture
def third_party(monkeypatch):
    """A plugin installed under the entry-point name ``thirdparty``."""
    monkeypatch.setitem(sys.modules, "mqstore_thirdparty_plugin", ThirdPartyPlugin())
    ep = metadata.EntryPoint(name="thirdparty", value="mqstore_thirdparty_plugin",
                             group=plugins_manager.ENTRY_POINT_GROUP)
    real = metadata.entry_points

    def entry_points(**params):
        if params.get("group") == plugins_manager.ENTRY_POINT_GROUP:
            return metadata.EntryPoints([ep])
        return real(**params)

    monkeypatch.setattr(plugins_manager.metadata, "entry_points", entry_points)


def test_third_party_names_are_accepted(third_party, monkeypatch):
    cfg = checked(overrides={"writer": {"kind": "nvme"}, "flush": {"policy": "fast"}})
    assert (cfg.writer.kind, cfg.flush.policy) == ("nvme", "fast")
    assert checked(overrides={"plugins": {"disable": ["thirdparty"]}}).plugins.disable == (
        "thirdparty",)
    # Installed but not loaded: its name may still be disabled, its strategies are unknown.
    assert checked(overrides={"plugins": {**NO_EP, "disable": ["thirdparty"]}})
    with pytest.raises(ConfigError, match="writer.kind: unknown writer 'nvme'; registered: mmap, "
                                          "transient_pool$"):
        checked(overrides={"writer": {"kind": "nvme"}, "plugins": NO_EP})
    with pytest.raises(ConfigError, match=r"writer.kind: unknown writer 'nvme'"):
        checked(overrides={"writer": {"kind": "nvme"}, "plugins": {"disable": ["thirdparty"]}})
    monkeypatch.setenv("MQSTORE_LOAD_PLUGINS", "")
    with pytest.raises(ConfigError, match=r"writer.kind: unknown writer 'nvme'"):
        checked(overrides={"writer": {"kind": "nvme"}})
    with pytest.raises(ConfigError, match=r"\(known: .*, mqstore.plugins.cleanup_rocketmq, thirdparty\)"):
        checked(overrides={"plugins": {"disable": ["thirdpartee"]}})


def test_plugin_module_from_config_provides_names(monkeypatch):
    monkeypatch.setitem(sys.modules, "my_writers", ThirdPartyPlugin())
    cfg = checked(overrides={"plugins": {**NO_EP, "modules": ["my_writers"],
                                             "disable": ["my_writers"]}})
    assert cfg.plugins.disable == ("my_writers",)
    cfg = checked(overrides={"plugins": {**NO_EP, "modules": ["my_writers"]},
                                 "writer": {"kind": "nvme"}})
    assert cfg.writer.kind == "nvme"


def test_lookup_at_open_names_the_key(tmp_path, monkeypatch):
    cfg = load_config(overrides={"flush": {"policy": "sync", "worker": "thread"},
                                 "dispatch": {"worker": "thread"}, "plugins": NO_EP})
    # The environment can still take a plugin away between loading and opening.
    monkeypatch.setenv("MQSTORE_DISABLE_PLUGINS", "mqstore.plugins.flush_sync")
    with pytest.raises(PluginError,
                       match="^flush.policy: unknown flush policy 'sync'; registered: async$"):
        MessageStore.open(tmp_path / "s", config=cfg)
    monkeypatch.delenv("MQSTORE_DISABLE_PLUGINS")
    # The failed open released its lock: a correct open works.
    MessageStore.open(tmp_path / "s", config=cfg).close()


def test_registry_errors_name_the_setting_when_there_is_one():
    reg = Registry("writer", setting="writer.kind")
    reg.add("mmap", object)
    with pytest.raises(PluginError, match="^writer.kind: unknown writer 'x'; registered: mmap$"):
        reg.get("x")
    with pytest.raises(PluginError, match="^unknown filter 'X'; registered: none$"):
        Registry("filter").get("X")


# -- rules across keys and values that could not work ------------------------------------------

@pytest.mark.parametrize("cleanup, needle", [
    ({"disk_warning_ratio": 80},
     "cleanup.disk_forcibly_ratio (85) must not exceed cleanup.disk_warning_ratio (80); RocketMQ "
     "requires disk_max_used_ratio <= disk_forcibly_ratio <= disk_warning_ratio"),
    ({"disk_max_used_ratio": 90},
     "cleanup.disk_max_used_ratio (90) must not exceed cleanup.disk_forcibly_ratio (85)"),
    ({"disk_max_used_ratio": 50, "disk_forcibly_ratio": 95, "disk_warning_ratio": 94},
     "cleanup.disk_forcibly_ratio (95) must not exceed cleanup.disk_warning_ratio (94)"),
    ({"file_reserved_hours": float("inf")},
     "cleanup.file_reserved_hours: Input should be less than or equal to 2147483647 (got inf)"),
    ({"file_reserved_hours": float("nan")}, "cleanup.file_reserved_hours: "),
    ({"delete_when": "\u00b2"}, "cleanup.delete_when: Value error, hour '\u00b2' in '\u00b2' must be 0-23"),
    ({"delete_when": "04;"}, "cleanup.delete_when: Value error, hour '' in '04;' must be 0-23"),
    ({"delete_when": "24"}, "cleanup.delete_when: Value error, hour '24' in '24' must be 0-23"),
    ({"delete_when": 4}, "cleanup.delete_when: Input should be a valid string (got 4)"),
])
def test_cleanup_rules(cleanup, needle):
    with pytest.raises(ConfigError) as err:
        load_config(str(CONFIG), overrides={"cleanup": cleanup})
    assert needle in str(err.value)


@pytest.mark.parametrize("cleanup", [
    {"disk_max_used_ratio": 80, "disk_forcibly_ratio": 80, "disk_warning_ratio": 80},
    {"disk_max_used_ratio": 10, "disk_forcibly_ratio": 11, "disk_warning_ratio": 100},
    {"delete_when": "4; 04;23", "file_reserved_hours": 0.5},
])
def test_cleanup_values_within_the_rules_load(cleanup):
    assert load_config(overrides={"cleanup": cleanup}).cleanup.model_dump().items() >= (
        cleanup.items())


def test_delay_levels_take_ascii_digits_only():
    with pytest.raises(ConfigError, match="store.message_delay_levels: Value error, delay level "
                                          "'\u00b2s' must be digits followed by s, m, h or d"):
        load_config(overrides={"store": {"message_delay_levels": "1s \u00b2s"}})
    assert parse_delay_levels("1s 2m 1h 1d") == [1000, 120_000, 3_600_000, 86_400_000]


@pytest.mark.parametrize("host", ["127.0.0.1:0", "127.0.0.1:65535", "[::1]:65535"])
def test_store_host_ports_in_range_load(host):
    assert load_config(overrides={"store": {"store_host": host}}).store.store_host == host


@pytest.mark.parametrize("host", ["127.0.0.1:65536", "[::1]:70000", "127.0.0.1:-1"])
def test_store_host_port_out_of_range_is_refused(host):
    with pytest.raises(ConfigError) as err:
        load_config(overrides={"store": {"store_host": host}})
    assert "store.store_host: " in str(err.value) and repr(host) in str(err.value)

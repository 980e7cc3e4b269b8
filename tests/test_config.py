"""Configuration: the YAML file, validation errors that name the key, overrides."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from mqstore import MessageStore, load_config
from mqstore.config import StoreConfig
from mqstore.errors import ConfigError

CONFIG = Path(__file__).resolve().parents[1] / "config" / "mqstore.yaml"


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
    ({"flush": {"mode": ""}}, "flush.mode"),
    ({"flush": {"mode": 1}}, "flush.mode"),
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
])
def test_bad_values_are_rejected_naming_the_key(overrides, needle):
    with pytest.raises(ConfigError) as err:
        load_config(str(CONFIG), overrides=overrides)
    assert needle in str(err.value)


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
    cfg = load_config(str(f), overrides={"flush": {"mode": "sync"}})
    assert (cfg.flush.mode, cfg.flush.interval_ms, cfg.commit_log.segment_bytes) == ("sync", 250, 4096)
    assert cfg.flush.sync_timeout_ms == 5000
    assert load_config(overrides={"flush": {"mode": "sync"}}).flush.interval_ms == 500
    assert cfg.replace(get={"max_filter_bytes": 100}).get.max_filter_bytes == 100


def test_config_is_frozen():
    cfg = load_config()
    with pytest.raises(Exception):
        cfg.flush.mode = "sync"


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


def test_unknown_plugin_names_fail_at_open(tmp_path):
    from mqstore.errors import PluginError
    cfg = load_config(overrides={"writer": {"kind": "nvme"}, "plugins": {"load_entry_points": False}})
    with pytest.raises(PluginError, match="unknown writer 'nvme'; registered: mmap"):
        MessageStore.open(tmp_path / "s", config=cfg)
    cfg = load_config(overrides={"flush": {"mode": "fast"}, "plugins": {"load_entry_points": False}})
    with pytest.raises(PluginError, match="unknown flush policy 'fast'; registered: .*async"):
        MessageStore.open(tmp_path / "s", config=cfg)
    # The failed open released its lock: a correct open works.
    MessageStore.open(tmp_path / "s", config=load_config(
        overrides={"plugins": {"load_entry_points": False}})).close()

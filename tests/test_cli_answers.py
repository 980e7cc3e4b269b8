"""What the commands answer is true: a directory that is not a store is refused, a lookup that
finds nothing says so (exit 1, as grep's), settings recorded by ``init`` stay the store's,
progress counts the work done, and ``bench`` times what it says. Real subprocesses."""

from __future__ import annotations

import json
import re

import pytest
from rich import filesize

from cli_support import SMALL_CONFIG, mqstore, mqstore_json, mqstore_tty

pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "small.yaml"
    path.write_text(SMALL_CONFIG)
    return str(path)


def test_init_settings_stay_the_stores_when_produce_has_no_config(tmp_path, config):
    root = tmp_path / "small"
    mqstore("init", root, "-c", config)
    recorded = (root / "mqstore.json").read_text()
    assert json.loads(recorded)["commit_log_segment_bytes"] == 65536
    assert ", segment 65536 bytes, hash mmh3\n" in mqstore("info", root).stdout
    out = mqstore_json("produce", root, "-t", "logs", "hello")  # no -c: the defaults
    assert out["count"] == 1
    assert (root / "mqstore.json").read_text() == recorded
    assert [(p.name, p.stat().st_size) for p in (root / "commitlog").iterdir()] == [
        (f"{0:020d}", 65536)]
    assert mqstore_json("stats", root)["commit_log"]["segment_bytes"] == 65536


def test_check_progress_counts_the_records_walked_not_the_segments_size(tmp_path, config):
    root = tmp_path / "progress"
    mqstore("init", root, "-c", config)
    mqstore("produce", root, "-c", config, "-t", "logs", "--summary",
            input="".join(f"line {i}\n" for i in range(60)))
    data = mqstore_json("check", root, "-c", config)["commit_log_bytes"]
    assert 0 < data < 65536  # one segment, mostly unwritten
    status, shown = mqstore_tty("check", root, "-c", config)
    assert status == 0
    unit, suffix = filesize.pick_unit_and_suffix(data, ["bytes", "kB", "MB", "GB"], 1000)
    want = f"{data / unit:,.1f}/{data / unit:,.1f} {suffix}"  # as rich's DownloadColumn
    bars = re.findall(r"checking .*? (\S+/\S+ (?:bytes|kB|MB|GB))", shown)
    assert bars and bars[-1] == want, shown
    assert all(bar.endswith(f"/{data / unit:,.1f} {suffix}") or bar.endswith("/? bytes")
               for bar in bars), bars


def test_bench_dispatch_row_covers_every_message(tmp_path):
    # Puts waiting for their fsync (sync flush), in batches of 100: dispatch keeps up beside
    # them, so what is left when the puts end is about one batch, not the 2000 the row is of.
    sync = tmp_path / "sync.yaml"
    sync.write_text("flush: {policy: sync}\nplugins: {load_entry_points: false}\n")
    out = mqstore_json("bench", "-n", 2000, "--body-bytes", 100, "--batch", 100,
                       "--segment-bytes", 1 << 20, "--dispatch", "thread", "-c", sync)
    phases = {p["phase"]: p for p in out["phases"]}
    put, dispatch = phases["put_batch"], phases["dispatch"]
    assert (dispatch["messages"], dispatch["bytes"]) == (2000, put["bytes"])
    assert dispatch["seconds"] >= put["seconds"]  # timed from the first put, as it starts then

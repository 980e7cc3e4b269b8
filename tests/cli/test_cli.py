"""The ``mqstore`` command: the demo never deletes a directory it did not make."""

from __future__ import annotations

import os

import pytest
from click.testing import CliRunner

from mqstore.cli import DEMO_MARKER, main

# Small and in-process, so a whole demo run takes about a second.
SMALL_CONFIG = """\
commit_log: {segment_bytes: 4194304}
dispatch: {worker: thread}
flush: {worker: thread}
plugins: {load_entry_points: false}
index: {max_hash_slots: 4096, max_index_entries: 16384}
"""


pytestmark = pytest.mark.usefixtures("no_plugin_env")


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "small.yaml"
    path.write_text(SMALL_CONFIG)
    return str(path)


def demo(*args):
    return CliRunner().invoke(main, ["demo", *args])


def snapshot(root):
    """Every path under ``root`` with its bytes (files) or None (directories)."""
    out = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for d in dirnames:
            out[os.path.relpath(os.path.join(dirpath, d), root)] = None
        for f in filenames:
            path = os.path.join(dirpath, f)
            with open(path, "rb") as fh:
                out[os.path.relpath(path, root)] = fh.read()
    return out


@pytest.fixture
def foreign(tmp_path):
    """A non-empty directory that no demo run made."""
    root = tmp_path / "mine"
    (root / "commitlog").mkdir(parents=True)
    (root / "commitlog" / "00000000000000000000").write_bytes(b"precious")
    (root / "notes.txt").write_text("keep me")
    return root


@pytest.mark.parametrize("extra", [[], ["--fresh"]])
def test_demo_refuses_a_non_empty_directory_it_did_not_make(foreign, config, extra):
    before = snapshot(foreign)
    result = demo("--config", config, "--root", str(foreign), "--count", "1000", *extra)
    assert result.exit_code == 2
    assert (f"Invalid value for '--root': {str(foreign)!r} exists, is not empty and was not made "
            f"by 'mqstore demo' (it has no {DEMO_MARKER} file), so the demo will not delete it"
            in result.output)
    assert "--force" in result.output and "--keep" in result.output
    assert snapshot(foreign) == before  # nothing deleted, nothing written (no marker either)


def test_demo_with_a_bad_config_touches_nothing(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("flush: {policy: syncc}\n")
    root = tmp_path / "new"
    result = demo("--config", str(bad), "--root", str(root))
    assert result.exit_code == 2
    assert ("Invalid value for '--config': invalid configuration in "
            f"{bad}: flush.policy: unknown flush policy 'syncc'; registered: async, sync"
            in result.output)
    assert not root.exists()


def test_demo_runs_repeatedly_on_its_own_directory_and_info_reads_it(tmp_path, config):
    root = tmp_path / "data"
    for _ in range(2):  # what `make run` does each time
        result = demo("--config", config, "--root", str(root), "--count", "1000")
        assert result.exit_code == 0, result.output
        assert "opened: commit log [-1, 0)" in result.output  # started from an empty store
        assert ", clean (" in result.output
    assert (root / DEMO_MARKER).is_file()
    info = CliRunner().invoke(main, ["info", str(root)])
    assert info.exit_code == 0, info.output
    assert "orders/0: [0, " in info.output


def test_force_empties_a_foreign_directory_and_marks_it(foreign, config):
    result = demo("--config", config, "--root", str(foreign), "--count", "1000", "--force")
    assert result.exit_code == 0, result.output
    assert not (foreign / "notes.txt").exists()
    assert (foreign / DEMO_MARKER).is_file()


def test_keep_appends_to_a_foreign_store_without_marking_it(tmp_path, config):
    from mqstore import Message, MessageStore, load_config
    root = tmp_path / "store"
    with MessageStore.open(root, config=load_config(config)) as store:
        store.put(Message("mine", b"precious", queue_id=0))
    result = demo("--config", config, "--root", str(root), "--count", "1000", "--keep")
    assert result.exit_code == 0, result.output
    assert not (root / DEMO_MARKER).exists()  # so a later --fresh run still refuses
    with MessageStore.open(root, config=load_config(config), read_only=True) as store:
        assert [m.body for m in store.get("g", "mine", 0, 0, 32).messages] == [b"precious"]
    assert demo("--config", config, "--root", str(root)).exit_code == 2


def test_an_empty_existing_directory_is_used_and_marked(tmp_path, config):
    root = tmp_path / "empty"
    root.mkdir()
    result = demo("--config", config, "--root", str(root), "--count", "1000")
    assert result.exit_code == 0, result.output
    assert (root / DEMO_MARKER).is_file()

"""Architecture contracts: import-linter checks the [tool.importlinter] contracts in pyproject.toml.

import-linter finds modules by walking the root package's directory, and mqstore's is core/, while
mqstore.plugins lives in plugins/ (see [tool.setuptools.package-dir]). So each test copies core/ and
plugins/ into one mqstore/ tree under tmp_path and runs the linter there, in a child process of
this interpreter (the linter puts its working directory first on sys.path, so the copy is what it
analyses, not the editable install). The copy is static analysis input only: nothing is imported.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from paths import REPO

ROOT = REPO
PYPROJECT = ROOT / "pyproject.toml"

# Every contract of pyproject.toml, each with a planted violation below: one added there is
# added here too, with the violation that proves it bites.
REQUIRED_CONTRACTS = {
    "format is pure",
    "errors, hashing and _moved are leaves",
    "core does not import plugins",
    "the engine's layers",
    "the package face re-exports only the public modules",
    "no module of mqstore imports the package face",
    "plugins use only the plugin API",
    "only the connector and the export command import mqstore.spark",
    "only mqstore.spark imports pyspark and pyarrow",
    "only serve and the --server commands import mqstore.endpoint",
    "only serve imports mqstore.remoting",
    "mqstore.remoting imports only the standard library and numpy",
    "only mqstore.endpoint imports grpc, protobuf and the RocketMQ client",
    "coordination imports only the kernel",
    "only mqstore.coordination imports etcd3gw",
}

# What `lint-imports` (the console script) runs, started from this interpreter.
LINT = "from importlinter.cli import lint_imports_command; lint_imports_command()"


def _contracts(config: Path = PYPROJECT) -> list[dict]:
    with config.open("rb") as f:
        return tomllib.load(f)["tool"]["importlinter"]["contracts"]


def _contract_names(config: Path) -> list[str]:
    return [c["name"] for c in _contracts(config)]


def layer_table(config: Path = PYPROJECT) -> list[list[str]]:
    """The layers contract's layers, top first, each as its modules (``mqstore.`` dropped)."""
    (layers,) = [c for c in _contracts(config) if c["type"] == "layers"]
    return [[m.strip().removeprefix("mqstore.") for m in layer.split("|")]
            for layer in layers["layers"]]


def top_level_modules() -> set[str]:
    """Every module and package directly under the package (core/), by its name."""
    core = ROOT / "core"
    names = {p.stem for p in core.glob("*.py") if p.stem != "__init__"}
    names |= {p.parent.name for p in core.glob("*/__init__.py")}
    return names


def _stage(dest: Path) -> Path:
    """Copy core/ as dest/mqstore and plugins/ as dest/mqstore/plugins; return dest/mqstore."""
    assert not (ROOT / "core" / "plugins").exists(), "core/plugins would collide with plugins/"
    pkg = dest / "mqstore"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "core", pkg, ignore=skip)
    shutil.copytree(ROOT / "plugins", pkg / "plugins", ignore=skip)
    return pkg


def _lint(cwd: Path, config: Path = PYPROJECT) -> tuple[int, str]:
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1", "TERM": "dumb"}
    proc = subprocess.run(
        [sys.executable, "-c", LINT, "--config", str(config), "--no-cache", "--no-logo"],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
    )
    return proc.returncode, f"--- lint-imports stdout ---\n{proc.stdout}\n--- stderr ---\n{proc.stderr}"


def test_every_module_is_in_a_layer():
    """The layers contract holds every module of core/ (what it does not list it does not
    check); the package face and mqstore.plugins have contracts of their own."""
    layered = [m for layer in layer_table() for m in layer]
    assert len(layered) == len(set(layered)), layered
    assert set(layered) == top_level_modules(), (
        f"in no layer: {sorted(top_level_modules() - set(layered))}; "
        f"no such module: {sorted(set(layered) - top_level_modules())}")


def test_contracts_keep(tmp_path):
    names = _contract_names(PYPROJECT)
    assert set(names) == REQUIRED_CONTRACTS, f"contracts of pyproject.toml: {names}"
    _stage(tmp_path)
    code, report = _lint(tmp_path)
    assert code == 0, f"architecture contracts broken:\n{report}"
    for name in names:
        assert f"{name} KEPT" in report, report
    assert f"Contracts: {len(names)} kept, 0 broken." in report, report


def test_contracts_catch_violations(tmp_path):
    """The real contracts, on a copy with one planted violation each (the real tree is untouched)."""
    pkg = _stage(tmp_path)
    # A module added later is forbidden to format without editing the contract; so is the root.
    (pkg / "_arch_probe_new.py").write_text("")
    (pkg / "format" / "_arch_probe.py").write_text(
        "import mqstore\nfrom mqstore import _arch_probe_new\nfrom mqstore.store import MessageStore\n"
    )
    with (pkg / "errors.py").open("a") as f:
        f.write("\nfrom mqstore import config as _arch_probe_config\n")
    # The package face re-exporting an internal module, and a module importing the face.
    with (pkg / "__init__.py").open("a") as f:
        f.write("\nfrom mqstore.read import reader as _arch_probe_reader\n")
    (pkg / "ops" / "_arch_probe_face.py").write_text("import mqstore\n")
    # Spark from the core, and its libraries outside it.
    (pkg / "cli" / "_arch_probe_spark.py").write_text(
        "import pyarrow\nfrom mqstore.spark import export\n")
    # A kernel module importing up: the config importing the plugin API.
    with (pkg / "config.py").open("a") as f:
        f.write("\nfrom mqstore.plugin_api import manager as _arch_probe_manager\n")
    (pkg / "_arch_probe_core.py").write_text("from mqstore.plugins import writer_mmap\n")
    # A function-level import counts as well.
    (pkg / "storage" / "_arch_probe.py").write_text(
        "def late():\n    from mqstore.runtime.workers import pipes\n    return pipes\n"
    )
    # An upward import between layers, one hidden under TYPE_CHECKING, and one from the kernel.
    (pkg / "read" / "_arch_probe.py").write_text("from mqstore.dispatch import loop\n")
    (pkg / "plugin_api" / "_arch_probe.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from mqstore.view import directory_view\n"
    )
    # A plugin reaching past the plugin API, into storage or the package face.
    (pkg / "plugins" / "_arch_probe.py").write_text(
        "from mqstore.storage import index_file\nfrom mqstore import Message\n"
        "from mqstore.plugin_api import hookimpl\n"
    )
    with (pkg / "message.py").open("a") as f:
        f.write("\nfrom mqstore.runtime import cleanup as _arch_probe_cleanup\n")
    # The store knowing the gRPC endpoint, or its libraries.
    (pkg / "_arch_probe_grpc.py").write_text(
        "import grpc\nfrom google.protobuf import duration_pb2\n"
        "from mqstore.endpoint import server\n")
    # The CLI knowing the remoting server, and the remoting server knowing prometheus_client.
    (pkg / "cli" / "_arch_probe_remoting.py").write_text("from mqstore.remoting import server\n")
    (pkg / "remoting" / "_arch_probe.py").write_text("import prometheus_client\n")
    # The store's own modules knowing etcd, and coordination knowing the store's files.
    (pkg / "_arch_probe_etcd.py").write_text("import etcd3gw\n")
    (pkg / "coordination" / "_arch_probe.py").write_text("from mqstore.storage import commit_log\n")
    code, report = _lint(tmp_path)
    assert code == 1, report
    for name in REQUIRED_CONTRACTS:
        assert f"{name} BROKEN" in report, report
    for planted in (
        "mqstore.format._arch_probe -> mqstore (l.1)",
        "mqstore.format._arch_probe -> mqstore._arch_probe_new (l.2)",
        "mqstore.format._arch_probe -> mqstore.store (l.3)",
        "mqstore.errors -> mqstore.config",
        "mqstore._arch_probe_core -> mqstore.plugins.writer_mmap (l.1)",
        "mqstore.storage._arch_probe -> mqstore.runtime.workers.pipes (l.2)",
        "mqstore.read._arch_probe -> mqstore.dispatch.loop (l.1)",
        "mqstore.plugin_api._arch_probe -> mqstore.view.directory_view (l.3)",
        "mqstore.message -> mqstore.runtime.cleanup",
        "mqstore.plugins._arch_probe -> mqstore.storage.index_file (l.1)",
        "mqstore.plugins._arch_probe -> mqstore (l.2)",
        "mqstore._arch_probe_grpc -> grpc (l.1)",
        "mqstore._arch_probe_grpc -> google (l.2)",
        "mqstore._arch_probe_grpc -> mqstore.endpoint.server (l.3)",
        "mqstore -> mqstore.read.reader",
        "mqstore.ops._arch_probe_face -> mqstore (l.1)",
        "mqstore.cli._arch_probe_spark -> pyarrow (l.1)",
        "mqstore.cli._arch_probe_spark -> mqstore.spark.export (l.2)",
        "mqstore.config -> mqstore.plugin_api.manager",
        "mqstore.cli._arch_probe_remoting -> mqstore.remoting.server (l.1)",
        "mqstore.remoting._arch_probe -> prometheus_client (l.1)",
        "mqstore._arch_probe_etcd -> etcd3gw (l.1)",
        "mqstore.coordination._arch_probe -> mqstore.storage.commit_log (l.1)",
    ):
        assert planted in report, f"{planted!r} not reported:\n{report}"


def test_linter_sees_real_imports(tmp_path):
    """A contract that today's unmodified code breaks: the graph holds the real imports."""
    _stage(tmp_path)
    config = tmp_path / "broken.toml"
    config.write_text(
        '[tool.importlinter]\nroot_package = "mqstore"\n\n'
        "[[tool.importlinter.contracts]]\n"
        'name = "deliberately broken"\ntype = "forbidden"\n'
        'source_modules = ["mqstore.storage", "mqstore.plugins"]\n'
        'forbidden_modules = ["mqstore.format"]\n'
    )
    code, report = _lint(tmp_path, config)
    assert code == 1, report
    assert "deliberately broken BROKEN" in report, report
    assert "mqstore.storage.commit_log -> mqstore.format.record" in report, report
    assert "mqstore.plugins." in report, report

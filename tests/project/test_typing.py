"""The public surface type-checks: ``mqstore`` (the package face and ``MessageStore``),
``mqstore.plugin_api`` and the built-in plugins written against it.

mypy cannot follow the editable install's import hook (``mqstore`` lives in core/), so the test
stages core/ and plugins/ as one ``mqstore`` tree, as tests/project/test_architecture.py does, and runs
mypy there with the ``[tool.mypy]`` settings of pyproject.toml.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from test_architecture import PYPROJECT, _stage

TARGETS = ["-m", "mqstore", "-m", "mqstore.store", "-p", "mqstore.plugin_api",
           "-p", "mqstore.plugins"]


def _mypy(cwd) -> subprocess.CompletedProcess:
    env = {**os.environ, "MYPYPATH": str(cwd)}
    return subprocess.run(
        [sys.executable, "-m", "mypy", "--config-file", str(PYPROJECT),
         "--cache-dir", str(cwd / ".mypy_cache"), *TARGETS],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow
def test_public_surface_type_checks_and_a_type_error_is_caught(tmp_path):
    pkg = _stage(tmp_path)
    proc = _mypy(tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Success: no issues found" in proc.stdout
    # The same run catches a plugin misusing the plugin API (incremental: only this is redone).
    with (pkg / "plugins" / "writer_mmap.py").open("a") as f:
        f.write("\n\ndef _probe(store: StoreView) -> int:\n    return store.root\n")
    text = (pkg / "plugins" / "writer_mmap.py").read_text()
    (pkg / "plugins" / "writer_mmap.py").write_text(
        text.replace("from mqstore.plugin_api import", "from mqstore.plugin_api import StoreView,", 1))
    proc = _mypy(tmp_path)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "writer_mmap.py" in proc.stdout, proc.stdout
    assert 'Incompatible return value type (got "str", expected "int")' in proc.stdout, proc.stdout

"""The package layout the design card fixes: core/ is mqstore, plugins/ is mqstore.plugins."""

from __future__ import annotations

import importlib
import tomllib
from pathlib import Path

import mqstore
from mqstore.plugin_api.manager import DEFAULT_PLUGINS
from paths import REPO

ROOT = REPO


def _package_dirs():
    for base, name in ((ROOT / "core", "mqstore"), (ROOT / "plugins", "mqstore.plugins")):
        for init in base.rglob("__init__.py"):
            rel = init.parent.relative_to(base).parts
            yield ".".join((name, *rel))


def test_every_package_directory_is_listed_in_pyproject():
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert sorted(config["packages"]) == sorted(set(_package_dirs()))
    assert config["package-dir"] == {"mqstore": "core", "mqstore.plugins": "plugins"}


def test_packages_import_from_the_mapped_directories():
    assert Path(mqstore.__file__).parent == ROOT / "core"
    for name in DEFAULT_PLUGINS:
        module = importlib.import_module(name)
        assert Path(module.__file__).parent == ROOT / "plugins", name


def test_modules_stay_small():
    for path in [*(ROOT / "core").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        lines = len(path.read_text().splitlines())
        assert lines <= 600, f"{path.relative_to(ROOT)} has {lines} lines"


def test_ci_runs_the_readme_test_command():
    assert "make test" in (ROOT / "README.md").read_text()
    ci = [l for l in (ROOT / ".ci" / "run").read_text().splitlines()
          if l.strip() and not l.startswith("#")]
    assert ci[-1].strip() == "make test"


def test_every_logger_is_named_after_its_module():
    """One scheme everywhere: a module logs as ``mqstore.<package>.<module>`` (its
    ``__name__``), so a package's logger (``mqstore.runtime``) configures all of its modules.
    The worker logging setup names the root (``mqstore``); a worker's failure is logged as
    its module; what concerns the whole package (the command line's warnings) is the root's."""
    import ast
    allowed = {"__name__", "ROOT_LOGGER", "target.__module__", "'mqstore'"}
    found = []
    for path in [*(ROOT / "core").rglob("*.py"), *(ROOT / "plugins").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr == "getLogger" and node.args):
                name = ast.unparse(node.args[0])
                if name not in allowed:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert found == []

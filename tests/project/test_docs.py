"""The docs stay in step with the code: hook signatures and on-disk layout diagrams."""

from __future__ import annotations

import importlib
import inspect
import re
import sys
import types

import pytest

from mqstore.plugin_api import hookspecs
from mqstore.plugin_api.manager import make_plugin_manager
from paths import REPO

DOCS = REPO / "docs"
PLUGIN_HOOKS = DOCS / "plugin_hooks.md"
FILE_FORMATS = DOCS / "file_formats.md"
DIAGRAM_MODULES = ("mqstore.format.record", "mqstore.format.cq_unit", "mqstore.storage.checkpoint",
                   "mqstore.storage.clean_marker")


pytestmark = pytest.mark.usefixtures("no_plugin_env")


def hook_signatures() -> dict[str, str]:
    pm = make_plugin_manager(load_entry_points=False)
    names = [n for n in vars(pm.hook) if not n.startswith("_")]
    return {name: f"{name}({', '.join(getattr(pm.hook, name).spec.argnames)})" for name in names}


def doc_sections(text: str) -> dict[str, str]:
    """``## heading`` -> the text up to the next ``##`` heading."""
    parts = re.split(r"^## (.+)$", text, flags=re.M)
    return {parts[i].strip(): parts[i + 1] for i in range(1, len(parts), 2)}


def code_blocks(text: str, lang: str = "") -> list[str]:
    return re.findall(rf"^```{lang}\n(.*?)^```$", text, flags=re.M | re.S)


def test_every_hookspec_is_in_the_plugin_manager():
    specs = {name for name, obj in vars(hookspecs).items()
             if inspect.isfunction(obj) and hasattr(obj, "mqstore_spec")}
    assert len(specs) >= 9
    assert specs == set(hook_signatures())


def test_every_hook_has_a_heading_with_its_exact_signature():
    sections = doc_sections(PLUGIN_HOOKS.read_text())
    missing = [sig for sig in hook_signatures().values() if sig not in sections]
    assert missing == []


def test_every_signature_heading_names_a_hook():
    signatures = set(hook_signatures().values())
    headings = [h for h in doc_sections(PLUGIN_HOOKS.read_text()) if "(" in h]
    assert [h for h in headings if h not in signatures] == []


def test_every_hook_section_says_which_process_runs_it():
    sections = doc_sections(PLUGIN_HOOKS.read_text())
    for sig in hook_signatures().values():
        assert "Runs in:" in sections[sig], sig


def test_plugin_hooks_doc_shows_a_packaged_plugin():
    text = PLUGIN_HOOKS.read_text()
    assert any("@hookimpl" in block and "from mqstore.plugin_api import hookimpl" in block
               for block in code_blocks(text, "python"))
    (toml,) = code_blocks(text, "toml")
    assert "[project.entry-points.mqstore]" in toml
    assert re.search(r"^\w+ = \"\w+\"$", toml.split("[project.entry-points.mqstore]")[1], re.M)


def test_plugin_examples_load_as_plugins(monkeypatch):
    blocks = [b for b in code_blocks(PLUGIN_HOOKS.read_text(), "python") if "@hookimpl" in b]
    assert len(blocks) >= len(hook_signatures()) - 1  # register_filters reuses the top example
    for i, source in enumerate(blocks):
        name = f"mqstore_docs_example_{i}"
        module = types.ModuleType(name)
        exec(compile(source, f"{PLUGIN_HOOKS.name} example {i}", "exec"), module.__dict__)
        monkeypatch.setitem(sys.modules, name, module)
        pm = make_plugin_manager(modules=[name], load_entry_points=False)
        assert pm.get_hookcallers(module), f"example {i} implements no hook"


def diagram_blocks(docstring: str) -> list[list[str]]:
    """Runs of consecutive box-diagram lines (``+--``, ``|``, ``total =``), stripped."""
    blocks, current = [], []
    for line in docstring.splitlines():
        stripped = line.strip()
        if stripped.startswith(("+", "|", "total =")):
            current.append(stripped)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def contains_run(lines: list[str], run: list[str]) -> bool:
    n = len(run)
    return any(lines[i:i + n] == run for i in range(len(lines) - n + 1))


@pytest.mark.parametrize("module_name, min_lines", [
    ("mqstore.format.record", 21),
    ("mqstore.format.cq_unit", 3),
    ("mqstore.storage.checkpoint", 7),
    ("mqstore.storage.clean_marker", 19),
    ("mqstore.format.pop_record", 12),
])
def test_file_formats_doc_repeats_the_module_diagrams(module_name, min_lines):
    doc = importlib.import_module(module_name).__doc__
    blocks = diagram_blocks(doc)
    assert sum(len(b) for b in blocks) >= min_lines
    doc_lines = [line.strip() for block in code_blocks(FILE_FORMATS.read_text())
                 for line in block.splitlines()]
    for run in blocks:
        missing = [line for line in run if line not in doc_lines]
        assert missing == [], f"{module_name}: diagram lines missing from {FILE_FORMATS.name}"
        assert contains_run(doc_lines, run), f"{module_name}: diagram lines out of order"


def test_file_formats_doc_covers_every_file():
    sections = doc_sections(FILE_FORMATS.read_text())
    for title in ("Commit-log record", "Blank record", "Offset message id", "Consume-queue unit",
                  "Checkpoint", "Abort marker", "Clean-shutdown marker", "Lock file",
                  "mqstore.json", "Pop journal (`consumer/pop/<topic>@<group>.journal`)"):
        assert title in sections, title
        assert re.search(r"^\+-+", sections[title], re.M), f"{title}: no box diagram"


ARCHITECTURE = DOCS / "architecture.md"
ROOT = DOCS.parent


def _modules() -> list[str]:
    """Every module of the package, as docs/architecture.md names it (``read.pull``,
    ``plugins.index_key``; a package by its own name)."""
    names = []
    for base, prefix in ((ROOT / "core", ""), (ROOT / "plugins", "plugins.")):
        for path in sorted(base.rglob("*.py")):
            rel = path.relative_to(base).with_suffix("")
            parts = list(rel.parts)
            if "packaging" in parts or parts[-1] == "__main__":
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            name = prefix + ".".join(parts)
            if name and name != "plugins.":
                names.append(name.rstrip("."))
    return names


def test_architecture_doc_names_every_module():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    named = set(re.findall(r"`([a-z_][a-z0-9_.]*)`", text))
    named |= {m.strip("/").replace("/", ".") for m in re.findall(r"`([a-z_][a-z_/]*/)`", text)}
    missing = [m for m in _modules() if m not in named and f"mqstore.{m}" not in named
               and m.split(".")[-1] not in ("__init__",)]
    assert not missing, f"docs/architecture.md does not name: {missing}"


def test_architecture_doc_names_only_modules_that_exist():
    text = ARCHITECTURE.read_text(encoding="utf-8")
    known = set(_modules())
    layers = ("format", "storage", "plugin_api", "view", "coordination", "append", "read",
              "dispatch", "runtime",
              "lifecycle", "consumer", "replication", "ops", "cli", "spark", "testing", "plugins")
    named = {m for m in re.findall(r"`([a-z_]+(?:\.[a-z_0-9]+)+)`", text)
             if m.split(".")[0] in layers}
    stale = sorted(m for m in named if m not in known and not any(
        m.startswith(k + ".") for k in known))  # attributes: module.Class.method
    assert not stale, f"docs/architecture.md names modules that do not exist: {stale}"


def _doc_layers() -> list[list[str]]:
    """docs/architecture.md's layer table: per row, top first, the modules it names."""
    section = doc_sections(ARCHITECTURE.read_text(encoding="utf-8"))["Layers"]
    rows = [line.split("|")[1:-1] for line in section.splitlines()
            if line.startswith("| ") and not line.startswith("| layer ")]
    return [re.findall(r"`([a-z_]+)`", row[1]) for row in rows]


def test_architecture_doc_layer_table_is_the_layers_contract():
    from test_architecture import layer_table
    assert _doc_layers() == layer_table()


def test_the_layer_table_check_catches_a_disagreement(tmp_path, monkeypatch):
    """The same comparison fails on a copy whose table swaps two rows."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    swapped = text.replace("| spark | `spark` |", "| SPARK |").replace(
        "| operators | `ops` |", "| spark | `spark` |").replace("| SPARK |", "| operators | `ops` |")
    assert swapped != text
    copy = tmp_path / "architecture.md"
    copy.write_text(swapped, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "ARCHITECTURE", copy)
    with pytest.raises(AssertionError):
        test_architecture_doc_layer_table_is_the_layers_contract()

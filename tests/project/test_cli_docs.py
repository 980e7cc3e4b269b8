"""The generated references match the code, and the operator guides cover their subjects."""

from __future__ import annotations


import pytest

from mqstore.cli import main
from mqstore.config import StoreConfig
from mqstore.cli.reference import cli_reference, config_reference
from paths import REPO

ROOT = REPO
DOCS = ROOT / "docs"
REGENERATE = "python -m mqstore.cli.reference --config config/mqstore.yaml --out docs"


@pytest.mark.parametrize("name, make", [
    ("cli.md", lambda: cli_reference(main)),
    ("configuration.md",
     lambda: config_reference((ROOT / "config" / "mqstore.yaml").read_text(encoding="utf-8"))),
])
def test_generated_reference_is_current(name, make):
    assert (DOCS / name).read_text(encoding="utf-8") == make(), \
        f"docs/{name} is stale: run `{REGENERATE}`"


def test_references_cover_every_command_and_key():
    cli = (DOCS / "cli.md").read_text(encoding="utf-8")
    for name in main.list_commands(None):
        assert f"## mqstore {name}\n" in cli, name
    config = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for section, field in StoreConfig.model_fields.items():
        assert f"## `{section}`" in config
        for key in field.annotation.model_fields:
            assert f"| `{key}` |" in config, f"{section}.{key}"


def test_operations_guide_and_quickstart():
    ops = (DOCS / "operations.md").read_text(encoding="utf-8")
    for heading in ("## Recovery", "## Checking and repairing", "## Retention", "## Disk full",
                    "## Metrics"):
        assert heading in ops
    for kind in ("segment", "record", "torn-tail", "consume-queue", "index", "abort"):
        assert f"| `{kind}` |" in ops, kind
    quick = (DOCS / "quickstart.md").read_text(encoding="utf-8")
    assert "make run" in quick and "make test" in quick and "mqstore serve -c" in quick

"""The small-store configuration file the CLI tests pass with ``-c``."""

from __future__ import annotations

import pytest

from cli_support import SMALL_CONFIG


@pytest.fixture(scope="module")
def config(tmp_path_factory):
    path = tmp_path_factory.mktemp("cfg") / "small.yaml"
    path.write_text(SMALL_CONFIG)
    return str(path)

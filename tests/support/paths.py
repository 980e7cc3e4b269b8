"""Where the tests find the repository's files, whatever folder of tests/ they live in."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
TESTS = REPO / "tests"
SUPPORT = TESTS / "support"
DOCS = REPO / "docs"

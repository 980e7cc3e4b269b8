"""The consumer tests' fixtures."""

from __future__ import annotations

import pytest

from wakeup_watch import WakeupWatch


@pytest.fixture
def wakeup_watch(monkeypatch) -> WakeupWatch:
    """Tells when a poll of this process is asleep on the dispatch notification."""
    return WakeupWatch(monkeypatch)

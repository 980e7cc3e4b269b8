"""The endpoint tests' server and clients: ``served``, a fresh ``mqstore serve`` for each test,
SIGKILLed after it (a module whose tests share one server, or that serves other settings,
defines its own ``served`` with ``endpoint_support.serving``), and ``clients``, official
clients of ``served``, shut down after the test."""

from __future__ import annotations

import pytest

from endpoint_support import Clients, serving


@pytest.fixture
def served(tmp_path, home):
    with serving(tmp_path, home, clean=False) as server:
        yield server


@pytest.fixture
def clients(rocketmq, served):
    with Clients(rocketmq, served.endpoint) as c:
        yield c

"""The official RocketMQ client, loaded once per test module with a home of its own (it writes
its logs under ``~/logs``)."""

from __future__ import annotations

import pytest

from endpoint_support import client_module


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("home")


@pytest.fixture(scope="module")
def rocketmq(home):
    return client_module(home)

"""A served store per test module, and RocketMQ's C++ client installed once per test session
(``cpp_client_support``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cpp_client_support import install_cpp_client
from remoting_support import Served, deployment_yaml


@pytest.fixture(scope="session")
def cpp_client() -> Path:
    return install_cpp_client()


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("served")
    server = Served(deployment_yaml(tmp / "deploy.yaml", tmp / "root"), tmp / "serve.log")
    yield server
    server.stop()

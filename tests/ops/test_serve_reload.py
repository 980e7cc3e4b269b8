"""SIGHUP to a running ``mqstore serve`` (a service manager's reload): the configuration file
is read again, what changes without a restart takes effect and is logged, what needs a
restart is logged as such; the store stays served, and SIGTERM still closes it cleanly."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import urllib.request

import grpc
import pytest

from mqstore.testing import wait_for
from cli_support import SMALL_CONFIG, mqstore_json
from endpoint_support import Served
from serve_support import scrape

pytestmark = [pytest.mark.usefixtures("no_plugin_env"), pytest.mark.slow]
LIST_TOPICS = "/mqstore.admin.v1.Admin/ListTopics"


def write(yaml_path, root, **server) -> None:
    settings = {"metrics_listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0", **server}
    yaml_path.write_text(SMALL_CONFIG + f"store: {{root: {json.dumps(str(root))}}}\n"
                         f"server: {json.dumps(settings)}\n")


def list_topics(endpoint: str):
    """The admin call unsigned: its answer, or the gRPC status it was refused with."""
    with grpc.insecure_channel(endpoint) as channel:
        try:
            return json.loads(channel.unary_unary(LIST_TOPICS)(b"{}", timeout=10))
        except grpc.RpcError as exc:
            return exc.code()


def closed_by_server(url: str, timeout_s: float) -> bool:
    """Opens a connection to the HTTP server and sends nothing: True once the server closed
    it (its idle timeout)."""
    host, port = url.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout_s) as sock:
        try:
            return sock.recv(1) == b""
        except TimeoutError:
            return False


def test_sighup_reloads_what_it_can_and_the_store_stays_served(tmp_path):
    yaml_path, root = tmp_path / "deploy.yaml", tmp_path / "store"
    write(yaml_path, root, log_level="info")
    served = Served(yaml_path, tmp_path / "serve.log", tmp_path)
    try:
        url = re.search(r"serving metrics on (http://[\d.:]+)/metrics", served.log())[1]
        assert isinstance(list_topics(served.endpoint), list)

        # To the whole process group, as a terminal's hangup: the workers ignore it.
        os.killpg(served.proc.pid, signal.SIGHUP)
        wait_for(lambda: "SIGHUP received: configuration reloaded, 0 change(s) taken, "
                         "0 need a restart" in served.log(), 30, what="the first reload")

        write(yaml_path, root, log_level="debug", idle_timeout_ms=300,
              grpc_access_keys=["ops:s3cret"], log_format="json", grpc_max_request_bytes=65536,
              grpc_max_connections=2048)
        os.kill(served.proc.pid, signal.SIGHUP)
        wait_for(lambda: "server.grpc_max_request_bytes: 8388608 -> 65536" in served.log()
                 and "counts peers from now on" in served.log(), 30,
                 what="the second reload")  # the last change it logs, the endpoint's warning
        log = served.log()
        assert "configuration reloaded, 4 change(s) taken, 2 need a restart" in log
        assert ("server.grpc_max_connections 2048 counts peers from now on, but gRPC accepts "
                "at most the 1024 connections it started with until a restart") in log
        assert "reloaded server.log_level: 'info' -> 'debug'" in log
        assert "reloaded server.idle_timeout_ms: 10000 -> 300" in log
        assert "reloaded server.grpc_access_keys: no access keys -> access keys [ops]" in log
        assert "not reloaded, needs a restart: server.log_format: 'text' -> 'json'" in log
        assert ("not reloaded, needs a restart: server.grpc_max_request_bytes: 8388608 -> "
                "65536") in log
        assert "s3cret" not in log

        # The new access keys guard every call; the new idle time closes a silent
        # connection, and the debug level shows it.
        wait_for(lambda: list_topics(served.endpoint) == grpc.StatusCode.UNAUTHENTICATED, 10,
                 what="the access keys taken")
        assert closed_by_server(url, 10)
        wait_for(lambda: re.search(r"DEBUG mqstore\.ops\.http_server\[\d+\]: closing a connection: idle",
                                   served.log()), 10, what="a debug line")

        # A file that does not load changes nothing.
        yaml_path.write_text("server: {log_level: chatty}\n")
        os.kill(served.proc.pid, signal.SIGHUP)
        wait_for(lambda: "configuration not reloaded, serve goes on as it was" in served.log(),
                 30, what="the refused reload")
        assert "server.log_level" in served.log().rsplit("not reloaded", 1)[1]

        m = scrape(url)
        assert m[("mqstore_writable", ())] == 1
        for worker in ("dispatch", "flush"):
            assert m[("mqstore_worker_up", (("worker", worker),))] == 1
            assert m[("mqstore_worker_restarts_total", (("worker", worker),))] == 0
        with urllib.request.urlopen(url + "/healthz", timeout=10) as r:
            assert r.status == 200
    finally:
        code = served.stop(signal.SIGTERM)
    log = served.log()
    assert code == 0, log
    assert "store closed cleanly" in log and not (root / "abort").exists()
    assert "Traceback" not in log and "exited with code" not in log, log
    assert mqstore_json("check", root)["clean"]

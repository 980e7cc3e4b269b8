"""Transactions with the official client's ``Producer`` and ``TransactionChecker`` against
``mqstore serve`` (docs/transactions.md): commit, rollback, a transaction left unknown and
decided by the checker, a producer SIGKILLed between send and commit (another producer's
checker decides), and ``serve`` SIGKILLed mid-transaction (nothing half-committed visible,
nothing committed lost, the open one checked after the restart). Every ``serve`` is a
subprocess with the default worker processes."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading

import pytest

from cli_support import SMALL_CONFIG, env
from endpoint_support import Clients, Served
from mqstore.testing import wait_for
from paths import SUPPORT
from serve_support import scrape

pytestmark = [pytest.mark.usefixtures("no_plugin_env"), pytest.mark.slow]
# Checked back 1 s after the send, again every 0.5 s (RocketMQ's defaults: 6 s and 60 s).
STORE = {"transaction_timeout_ms": 1000, "transaction_check_interval_ms": 500}


def _yaml(tmp_path, root, store=None):
    path = tmp_path / "deploy.yaml"
    settings = {"metrics_listen": "127.0.0.1:0", "grpc_listen": "127.0.0.1:0",
                "grpc_min_invisible_ms": 1000}
    path.write_text(SMALL_CONFIG + "flush: {policy: sync}\n"
                    f"store: {json.dumps({'root': str(root), **STORE, **(store or {})})}\n"
                    f"server: {json.dumps(settings)}\n")
    return path


class Checker:
    """Answers each check-back from ``answers`` (by body), recording the messages asked."""

    def __init__(self, rocketmq, answers: dict[bytes, str]) -> None:
        self.resolution = rocketmq.TransactionResolution
        self.answers = answers
        self.asked: list = []
        self.lock = threading.Lock()

    def check(self, message):
        with self.lock:
            self.asked.append(message)
        return getattr(self.resolution, self.answers.get(message.body,
                                                         "TRANSACTION_RESOLUTION_UNSPECIFIED"))

    def bodies(self) -> list[bytes]:
        with self.lock:
            return [m.body for m in self.asked]


def _bodies(clients, group: str, topic: str, count: int, timeout_s: float = 30) -> list:
    consumer = clients.consumer(group, {topic: clients.mq.FilterExpression()}, await_s=1)
    got = clients.receive_all(consumer, count, timeout_s=timeout_s)
    return sorted(m.body for m in got + consumer.receive(32, 30))


def test_commit_rollback_and_a_checked_unknown(tmp_path, home, rocketmq):
    # Ended within 5 s of their sends, on a loaded machine too: a check-back of an ended one
    # would be due before its end arrived.
    served = Served(_yaml(tmp_path, tmp_path / "store", {"transaction_timeout_ms": 5000}),
                    tmp_path / "serve.log", home)
    clients = Clients(rocketmq, served.endpoint)
    checker = Checker(rocketmq, {b"unknown": "COMMIT"})
    try:
        producer = rocketmq.Producer(clients.configuration(), ("Orders",), checker=checker)
        producer.startup()
        receipts = {}
        for body in (b"commit", b"rollback", b"unknown"):
            tx = producer.begin_transaction()
            receipts[body] = producer.send(clients.message("Orders", body, tag="T"),
                                           transaction=tx)
            assert receipts[body].transaction_id  # the half's offset message id
            if body == b"commit":
                tx.commit()
            elif body == b"rollback":
                tx.rollback()
        wait_for(lambda: b"unknown" in checker.bodies(), what="the unknown one checked back")
        assert set(checker.bodies()) == {b"unknown"}  # the ended ones are never asked about
        (asked, *_) = checker.asked
        assert (asked.topic, asked.message_id) == ("Orders", receipts[b"unknown"].message_id)
        assert _bodies(clients, "orders-readers", "Orders", 2) == [b"commit", b"unknown"]
        producer.shutdown()
    finally:
        clients.close()
        assert served.stop() == 0, served.log()


def test_a_producer_killed_between_send_and_commit_is_decided_by_another(tmp_path, home,
                                                                          rocketmq):
    served = Served(_yaml(tmp_path, tmp_path / "store"), tmp_path / "serve.log", home)
    clients = Clients(rocketmq, served.endpoint)
    doomed = subprocess.Popen(
        [sys.executable, str(SUPPORT / "endpoint_client_proc.py"), "half", served.endpoint,
         "Payments", "orphan"], stdout=subprocess.PIPE, text=True,
        env={**env(), "HOME": str(home), "PYTHONPATH": str(SUPPORT)})
    try:
        line = doomed.stdout.readline().split()
        assert line[:1] == ["sent"], line
        doomed.kill()  # SIGKILL: its transaction is never ended
        doomed.wait()
        checker = Checker(rocketmq, {b"orphan": "COMMIT"})
        producer = rocketmq.Producer(clients.configuration(), ("Payments",), checker=checker)
        producer.startup()
        wait_for(lambda: checker.bodies(), what="the orphan checked by the new producer")
        assert checker.asked[0].message_id == line[1]
        assert _bodies(clients, "payments", "Payments", 1) == [b"orphan"]
        producer.shutdown()
    finally:
        if doomed.poll() is None:
            doomed.kill()
        doomed.stdout.close()
        clients.close()
        assert served.stop() == 0, served.log()


def test_serve_killed_mid_transaction_keeps_commits_and_checks_the_open(tmp_path, home,
                                                                       rocketmq):
    yaml = _yaml(tmp_path, tmp_path / "store", {"transaction_timeout_ms": 600_000})
    served = Served(yaml, tmp_path / "serve1.log", home)
    clients = Clients(rocketmq, served.endpoint)
    try:
        producer = rocketmq.Producer(clients.configuration(), ("Ledger",),
                                     checker=Checker(rocketmq, {}))
        producer.startup()
        tx = producer.begin_transaction()
        producer.send(clients.message("Ledger", b"committed"), transaction=tx)
        tx.commit()
        open_one = producer.send(clients.message("Ledger", b"open"),
                                 transaction=producer.begin_transaction())
    finally:
        clients.close()
        served.kill()  # SIGKILL to serve and its workers, the second transaction open

    yaml = _yaml(tmp_path, tmp_path / "store")  # now checked back after 1 s
    served = Served(yaml, tmp_path / "serve2.log", home)
    clients = Clients(rocketmq, served.endpoint)
    checker = Checker(rocketmq, {b"open": "ROLLBACK"})
    try:
        # Nothing half-committed is visible, nothing committed is lost.
        assert _bodies(clients, "ledger", "Ledger", 1) == [b"committed"]
        producer = rocketmq.Producer(clients.configuration(), ("Ledger",), checker=checker)
        producer.startup()
        wait_for(lambda: checker.bodies(), what="the open transaction checked after restart")
        assert [m.message_id for m in checker.asked][:1] == [open_one.message_id]
        url = re.search(r"serving metrics on (http://[\d.:]+)/metrics", served.log()).group(1)
        wait_for(lambda: scrape(url).get(("mqstore_transactions_rolled_back_total", ())) == 1,
                 what="the checker's rollback")
        assert scrape(url)[("mqstore_transactions_open", ())] == 0
        consumer = clients.consumer("ledger", {"Ledger": rocketmq.FilterExpression()},
                                    await_s=1)
        assert consumer.receive(32, 30) == []  # rolled back: never delivered
        producer.shutdown()
    finally:
        clients.close()
        assert served.stop() == 0, served.log()

"""RocketMQ 4.x's transactions on ``mqstore serve``'s remoting port, frame by frame (a real
serve process, default configuration): a half sent with the prepared sysFlag, ended by a
oneway END_TRANSACTION (37), refusals answered as the broker answers them, and the checker's
CHECK_TRANSACTION_STATE (39) on a producer's connection, answered from the check."""

from __future__ import annotations

import json

import pytest

from mqstore.format.record import parse_offset_msg_id
from mqstore.message import StoredMessage
from mqstore.testing import wait_for

from cli_support import SMALL_CONFIG
from remoting_support import Served, Wire, props, pull_ext, records, send_ext

pytestmark = pytest.mark.usefixtures("no_plugin_env")
PREPARED = 4


@pytest.fixture(scope="module")
def checked(tmp_path_factory):
    """A served store checking open transactions 0.5 s after their send, every 0.5 s."""
    tmp = tmp_path_factory.mktemp("txn")
    yaml = tmp / "deploy.yaml"
    store = {"root": str(tmp / "root"), "transaction_timeout_ms": 500,
             "transaction_check_interval_ms": 500}
    server = {"metrics_listen": "127.0.0.1:0", "remoting_listen": "127.0.0.1:0"}
    yaml.write_text(SMALL_CONFIG + f"store: {json.dumps(store)}\nserver: {json.dumps(server)}\n")
    server = Served(yaml, tmp / "serve.log")
    yield server
    server.stop()


def _half(wire, topic, body, uniq, group="pg"):
    return wire.call(10, send_ext(topic, 1, props(
        TRAN_MSG="true", PGROUP=group, UNIQ_KEY=uniq, KEYS=uniq), sysFlag=PREPARED), body)


def _end(wire, phys, resolution, group="pg", oneway=True, **more):
    ext = {"producerGroup": group, "tranStateTableOffset": 0, "commitLogOffset": phys,
           "commitOrRollback": resolution, "fromTransactionCheck": "false", "msgId": "m",
           **more}
    if oneway:
        wire.request(37, ext, oneway=True)
        return None
    return wire.call(37, ext)


def _pulled(wire, topic, queue_id, count):
    return wait_for(lambda: len(records((p := wire.call(11, pull_ext(
        "g", topic, queue_id, 0))).body or b"")) >= count and records(p.body),
        what=f"{count} message(s) in {topic}/{queue_id}")


def test_a_half_is_ended_by_end_transaction(checked):
    with Wire(checked.address) as wire:
        r = _half(wire, "TxWire", b"paid", "U-1")
        # The queue sent to, the half queue's offset, the half's offset message id.
        assert r.code == 0 and (r.ext["queueId"], r.ext["queueOffset"]) == ("1", "0")
        _host, half = parse_offset_msg_id(r.ext["msgId"])
        rb = _half(wire, "TxWire", b"cancelled", "U-2")
        _host, other = parse_offset_msg_id(rb.ext["msgId"])
        _end(wire, half, 8)
        _end(wire, other, 12)
        (m,) = _pulled(wire, "TxWire", 1, 1)
        assert (m.body, m.sysflag, m.prepared_tx_offset, m.uniq_key) == (
            b"paid", 8, half, "U-1")
        refused = _end(wire, half, 8, oneway=False)
        assert refused.code == 1 and "U-1" in refused.remark and "not open" in refused.remark
        wrong = _half(wire, "TxWire", b"x", "U-3")
        _host, third = parse_offset_msg_id(wrong.ext["msgId"])
        refused = _end(wire, third, 8, group="other", oneway=False)
        assert refused.code == 1 and "producer group wrong" in refused.remark
        refused = _end(wire, third, 5, oneway=False)
        assert refused.code == 1 and "commitOrRollback 5" in refused.remark
        assert _end(wire, third, 12, oneway=False).code == 0
        assert len(records(wire.call(11, pull_ext("g", "TxWire", 1, 0)).body)) == 1
        rolled = wire.call(10, send_ext("TxWire", 1, props(TRAN_MSG="true"), sysFlag=12),
                           b"x")
        assert rolled.code == 16 and "prepared sysFlag" in rolled.remark


def test_the_checker_asks_a_producer_of_the_group_and_its_answer_ends_it(checked):
    with Wire(checked.address) as producer:
        beat = {"clientID": "127.0.0.1@1#1", "consumerDataSet": [],
                "producerDataSet": [{"groupName": "checked-pg"}]}
        assert producer.call(34, {}, json.dumps(beat).encode()).code == 0
        r = _half(producer, "TxChecked", b"unknown", "U-9", group="checked-pg")
        _host, half = parse_offset_msg_id(r.ext["msgId"])
        check = producer.read()
        while check.code != 39:
            check = producer.read()
        assert check.is_oneway
        assert (check.ext["msgId"], check.ext["transactionId"]) == ("U-9", "U-9")
        asked = StoredMessage.from_bytes(check.body)
        # The re-appended half, as a record of its real topic and queue, at its own offsets.
        assert (asked.topic, asked.queue_id, asked.body) == ("TxChecked", 1, b"unknown")
        assert asked.phys_offset == int(check.ext["commitLogOffset"]) != half
        assert asked.queue_offset == int(check.ext["tranStateTableOffset"])
        assert asked.properties["TRANSACTION_CHECK_TIMES"] == "1"
        assert parse_offset_msg_id(check.ext["offsetMsgId"])[1] == asked.phys_offset
        _end(producer, asked.phys_offset, 8, group="checked-pg", fromTransactionCheck="true")
        (m,) = _pulled(producer, "TxChecked", 1, 1)
        assert (m.body, m.prepared_tx_offset) == (b"unknown", asked.phys_offset)

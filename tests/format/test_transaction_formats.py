"""Transactions' records byte for byte against the RocketMQ 4.9.8 broker fixture: the half's
and each re-appended half's properties text (a Java HashMap's order), the committed message
and the op record as ``append.transactions`` builds them from the stored half."""

from __future__ import annotations

import json
import tarfile

import pytest

from mqstore.append.encoding import PutContext, encode_single
from mqstore.append.transactions import committed, op_record, rechecked
from mqstore.format.hosts import Host
from mqstore.format.transaction import (
    half_properties, java_properties_text, op_offsets,
)
from mqstore.message import StoredMessage

HALF = "RMQ_SYS_TRANS_HALF_TOPIC"
BROKER = Host(bytes([127, 0, 0, 1]), 10911)
CTX = PutContext(BROKER, 4 << 20, False, False)


@pytest.fixture(scope="module")
def broker(broker_fixture, tmp_path_factory):
    with open(broker_fixture / "MANIFEST.json", encoding="utf-8") as f:
        manifest = json.load(f)
    dest = tmp_path_factory.mktemp("broker")
    with tarfile.open(broker_fixture / "store.tar.gz") as tar:
        tar.extractall(dest, filter="tar")
    log = (dest / "store" / "commitlog" / "00000000000000000000").read_bytes()
    return manifest, log


def _raw(log: bytes, record: dict) -> bytes:
    at = record["commitLogOffset"]
    return log[at:at + record["size"]]


def _names(text: str) -> list[str]:
    return [segment.split("\x01")[0] for segment in text.split("\x02")]


def test_a_half_is_written_in_the_order_4_9_8_writes_it(broker):
    manifest, _ = broker
    halves = {r["uniqKey"]: r for r in manifest["expected"]["records"]
              if r["topic"] == HALF and "TRANSACTION_CHECK_TIMES" not in r["properties"]}
    assert len(halves) == 15
    for sent in (m for m in manifest["messages"] if m["kind"].startswith("tx-")):
        stored = halves[sent["msgId"]]
        props = dict(sent["clientProperties"], CLUSTER="FixtureCluster")
        real = stored["properties"]
        text = java_properties_text(half_properties(props, real["REAL_TOPIC"],
                                                    int(real["REAL_QID"])), props)
        assert text == stored["propertiesString"]


def test_re_appended_halves_commits_and_op_records_are_4_9_8s_bytes(broker):
    manifest, log = broker
    records = manifest["expected"]["records"]
    by_offset = {r["commitLogOffset"]: r for r in records}
    compared = 0
    for m in (m for m in manifest["messages"] if m["kind"].startswith("tx-")):
        copies = [by_offset[s["commitLogOffset"]] for s in m["storedAs"] if s["topic"] == HALF]
        for earlier, later in zip(copies, copies[1:]):
            p = rechecked(StoredMessage.from_bytes(_raw(log, earlier)), CTX)
            got = encode_single(p, BROKER, 0, later["queueOffset"], later["commitLogOffset"],
                                later["storeTimestamp"])
            assert got == _raw(log, later)
            compared += 1
        commits = [r for r in records if r["topic"] == "FixTx"
                   and r["uniqKey"] == m["msgId"]]
        for c in commits:
            half = by_offset[c["preparedTransactionOffset"]]
            p = committed(StoredMessage.from_bytes(_raw(log, half)), CTX)
            got = encode_single(p, BROKER, c["queueId"], c["queueOffset"], c["commitLogOffset"],
                                c["storeTimestamp"])
            assert got == _raw(log, c)
            compared += 1
    assert compared == 3 + 6 + 6 + 8  # three late commits' copies, two pending's, 8 commits
    for op in (r for r in records if r["topic"] == "RMQ_SYS_TRANS_OP_HALF_TOPIC"):
        p = op_record(int(op["body"]), CTX)
        got = encode_single(p, BROKER, 0, op["queueOffset"], op["commitLogOffset"],
                            op["storeTimestamp"])
        want = bytearray(_raw(log, op))
        want[36 + 4:36 + 12] = got[40:48]  # the born time: 4.9.8's is the op's creation time
        assert got == bytes(want)
        assert op_offsets(bytes(p.body)) == [int(op["body"])]


def test_op_bodies_are_decimal_offsets_and_others_are_named():
    assert op_offsets(b"17") == [17] and op_offsets(b"3,4") == [3, 4]
    with pytest.raises(ValueError, match="op record body b'x1' is not a list of half"):
        op_offsets(b"x1")

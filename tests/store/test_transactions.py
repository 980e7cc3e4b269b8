"""Transactions through the embedding API (docs/transactions.md): a put with ``TRAN_MSG`` is a
half in ``RMQ_SYS_TRANS_HALF_TOPIC``, ended by a commit (the real topic gets it) or a rollback
(only an op record), checked back after the timeout with its half re-appended, discarded past
the check limit; a RocketMQ 4.9.8 broker's store keeps its pending transactions open and
checked. The loops run in worker processes, as the default configuration runs them."""

from __future__ import annotations

import json
import tarfile

import pytest

from mqstore import Message
from mqstore.message import PutStatus
from mqstore.runtime.transactions import TransactionEndedError
from mqstore.testing import wait_for

HALF, OP = "RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC"
FAST = {"store": {"transaction_timeout_ms": 3000, "transaction_check_interval_ms": 2000,
                  "transaction_check_max": 2}}


def _half(topic="T", body=b"order #1", **props):
    return Message(topic, body, tags="Tx", keys=["k1"],
                   properties={"TRAN_MSG": "true", "PGROUP": "PG", **props}, queue_id=1)


def _ticked(store, after: int | None = None) -> dict:
    seen = store.transaction_status()["ticks"] if after is None else after
    return wait_for(lambda: (s := store.transaction_status())["ticks"] > seen + 1 and s,
                    what="a checker tick")


def test_a_half_is_kept_in_the_half_topic_and_invisible_until_committed(make_store):
    store = make_store()
    r = store.put(_half(UNIQ_KEY="U1"))
    # RocketMQ's answer: the real queue, the half queue's offset.
    assert (r.status, r.queue_id, r.queue_offset) == (PutStatus.PUT_OK, 1, 0)
    h = store.message_at(r.phys_offset)
    assert (h.topic, h.queue_id, h.sysflag, h.prepared_tx_offset) == (HALF, 0, 0, 0)
    # In the order of a Java HashMap of these names, as 4.9.8's broker writes them.
    assert h.properties_text == ("REAL_TOPIC\x01T\x02KEYS\x01k1\x02TRAN_MSG\x01true\x02UNIQ_KEY"
                                 "\x01U1\x02PGROUP\x01PG\x02TAGS\x01Tx\x02REAL_QID\x011")
    store.wait_dispatched()
    assert store.max_offset("T", 1) == 0
    assert HALF not in store.topics() and OP not in store.topics()
    (t,) = store.open_transactions()
    assert (t.message_id, t.producer_group, t.topic, t.queue_offset, t.checks) == (
        "U1", "PG", "T", 0, 0)

    c = store.end_transaction(r.phys_offset, commit=True)
    assert c.status is PutStatus.PUT_OK and len(c) == 2
    m = store.message_at(int(c.phys_offsets[0]))
    assert (m.topic, m.queue_id, m.queue_offset, m.sysflag, m.prepared_tx_offset) == (
        "T", 1, 0, 8, r.phys_offset)
    assert m.properties_text == h.properties_text and m.body == b"order #1"
    assert m.born_timestamp == h.born_timestamp
    op = store.message_at(int(c.phys_offsets[1]))
    assert (op.topic, op.queue_id, op.body, op.properties_text) == (
        OP, 0, b"0", "WAIT\x01true\x02TAGS\x01d")
    assert store.open_transactions() == []
    store.wait_dispatched()
    assert [x.body for x in store.read("T", 1, 0)] == [b"order #1"]
    with pytest.raises(TransactionEndedError, match="U1.*not open"):
        store.end_transaction(r.phys_offset, commit=False)


def test_a_rollback_writes_only_the_op_record(make_store):
    store = make_store()
    r = store.put(_half())  # no UNIQ_KEY: the half gets one, its transaction's id
    key = store.message_at(r.phys_offset).uniq_key
    store.wait_dispatched()
    assert len(key) == 32 and [t.message_id for t in store.open_transactions()] == [key]
    rb = store.end_transaction(r.phys_offset, commit=False)
    assert rb.status is PutStatus.PUT_OK and len(rb) == 1
    op = store.message_at(int(rb.phys_offsets[0]))
    assert (op.topic, op.body) == (OP, b"0")
    store.wait_dispatched()
    assert store.max_offset("T", 1) == 0 and store.open_transactions() == []
    assert store.transaction_status()["rolled_back"] == 1


def test_bad_ends_are_refused_and_write_nothing(make_store):
    store = make_store()
    normal = store.put(Message("T", b"plain", queue_id=0))
    store.put(_half(UNIQ_KEY="U3"))
    store.wait_dispatched()
    end = store.internals.commit_log.max_offset
    with pytest.raises(ValueError, match=f"no half message starts at commit-log offset "
                                         f"{normal.phys_offset}"):
        store.end_transaction(normal.phys_offset, commit=True)
    with pytest.raises(ValueError, match="half_offset -1 must be a commit-log offset"):
        store.end_transaction(-1, commit=True)
    assert store.internals.commit_log.max_offset == end  # nothing written
    assert len(store.open_transactions()) == 1


def test_a_half_sent_with_the_prepared_sysflag_is_stored_as_rocketmq_stores_it(make_store):
    store = make_store()
    r = store.put(Message("T", b"prepared", sysflag=4, queue_id=0,
                          properties={"TRAN_MSG": "true", "PGROUP": "PG", "UNIQ_KEY": "P1"}))
    h = store.message_at(r.phys_offset)
    assert (h.topic, h.sysflag, h.queue_offset) == (HALF, 0, 0)  # NOT_TYPE, in the half queue
    store.wait_dispatched()
    assert [t.message_id for t in store.open_transactions()] == ["P1"]


def test_a_batch_may_not_hold_a_half(make_store):
    store = make_store()
    r = store.put_batch([Message("T", b"plain"), _half(UNIQ_KEY="U6")])
    assert r.status is PutStatus.MESSAGE_ILLEGAL and r.error_index == 1
    assert "may not hold a transaction's half (TRAN_MSG=true)" in r.error
    store.wait_dispatched()
    assert store.max_offset("T", 0) == store.max_offset("T", 1) == 0


def test_a_producer_may_not_put_to_the_transaction_topics(make_store):
    store = make_store()
    for topic in (HALF, OP, "TRANS_CHECK_MAX_TIME_TOPIC"):
        r = store.put(Message(topic, b"forged", queue_id=0))
        assert r.status is PutStatus.NO_PERMISSION and "is a system topic" in r.error


def test_an_open_transaction_is_checked_back_then_discarded(make_store, manual_clock):
    store = make_store(FAST)
    asked = []
    store.set_transaction_checker(asked.append)
    born = manual_clock.now
    r = store.put(_half(UNIQ_KEY="U4"))
    store.put(_half(body=b"other"))  # one without UNIQ_KEY goes the same way
    _ticked(store)
    assert asked == [] and store.transaction_status()["checks"] == 0
    manual_clock.now = born + 3000  # the timeout: the first check
    wait_for(lambda: len(asked) == 2, what="the first checks")
    first = asked[0]
    assert (first.producer_group, first.message_id) == ("PG", "U4")
    copy = first.message
    assert (copy.topic, copy.queue_offset, copy.born_timestamp) == (HALF, 2, born)
    assert copy.properties_text.startswith("REAL_TOPIC\x01T\x02TRANSACTION_CHECK_TIMES\x011")
    _ticked(store)
    assert len(asked) == 2  # the next only a check interval later
    manual_clock.now += 2000
    wait_for(lambda: len(asked) == 4, what="the second checks")
    assert asked[2].message.properties["TRANSACTION_CHECK_TIMES"] == "2"
    manual_clock.now += 2000  # checked twice (check max 2): discarded
    wait_for(lambda: store.transaction_status()["discarded"] == 2, what="the discards")
    assert len(asked) == 4 and store.open_transactions() == []
    store.wait_dispatched()
    gone, _other = store.read("TRANS_CHECK_MAX_TIME_TOPIC", 0, 0)
    assert (gone.body, gone.properties["TRANSACTION_CHECK_TIMES"]) == (b"order #1", "2")
    assert gone.born_timestamp == store.message_at(r.phys_offset).born_timestamp


def test_a_checked_transaction_commits_by_any_copy_once(make_store, manual_clock):
    store = make_store(FAST)
    asked = []
    store.set_transaction_checker(asked.append)
    r = store.put(_half(UNIQ_KEY="U5"))
    manual_clock.now += 3000
    wait_for(lambda: asked, what="a check")
    copy = asked[0].message
    # The producer answers with the half it knows (the original): the copy is what closes.
    c = store.end_transaction(r.phys_offset, commit=True)
    m = store.message_at(int(c.phys_offsets[0]))
    assert m.prepared_tx_offset == copy.phys_offset
    assert m.properties["TRANSACTION_CHECK_TIMES"] == "1"
    assert store.message_at(int(c.phys_offsets[1])).body == b"1"
    manual_clock.now += 10_000
    _ticked(store)
    assert len(asked) == 1 and store.open_transactions() == []
    with pytest.raises(TransactionEndedError):
        store.end_transaction(copy.phys_offset, commit=True)


def test_open_transactions_and_progress_survive_a_reopen(make_store, manual_clock):
    store = make_store(FAST)
    a = store.put(_half(UNIQ_KEY="A"))
    b = store.put(_half(UNIQ_KEY="B"))
    store.end_transaction(a.phys_offset, commit=True)
    _ticked(store)
    root = store.root
    store.close()
    store = make_store(FAST, root=root)
    assert [t.message_id for t in store.open_transactions()] == ["B"]
    store.end_transaction(b.phys_offset, commit=False)
    wait_for(lambda: store.transaction_status()["progress"] == (2, 2), what="the progress")
    store.close()
    # Where RocketMQ keeps the checker's progress: past both halves and both op records.
    with open(f"{root}/config/consumerOffset.json", encoding="utf-8") as f:
        table = json.load(f)["offsetTable"]
    assert table[f"{HALF}@CID_RMQ_SYS_TRANS"] == {"0": 2}
    assert table[f"{OP}@CID_RMQ_SYS_TRANS"] == {"0": 2}


def test_a_rocketmq_broker_store_keeps_its_pending_transactions(make_store, manual_clock,
                                                                tmp_path, broker_fixture):
    with open(broker_fixture / "MANIFEST.json", encoding="utf-8") as f:
        manifest = json.load(f)
    with tarfile.open(broker_fixture / "store.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    records = {r["commitLogOffset"]: r for r in manifest["expected"]["records"]}
    manual_clock.now = max(r["storeTimestamp"] for r in records.values())  # the broker's end
    store = make_store({"store": {"transaction_timeout_ms": 3000,
                                  "transaction_check_interval_ms": 2000}},
                       root=tmp_path / "store")
    pending = {m["keys"]: m for m in manifest["messages"] if m["kind"] == "tx-unknown-forever"}
    opened = store.open_transactions()
    assert sorted(t.message_id for t in opened) == sorted(m["msgId"] for m in pending.values())
    assert sorted((t.queue_offset, t.checks) for t in opened) == [(28, 6), (29, 6)]
    asked = []
    store.set_transaction_checker(asked.append)
    manual_clock.now += 2000  # their last checks are older than the interval: checked again
    wait_for(lambda: len(asked) == 2, what="the pending transactions' checks")
    for check in asked:
        want = records[pending[check.message.keys[0]]["storedAs"][-1]["commitLogOffset"]]
        text = want["propertiesString"].replace("TRANSACTION_CHECK_TIMES\x016",
                                                "TRANSACTION_CHECK_TIMES\x017")
        assert check.message.properties_text == text  # 4.9.8's re-append, byte for byte
        assert check.message.born_timestamp == want["bornTimestamp"]
    one = asked[0]
    c = store.end_transaction(one.message.phys_offset, commit=True)
    m = store.message_at(int(c.phys_offsets[0]))
    assert (m.topic, m.sysflag, m.prepared_tx_offset) == ("FixTx", 8, one.message.phys_offset)
    assert store.message_at(int(c.phys_offsets[1])).body == str(
        one.message.queue_offset).encode()
    assert [t.message_id for t in store.open_transactions()] == [asked[1].message_id]


def test_a_store_without_transactions_records_no_checker_progress(make_store):
    store = make_store()
    store.put(Message("T", b"plain", queue_id=0))
    store.wait_dispatched()
    _ticked(store)
    root = store.root
    store.close()
    path = f"{root}/config/consumerOffset.json"
    try:
        with open(path, encoding="utf-8") as f:
            table = json.load(f)["offsetTable"]
    except FileNotFoundError:
        table = {}
    assert [key for key in table if "CID_RMQ_SYS_TRANS" in key] == []


def test_op_records_naming_a_half_twice_end_it_once(make_store, caplog):
    """RocketMQ 5 writes several offsets in one op record, and may name a half again."""
    from mqstore.append.transactions import op_record

    store = make_store()
    first = store.put(_half(UNIQ_KEY="D1"))
    store.put(_half(UNIQ_KEY="D2"))
    store.wait_dispatched()
    assert len(store.open_transactions()) == 2
    service = store._transactions
    twice = op_record(0, service.put_ctx)
    assert service.appender.put_copies([twice, twice]).status is PutStatus.PUT_OK
    store.wait_dispatched()
    ticks = store.transaction_status()["ticks"]
    _ticked(store, ticks)
    assert [t.message_id for t in store.open_transactions()] == ["D2"]
    with pytest.raises(TransactionEndedError):
        store.end_transaction(first.phys_offset, commit=True)
    failed = [r.getMessage() for r in caplog.records if r.name == "mqstore.runtime.transactions"
              and r.levelname == "ERROR"]
    assert failed == []  # no tick failed on the second naming

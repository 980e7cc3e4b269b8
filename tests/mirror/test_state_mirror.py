"""The state mirror inside one process (master and slave stores of the embedding API, worker
processes as by default): the registry, the change feed, the files a slave holds compared
byte for byte with the master's, the install a promotion runs, garbled state records, and the
system topic kept from clients. Real ``serve`` processes, SIGKILLs and the official client are
in test_state_mirror_processes.py."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

import pytest

from mqstore import Message, MessageBatch, testing
from mqstore.errors import SystemTopicError
from mqstore.format.state_record import STATE_TOPIC, StateOp, properties_of
from mqstore.message import PutStatus
from mqstore.mirror.install import MirrorIncompleteError, install_mirror_files
from mqstore.mirror.replica_state import read_state
from mqstore.ops.admin import StoreAdmin
from mqstore.ops.checking.checker import check_store
from mqstore.ops.stats import store_stats
from mqstore.storage import state_feed
from mqstore.storage.state_files import split_path, state_files, unit_of
from mqstore.store.mirror_calls import install_mirror

SEG = 65536
WAIT_S = 30.0
FAST = {"ha_heartbeat_interval_ms": 100, "ha_housekeeping_interval_ms": 3000}


def wait_for(condition, what: str = "condition"):
    if not testing.wait_for(condition, timeout=WAIT_S):
        raise AssertionError(f"{what} not within {WAIT_S} s")


@pytest.fixture
def pair(make_store, tmp_path):
    """``pair(role="async_master", **store)``: a master listening on a free port and a slave
    of it, both started, 64 KiB segments."""
    def make(role="async_master", slave=True, **store):
        cfg = {"commit_log": {"segment_bytes": SEG}, "store": {**FAST, **store}}
        m = make_store({**cfg, "store": {**cfg["store"], "role": role},
                        "server": {"ha_listen": "127.0.0.1:0"}}, root=tmp_path / "master")
        m.replication.start()
        if not slave:
            return m, None
        s = make_store({**cfg, "store": {**cfg["store"], "role": "slave"},
                        "server": {"ha_master": m.replication.address}},
                       root=tmp_path / "slave")
        s.replication.start()
        return m, s
    return make


def promotable_slave(make_store, m, root: Path, **store):
    """A started slave of ``m`` that listens for slaves of its own once promoted."""
    s = make_store({"commit_log": {"segment_bytes": SEG},
                    "store": {**FAST, **store, "role": "slave"},
                    "server": {"ha_master": m.replication.address,
                               "ha_listen": "127.0.0.1:0"}}, root=root)
    s.replication.start()
    return s


def state_bytes(root: Path) -> dict[str, bytes]:
    return {rel: (root / rel).read_bytes() for rel in state_files(str(root))}


def mirrored(m, s) -> bool:
    """The slave's mirror holds the master's state files, byte for byte."""
    return state_bytes(Path(m.root)) == state_bytes(Path(s.root) / "replica")


def put(store, n: int, topic: str = "orders", queues: int = 8) -> None:
    r = store.put_batch(MessageBatch(topic=topic, bodies=[b"%s-%d" % (topic.encode(), i)
                                                          for i in range(n)],
                                     queue_ids=[i % queues for i in range(n)]))
    assert r.status.stored, r


def busy_master(m, manual_clock) -> dict:
    """Every kind of state: topics created, updated and deleted, a pop group acking some, a
    group committing, a registered subscription, a deleted group. Returns what is in flight."""
    m.create_topic("orders", queues=8)
    m.create_topic("audit", queues=2)
    m.update_topic("audit", write_queues=1)
    put(m, 200)
    m.wait_dispatched()
    popped = m.pop("billing", "orders", max_msgs=64, invisible_ms=30_000, consume_from="first")
    assert len(popped) == 64
    assert m.ack([p.receipt_handle for p in popped[:40]]) == [None] * 40
    with m.consumer("reports", "orders", consume_from="first") as c:
        assert len(c.poll(120)) == 120
        c.commit()
    with m.consumer("gone", "orders", consume_from="first") as c:
        c.poll(10)
        c.commit()
    m.delete_consumer_group("gone")
    m.register_subscription("sql", "orders", "a > 1", "SQL92")
    return {(p.queue_id, p.queue_offset) for p in popped[40:]}


# -- the registry and the feed ------------------------------------------------------------------
def test_the_registry_names_the_state_files_and_nothing_else(pair, manual_clock):
    m, _ = pair(slave=False)
    busy_master(m, manual_clock)
    names = set(state_files(m.root))
    assert names == {"config/topics.json", "config/consumerOffset.json",
                     "config/consumerOffset.json.journal", "subscriptions.json",
                     "consumer/groups/reports/orders/recorded",
                     "consumer/pop/orders@billing.journal"}
    root = Path(m.root)
    # Locks, membership and derived files exist and are not state.
    for rel in ("config/consumerOffset.json.lock", "config/topics.json.lock",
                "consumer/pop/orders@billing.json.lock", "consumequeue/orders/0/" + "0" * 20,
                "config/mqstore_queues.json", "checkpoint"):
        assert (root / rel).exists(), rel
        assert unit_of(rel) is None, rel
    assert unit_of("consumer/pop/orders@billing.journal.damaged") is None
    assert unit_of("consumer/groups/reports/orders/members/123") is None
    unit, member = unit_of("consumer/pop/orders@billing.json")
    assert unit.name == "pop:orders@billing" and member.kind == "document"
    assert unit.lock_path() == "consumer/pop/orders@billing.json.lock"
    assert split_path(str(root / "config" / "topics.json")) == (m.root, "config/topics.json")
    assert split_path(str(root / "config" / "topics.json.tmp")) is None


def test_the_feed_takes_lines_only_while_a_master_ships(make_store, tmp_path):
    store = make_store(root=tmp_path / "alone")
    store.create_topic("orders", queues=2)
    put(store, 10, queues=2)
    store.wait_dispatched()
    with store.consumer("g", "orders", consume_from="first") as c:
        c.poll(10)
        c.commit()
    assert not (tmp_path / "alone" / "state").exists()  # no shipper, no feed
    reader = state_feed.FeedReader(store.root)
    try:
        other = make_store(root=tmp_path / "alone", read_only=True)  # another opener
        popped = other.pop("p", "orders", max_msgs=3, consume_from="first")
        other.ack([x.receipt_handle for x in popped])
        with store.consumer("g", "orders") as c:
            put(store, 2, queues=2)
            store.wait_dispatched()
            assert len(c.poll(10, timeout_ms=5000)) == 2
            c.commit()
        # The read-only opener's pop and ack, the commit, the rewrite at the consumer's close.
        assert reader.read() == ["consumer/pop/orders@p.journal",
                                 "config/consumerOffset.json.journal",
                                 "config/consumerOffset.json"]
        assert reader.read() == []
    finally:
        reader.close()


# -- a slave holds the master's state ------------------------------------------------------------
def test_a_slave_holds_the_masters_state_files_byte_for_byte(pair, manual_clock):
    m, s = pair()
    busy_master(m, manual_clock)
    wait_for(lambda: mirrored(m, s), "the mirror")
    state, problem = read_state(s.root)
    assert problem is None and state["complete"] is not None and state["rejected"] == 0
    # More changes, a document replaced and a journal grown, reach it too.
    m.update_topic("orders", write_queues=6)
    popped = m.pop("billing", "orders", max_msgs=5, invisible_ms=30_000)
    m.ack([p.receipt_handle for p in popped])
    wait_for(lambda: mirrored(m, s), "the later changes")
    # A group's config (a state file) and its dead letters (records of the log) reach it.
    m.set_group_config("billing", retry_max_times=0)
    doomed = m.pop("billing", "orders", max_msgs=3, invisible_ms=1000)
    manual_clock.advance(1001)
    m.pop("billing", "orders", max_msgs=1, invisible_ms=30_000)  # buries the three
    assert m.dead_letter_counts() == {"billing": 3}
    wait_for(lambda: mirrored(m, s), "the group config")
    assert "config/subscriptionGroup.json" in state_files(m.root)
    wait_for(lambda: s.max_offset("%DLQ%billing", 0) == 3, "the dead letters on the slave")
    dead = s.read("%DLQ%billing", 0, 0, 10)
    assert sorted(dead.message(i).properties["ORIGIN_MESSAGE_ID"] for i in range(3)) == sorted(
        p.msg_id for p in doomed)
    status = s.replication.status()["state_mirror"]
    assert status["complete"] and status["rejected"] == 0
    assert m.replication.status()["state_mirror"]["snapshots"] >= 1
    # The system topic is the slave's too, and is hidden from it as from the master.
    assert STATE_TOPIC not in s.topics() and STATE_TOPIC in s.topics(include_system=True)


def test_a_large_state_file_goes_in_chunks(pair):
    m, s = pair()
    m.create_topic("orders", queues=8)
    put(m, 3000)
    m.wait_dispatched()
    for _ in range(6):  # a journal of tens of KiB: chunks of a quarter segment
        popped = m.pop("billing", "orders", max_msgs=400, invisible_ms=60_000,
                       consume_from="first")
        m.ack([p.receipt_handle for p in popped[::2]])
    size = (Path(m.root) / "consumer/pop/orders@billing.journal").stat().st_size
    assert size > SEG // 4
    s.replication.stop()  # the next connection's snapshot puts the whole journal, chunked
    s.replication.start()
    wait_for(lambda: mirrored(m, s), "the mirror")


def test_under_sync_master_an_answered_ack_is_on_the_slave(pair):
    m, s = pair(role="sync_master")
    m.create_topic("orders", queues=8)
    wait_for(lambda: m.replication.status()["slaves"], "the slave")
    put(m, 50)
    m.wait_dispatched()
    for _ in range(5):
        popped = m.pop("billing", "orders", max_msgs=4, invisible_ms=30_000,
                       consume_from="first")
        assert m.ack([p.receipt_handle for p in popped]) == [None] * len(popped)
        # The ack returned: the slave has appended the master's whole log, state included.
        assert s.max_phys_offset >= m.max_phys_offset
    wait_for(lambda: mirrored(m, s), "the mirror")


# -- promotion: the mirror becomes the state -----------------------------------------------------
def test_install_on_a_stopped_slave_then_opened_as_master(pair, make_store, manual_clock,
                                                          tmp_path, caplog):
    m, s = pair()
    in_flight = busy_master(m, manual_clock)
    s_root = Path(s.root)
    s.create_topic("slave-own", queues=1)  # the slave's own state, which must go aside
    wait_for(lambda: state_bytes(Path(m.root)) == state_bytes(s_root / "replica"), "mirror")
    master_state = state_bytes(Path(m.root))
    master_groups = m.consumer_groups()
    s.close()
    m.close()
    report = install_mirror_files(str(s_root))
    assert set(report.installed) == set(master_state)
    assert report.set_aside == ["config/topics.json"]
    assert Path(report.aside).parent == s_root / "replica-previous"
    assert b"slave-own" in (Path(report.aside) / "config/topics.json").read_bytes()
    assert state_bytes(s_root) == master_state
    assert state_files(str(s_root / "replica")) == []
    # Opened as a master, it serves the group from where the master left it.
    p = make_store({"commit_log": {"segment_bytes": SEG}}, root=s_root)
    assert p.consumer_groups() == master_groups
    assert p.topic_config("orders").write_queue_nums == 8
    assert p.topic_config("audit").write_queue_nums == 1
    assert p.topic_config("slave-own") is None
    manual_clock.advance(31_000)  # the deliveries in flight at the master's end run out
    again = p.pop("billing", "orders", max_msgs=200, invisible_ms=30_000)
    redelivered = {(x.queue_id, x.queue_offset) for x in again if x.delivery_attempt > 1}
    assert redelivered == in_flight
    assert len(again) == len(in_flight) + (200 - 64)  # and the messages never popped
    # New sends go to the 8 write queues of the topic, not the default's 4.
    r = p.put_batch(MessageBatch(topic="orders", bodies=[b"new"] * 64))
    assert sorted(set(r.queue_ids.tolist())) == list(range(8))


def test_install_refuses_a_mirror_without_a_complete_snapshot(pair, tmp_path):
    m, s = pair()
    m.create_topic("orders", queues=8)
    wait_for(lambda: read_state(s.root)[0]["complete"] is not None, "a snapshot")
    s.close()
    root = tmp_path / "slave"
    (root / "replica" / "state.json").unlink()
    own = state_bytes(root)
    with pytest.raises(MirrorIncompleteError, match="no complete snapshot of the master's "
                                                    "state was applied"):
        install_mirror_files(str(root))
    assert state_bytes(root) == own and not (root / "replica-previous").exists()


def test_a_snapshot_whose_beginning_the_slave_lacks_does_not_count(make_store, tmp_path):
    """A slave whose log starts inside a snapshot holds only part of it."""
    from mqstore.mirror.applier import StateApplier

    store = make_store(root=tmp_path / "s")
    root = tmp_path / "s"
    applier = StateApplier(_View(str(root), {}), following=lambda: True)
    applier._apply(StateOp("snapshot-end", op_id=7), 100)
    assert read_state(str(root))[0]["complete"] is None
    with pytest.raises(MirrorIncompleteError, match="no complete snapshot"):
        install_mirror_files(str(root))
    applier._apply(StateOp("snapshot-begin", op_id=8), 200)
    applier._apply(StateOp("snapshot-end", op_id=8), 300)
    assert read_state(str(root))[0]["complete"]["offset"] == 300
    store.close()


def test_an_install_cut_short_is_finished_by_the_next(pair, tmp_path, monkeypatch):
    m, s = pair()
    m.create_topic("orders", queues=8)
    put(m, 20)
    m.wait_dispatched()
    with m.consumer("g", "orders", consume_from="first") as c:
        c.poll(20)
        c.commit()
    s.create_topic("own", queues=1)
    wait_for(lambda: mirrored(m, s), "the mirror")
    want = state_bytes(Path(m.root))
    s.close()
    root = tmp_path / "slave"
    import mqstore.mirror.install as install

    real, moves = install._move, []

    def dying(src, dst):
        if len(moves) == 2:
            raise KeyboardInterrupt("killed mid-install")
        moves.append(src)
        real(src, dst)
    monkeypatch.setattr(install, "_move", dying)
    with pytest.raises(KeyboardInterrupt):
        install_mirror_files(str(root))
    monkeypatch.setattr(install, "_move", real)
    report = install_mirror_files(str(root))
    assert state_bytes(root) == want
    assert b'"own"' in (Path(report.aside) / "config/topics.json").read_bytes()
    assert len(list((root / "replica-previous").iterdir())) == 1


def test_install_mirror_on_an_open_slave(pair, manual_clock, caplog):
    """The call a promotion makes: on the open store, the consumer side reopened."""
    m, s = pair()
    in_flight = busy_master(m, manual_clock)
    wait_for(lambda: mirrored(m, s), "the mirror")
    groups = m.consumer_groups()
    m.close()
    s.replication.stop()
    with caplog.at_level(logging.WARNING, logger="mqstore.store.mirror_calls"):
        report = install_mirror(s)
    assert "state mirror installed" in caplog.text and report.aside in caplog.text
    assert s.consumer_groups() == groups
    assert s.topic_config("orders").write_queue_nums == 8
    assert s.topic_config("audit").write_queue_nums == 1
    assert {(x.queue_id, x.queue_offset) for x in s.pop("billing", "orders", max_msgs=10)} \
        .isdisjoint(in_flight)  # still invisible: in flight since the master popped them
    with pytest.raises(MirrorIncompleteError):  # the mirror is spent
        install_mirror(s)


@pytest.mark.loops("thread")
def test_a_deleted_topic_is_deleted_in_the_mirror_and_after_the_install(pair, make_store,
                                                                        tmp_path):
    """Deleting needs the consume queues written in the deleting process: threads."""
    m, s = pair()
    m.create_topic("orders", queues=8)
    m.create_topic("old", queues=2)
    put(m, 20, topic="old", queues=2)
    m.wait_dispatched()
    m.pop("g", "old", max_msgs=5, consume_from="first")
    with m.consumer("c", "old", consume_from="first") as c:
        c.poll(5)
        c.commit()
    wait_for(lambda: "consumer/pop/old@g.journal" in state_files(str(tmp_path / "slave/replica")),
             "the pop state of the topic")
    m.delete_topic("old")
    wait_for(lambda: mirrored(m, s), "the deletion")
    replica = set(state_files(str(tmp_path / "slave/replica")))
    assert "config/mqstore_deleted_topics.json" in replica
    assert not {"consumer/pop/old@g.journal", "consumer/groups/c/old/recorded"} & replica
    s.close()
    m.close()
    install_mirror_files(str(tmp_path / "slave"))
    p = make_store({"commit_log": {"segment_bytes": SEG}}, root=tmp_path / "slave")
    assert sorted(p.topic_configs()) == ["orders"]
    assert p.consumer_groups() == {}


# -- garbled records ---------------------------------------------------------------------------
def test_a_garbled_state_record_is_reported_and_dispatch_goes_on(pair, caplog):
    m, s = pair()
    m.create_topic("orders", queues=8)
    wait_for(lambda: mirrored(m, s), "the mirror")
    bad = [
        {"MQSTATE_OP": "explode"},
        {**properties_of(StateOp("write", "config/topics.json", pos=0)), "MQSTATE_POS": "-1"},
        {**properties_of(StateOp("put", "x", op_id=1, total=1)), "MQSTATE_PATH": "../../etc"},
        properties_of(StateOp("delete", "commitlog/00000000000000000000")),
    ]
    r = m.replication.appender.put_state(MessageBatch(
        topic=STATE_TOPIC, bodies=[b"junk"] * len(bad), queue_ids=0, properties=bad))
    assert r.status.stored
    put(m, 10)
    wait_for(lambda: s.max_phys_offset == m.max_phys_offset, "the slave")
    s.wait_dispatched()
    wait_for(lambda: read_state(s.root)[0]["rejected"] == 4, "the rejections")
    assert s.max_offset("orders", 0) == 2  # dispatch went on past them
    state = read_state(s.root)[0]
    assert state["last_rejected"].startswith(f"commit-log offset {int(r.phys_offsets[-1])}: ")
    assert "not a state file of the registry" in state["last_rejected"]
    assert (Path(s.root) / "commitlog").exists()
    m.update_topic("orders", write_queues=4)
    wait_for(lambda: mirrored(m, s), "the mirror after them")


def test_applying_twice_leaves_the_mirror_as_once(make_store, tmp_path):
    from mqstore.mirror.applier import StateApplier

    root = tmp_path / "s"
    root.mkdir()
    ops = [StateOp("snapshot-begin", op_id=1),
           StateOp("put", "config/topics.json", op_id=5, total=6, body=b"abc"),
           StateOp("put", "config/topics.json", pos=3, op_id=5, total=6, body=b"def"),
           StateOp("put", "config/consumerOffset.json.journal", op_id=6, total=2, body=b"j1"),
           StateOp("write", "config/consumerOffset.json.journal", pos=2, body=b"j2"),
           StateOp("delete", "subscriptions.json"),
           StateOp("snapshot-end", op_id=1,
                   body=b"config/topics.json\nconfig/consumerOffset.json.journal\n")]
    messages = {i * 100: _Msg(properties_of(op), op.body) for i, op in enumerate(ops)}
    applier = StateApplier(_View(str(root), messages), following=lambda: True)
    batch = _Batch(sorted(messages))
    applier.dispatch(batch)
    first = state_bytes(root / "replica")
    assert first == {"config/topics.json": b"abcdef", "config/consumerOffset.json.journal": b"j1j2"}
    for start in range(len(ops)):  # re-dispatched from any record on
        applier.dispatch(_Batch(sorted(messages)[start:]))
        assert state_bytes(root / "replica") == first
    assert not [p for p in (root / "replica").rglob("*") if ".put-" in p.name]
    assert read_state(str(root))[0]["complete"]["snapshot"] == 1


# -- system topics -----------------------------------------------------------------------------
def test_system_topics_are_refused_to_clients_and_left_out_of_listings(pair, tmp_path):
    m, s = pair()
    m.create_topic("orders", queues=8)
    put(m, 10)
    wait_for(lambda: mirrored(m, s), "the mirror")
    m.wait_dispatched()
    r = m.put(Message(STATE_TOPIC, b"x"))
    assert r.status is PutStatus.NO_PERMISSION and "system topic" in r.error
    r = m.put_batch([Message("orders", b"ok"), Message("rmq_sys_OTHER", b"x")])
    assert r.status is PutStatus.NO_PERMISSION and r.error_index == 1
    for call in (lambda: m.pop("g", STATE_TOPIC), lambda: m.consumer("g", STATE_TOPIC),
                 lambda: m.peek("g", STATE_TOPIC), lambda: m.consumer_lag("g", STATE_TOPIC),
                 lambda: m.create_topic("rmq_sys_MINE", queues=1)):
        with pytest.raises(SystemTopicError, match="is a system topic"):
            call()
    assert m.topics() == ["orders"]
    assert STATE_TOPIC in m.topics(include_system=True)
    assert m.max_offset(STATE_TOPIC, 0) > 0  # tools still read it
    stats = store_stats(m.root, m.config)
    assert [t["topic"] for t in stats["topics"]] == ["orders"]
    rows = StoreAdmin(m.root, m.config).topic_list()  # what `mqstore topic list` filters
    assert [r["topic"] for r in rows] == ["orders", STATE_TOPIC]
    assert STATE_TOPIC not in m.topic_configs()
    assert m.consumed_floor() == (-1, None)  # no group: nothing held back
    assert m.consumer_groups() == {}
    m.close()
    # Standard records: the checker (every record, its consume-queue unit) finds them right.
    report = check_store(str(tmp_path / "master"), m.config)
    assert report.clean and report.records > 0, report.problems


class _Msg:
    def __init__(self, props: dict, body: bytes) -> None:
        from mqstore.format.properties import encode_properties
        self.properties_text = encode_properties(props)
        self.body = body


class _View:
    def __init__(self, root: str, messages: dict) -> None:
        self.root = root
        self.message_at = messages.get


class _Batch:
    def __init__(self, offsets: list[int]) -> None:
        self.topics = [STATE_TOPIC] * len(offsets)
        self.phys_offsets = offsets


def test_what_a_put_did_not_store_goes_again_in_a_snapshot(tmp_path):
    """The shipper against a put that refuses (a full disk): the wait says so, and once puts
    work again every state file goes whole, between snapshot markers."""
    import numpy as np

    from mqstore.message import BatchPutResult
    from mqstore.mirror.shipper import StateShipper

    root = tmp_path / "m"
    (root / "config").mkdir(parents=True)
    (root / "config/topics.json").write_bytes(b"{}")
    shipped: list[list[dict]] = []
    refusing = [False]

    def put_state(batch):
        if refusing[0]:
            return BatchPutResult.rejected(PutStatus.SERVICE_NOT_AVAILABLE, "disk full")
        shipped.append([dict(p) for p in batch.properties])
        n = len(batch.bodies)
        z = np.zeros(n, dtype=np.int64)
        return BatchPutResult(PutStatus.PUT_OK, z, z, z, z, 0, None)

    shipper = StateShipper(str(root), put_state, interval_s=60, chunk_bytes=1024)
    shipper.start()
    try:
        assert shipper.ship_now(wait=True, timeout_s=WAIT_S)
        ops = [p["MQSTATE_OP"] for batch in shipped for p in batch]
        assert ops == ["snapshot-begin", "put", "snapshot-end"]
        refusing[0] = True
        (root / "config/topics.json").write_bytes(b'{"a":1}')
        state_feed.changed(str(root / "config/topics.json"))
        assert not shipper.ship_now(wait=True, timeout_s=WAIT_S)
        assert "disk full" in shipper.status()["last_error"]
        refusing[0] = False
        shipped.clear()
        assert shipper.ship_now(wait=True, timeout_s=WAIT_S)
        ops = [(p["MQSTATE_OP"], p.get("MQSTATE_PATH")) for batch in shipped for p in batch]
        assert ops == [("snapshot-begin", None), ("put", "config/topics.json"),
                       ("snapshot-end", None)]
        assert shipper.status()["last_error"] is None and shipper.status()["snapshots"] == 2
    finally:
        shipper.stop()


def test_a_master_without_state_ships_nothing_until_its_first_state_file(pair):
    m, s = pair()
    put(m, 10, topic="plain", queues=4)  # auto-created without a topics.json: no state
    m.wait_dispatched()
    end = m.max_phys_offset
    assert end == sum(int(x) for x in [m.read("plain", q, 0).sizes.sum() for q in range(4)])
    wait_for(lambda: s.max_phys_offset == end, "the slave")
    assert STATE_TOPIC not in m.topics(include_system=True)
    assert read_state(s.root)[0]["complete"] is None
    m.create_topic("orders", queues=8)  # the first state file: the snapshot comes with it
    wait_for(lambda: mirrored(m, s) and read_state(s.root)[0]["complete"] is not None,
             "the snapshot")


def test_a_slave_holds_the_schedule_progress_and_delivers_nothing_itself(pair, manual_clock):
    m, s = pair()
    r = m.put(Message("later", b"x", properties={"DELAY": "1"}, queue_id=0))
    assert r.status is PutStatus.PUT_OK
    manual_clock.advance(1_000)
    wait_for(lambda: m.max_offset("later", 0) == 1, "the master's delivery")
    master_file = Path(m.root) / "config" / "delayOffset.json"
    wait_for(lambda: master_file.exists() and b"{1:1" in master_file.read_bytes(),
             "the master's progress recorded")
    replica = Path(s.root) / "replica" / "config" / "delayOffset.json"
    wait_for(lambda: replica.exists() and replica.read_bytes() == master_file.read_bytes(),
             "delayOffset.json on the slave")
    wait_for(lambda: s.max_offset("later", 0) == 1, "the copy replicated")
    status = s.schedule_status()
    assert not status["running"] and status["delivered"] == 0
    assert not (Path(s.root) / "config" / "delayOffset.json").exists()
    assert mirrored(m, s)


def test_a_promoted_slave_goes_on_with_the_schedule_delivering_nothing_twice(
        pair, make_store, tmp_path, manual_clock):
    m, _none = pair(slave=False)
    s = promotable_slave(make_store, m, tmp_path / "slave")
    for body, props in ((b"a0", {"DELAY": "1"}), (b"a1", {"DELAY": "1"}),
                        (b"b", {"DELAY": "2"}), (b"t", {"TIMER_DELAY_SEC": "8"})):
        assert m.put(Message("later", body, properties=props, queue_id=0)).status.stored
    manual_clock.advance(1_000)
    wait_for(lambda: m.max_offset("later", 0) == 2, "the master's level-1 deliveries")
    wait_for(lambda: (Path(m.root) / "config/delayOffset.json").exists()
             and s.max_offset("later", 0) == 2 and mirrored(m, s), "the slave caught up")
    m.close()
    wait_for(lambda: not s.replication.client.connected, "the slave sees its master gone")
    assert s.promote()["mirror"] is not None
    manual_clock.advance(10_000)
    wait_for(lambda: s.max_offset("later", 0) == 4, "the promoted slave's deliveries")
    status = s.schedule_status()
    wait_for(lambda: s.schedule_status()["ticks"] > status["ticks"] + 1, "a tick more")
    assert [x.body for x in s.read("later", 0, 0)] == [b"a0", b"a1", b"b", b"t"]


def test_a_promoted_slave_continues_the_open_transactions(pair, make_store, tmp_path,
                                                          manual_clock):
    """Halves, op records and re-appended halves travel in the log, the checker's progress
    (CID_RMQ_SYS_TRANS's offsets) in the mirror: the promoted slave holds the same open
    transactions, checks them, and ends them by any copy's offset."""
    txn = {"transaction_timeout_ms": 3000, "transaction_check_interval_ms": 2000}
    m, _none = pair(slave=False, **txn)
    s = promotable_slave(make_store, m, tmp_path / "slave", **txn)
    halves = {}
    for key in ("A", "B", "C"):
        halves[key] = m.put(Message("pay", key.encode(), queue_id=0, properties={
            "TRAN_MSG": "true", "PGROUP": "shop", "UNIQ_KEY": key}))
        assert halves[key].status.stored
    m.end_transaction(halves["A"].phys_offset, commit=True)
    asked = []
    m.set_transaction_checker(asked.append)
    manual_clock.advance(3_000)  # B and C checked once on the master: their halves re-appended
    wait_for(lambda: len(asked) == 2, "the master's checks")
    wait_for(lambda: m.transaction_status()["progress"] == (3, 1), "the master's progress")
    assert s.transaction_status()["running"] is False  # a slave checks nothing
    wait_for(lambda: s.max_offset("pay", 0) == 1 and mirrored(m, s), "the slave caught up")
    m.close()
    wait_for(lambda: not s.replication.client.connected, "the slave sees its master gone")
    assert s.promote()["mirror"] is not None
    wait_for(lambda: s.transaction_status()["running"], "the promoted slave's checker")
    opened = s.open_transactions()
    assert [(t.message_id, t.queue_offset, t.checks) for t in opened] == [("B", 3, 1),
                                                                          ("C", 4, 1)]
    promoted = []
    s.set_transaction_checker(promoted.append)
    manual_clock.advance(2_000)
    wait_for(lambda: len(promoted) == 2, "the promoted slave's checks")
    assert sorted((c.message_id, c.message.properties["TRANSACTION_CHECK_TIMES"])
                  for c in promoted) == [("B", "2"), ("C", "2")]
    c = s.end_transaction(halves["B"].phys_offset, commit=True)  # the original half's offset
    assert c.status.stored
    s.end_transaction(halves["C"].phys_offset, commit=False)
    s.wait_dispatched()
    assert [x.body for x in s.read("pay", 0, 0)] == [b"A", b"B"]
    assert s.open_transactions() == []


def test_a_promoted_slave_keeps_a_fifo_groups_order_attempts_and_settings(
        pair, make_store, tmp_path, manual_clock):
    """A FIFO group's setting (subscriptionGroup.json) and its pop state (the message in
    flight, its delivery attempts) are the promoted slave's: the queue stays held behind the
    message in flight, which is dead-lettered at the attempt the master had reached, then the
    queue moves on in order."""
    m, _none = pair(slave=False)
    s = promotable_slave(make_store, m, tmp_path / "slave")
    m.set_group_config("G", consume_message_orderly=True, retry_max_times=1)
    for body in (b"m0", b"m1", b"m2"):
        assert m.put(Message("T", body, queue_id=0)).status.stored
    wait_for(lambda: m.max_offset("T", 0) == 3, "the master's queue")
    got = m.pop("G", "T", 2, 1000, consume_from="first")
    assert [(x.queue_offset, x.delivery_attempt) for x in got] == [(0, 1), (1, 1)]
    m.ack(got[0].receipt_handle)
    manual_clock.advance(1001)
    again = m.pop("G", "T", 8, 1000)  # m1 again, attempt 2 (its last); m2 held behind it
    assert [(x.queue_offset, x.delivery_attempt) for x in again] == [(1, 2)]
    assert m.put(Message("T", b"m3", queue_id=0)).status.stored
    wait_for(lambda: m.max_offset("T", 0) == 4 and s.max_offset("T", 0) == 4
             and mirrored(m, s), "the slave caught up")
    m.close()
    wait_for(lambda: not s.replication.client.connected, "the slave sees its master gone")
    assert "config/subscriptionGroup.json" in s.promote()["mirror"]["installed"]
    config = s.group_config("G")
    assert config.orderly and config.retry_max_times == 1
    assert s.pop("G", "T", 8, 1000) == []  # m1 still in flight: nothing newer
    manual_clock.advance(1001)
    after = s.pop("G", "T", 8, 1000)  # m1's attempts are used up: the DLQ, then m2, m3
    assert [(x.queue_offset, x.delivery_attempt, x.body) for x in after] == [
        (2, 1, b"m2"), (3, 1, b"m3")]
    s.wait_dispatched()
    dead = s.read("%DLQ%G", 0, 0, 10)
    assert [dead.message(i).body for i in range(len(dead))] == [b"m1"]
    assert s.dead_letter_counts() == {"G": 1}


def test_a_rocketmq_store_mastered_by_mqstore_keeps_what_rocketmqs_own_store_loads(
        make_store, tmp_path, broker_fixture):
    """RocketMQ 4.9.8's broker store (the broker fixture) opened as a master whose state is
    mirrored: its log gains the state records, and the directory keeps what RocketMQ's own
    ``DefaultMessageStore.load`` requires (no Java here: its rules, checked on the files):
    commit-log files of the configured size named by their offsets, consume queues in
    directories named by queue ids holding files of the configured size, every record whole
    (magic, lengths, CRC: its recovery's check), and the user's topics' units as RocketMQ
    wrote them. The slave holds the broker's own config files."""
    import tarfile
    with tarfile.open(broker_fixture / "store.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    root = tmp_path / "store"
    cq_file = 6000  # the fixture broker's mappedFileSizeConsumeQueue
    before = {p.relative_to(root): p.read_bytes()
              for p in (root / "consumequeue").glob("*/*/*")}
    cfg = {"consume_queue": {"file_units": cq_file // 20}, "store": FAST}
    m = make_store({**cfg, "store": {**FAST, "role": "async_master"},
                    "server": {"ha_listen": "127.0.0.1:0"}}, root=root)
    m.replication.start()
    s = make_store({**cfg, "store": {**FAST, "role": "slave"},
                    "server": {"ha_master": m.replication.address}}, root=tmp_path / "slave")
    s.replication.start()
    popped = m.pop("billing", "FixNormal", max_msgs=8, invisible_ms=30_000,
                   consume_from="first")
    m.ack([p.receipt_handle for p in popped[:5]])
    wait_for(lambda: mirrored(m, s), "the mirror")
    replica = set(state_files(str(tmp_path / "slave" / "replica")))
    assert {"config/topics.json", "config/subscriptionGroup.json", "config/delayOffset.json",
            "config/consumerOffset.json"} <= replica
    wait_for(lambda: m.max_offset(STATE_TOPIC, 0) > 0, "the state records in the log")
    s.close()
    m.wait_dispatched()
    m.close()
    segment = m.config.commit_log.segment_bytes
    logs = sorted((root / "commitlog").iterdir())
    assert [p.name for p in logs] == [f"{i * segment:020d}" for i in range(len(logs))]
    assert all(p.stat().st_size == segment for p in logs)
    for queue in (root / "consumequeue").glob("*/*"):
        assert queue.name.isdigit(), queue
        files = sorted(queue.iterdir())
        assert [p.name for p in files] == [f"{i * cq_file:020d}" for i in range(len(files))]
        assert all(p.stat().st_size == cq_file for p in files), queue
    assert (root / "consumequeue" / STATE_TOPIC / "0").is_dir()
    for rel, data in before.items():  # RocketMQ's units of the user's topics, unchanged
        now = (root / rel).read_bytes()
        used = len(data.rstrip(b"\0")) + (-len(data.rstrip(b"\0")) % 20)
        assert now[:used] == data[:used], rel
    report = check_store(str(root), m.config)
    assert report.clean and report.records > 0, report.problems


def test_a_slave_opened_as_a_master_by_its_configuration_alone_is_refused(
        pair, make_store, tmp_path, manual_clock):
    """Editing store.role and restarting is not a promotion: the open refuses, naming what to
    do, and changes nothing; promoted while stopped, it opens as a master on its master's
    state in a new epoch."""
    from mqstore.errors import ConfigError
    m, s = pair()
    in_flight = busy_master(m, manual_clock)
    wait_for(lambda: mirrored(m, s), "the mirror")
    s.close()
    m.close()
    root = tmp_path / "slave"
    def files():  # but the lock file, which every open takes
        return {p: (p.stat().st_mtime_ns, p.read_bytes()) for p in root.rglob("*")
                if p.is_file() and p.name != "lock"}
    before = files()
    as_master = {"commit_log": {"segment_bytes": SEG}, "store": {"role": "async_master"}}
    with pytest.raises(ConfigError, match=r"slave's directory .* store.role is "
                                          r"'async_master'.*mqstore role promote"):
        make_store(as_master, root=root)
    assert files() == before
    p = make_store({**as_master, "store": {"role": "slave"}}, root=root)
    assert p.promote()["mirror"] is not None and p.role_state.writable
    manual_clock.advance(31_000)
    again = p.pop("billing", "orders", max_msgs=200, invisible_ms=30_000)
    assert {(x.queue_id, x.queue_offset) for x in again if x.delivery_attempt > 1} == in_flight


def test_a_promotion_while_the_slaves_dispatch_lags_still_installs_the_mirror(
        pair, manual_clock):
    """The slave holds its master's whole log, state records included, but its dispatch has
    not reached the first of them when it is promoted (a loaded machine, an elected node):
    the promotion waits for dispatch, then installs the mirror, so the groups go on from
    where they were and only what was in flight is delivered again."""
    import signal
    m, s = pair()
    worker = s.worker_status()["pid"]
    os.kill(worker, signal.SIGSTOP)  # before the master has any state
    try:
        in_flight = busy_master(m, manual_clock)
        wait_for(lambda: s.max_phys_offset == m.max_phys_offset, "the slave's log")
        assert not (Path(s.root) / "consumequeue" / STATE_TOPIC).exists()
        m.close()
        wait_for(lambda: not s.replication.client.connected, "the slave sees its master gone")
        wait_dispatched = s.wait_dispatched

        def resumed_then_waited(timeout=5.0):  # dispatch goes on once it is waited for
            os.kill(worker, signal.SIGCONT)
            wait_dispatched(timeout)
        s.wait_dispatched = resumed_then_waited
        done = s.promote()
    finally:
        os.kill(worker, signal.SIGCONT)  # never left stopped, whatever failed
    assert done["mirror"] is not None
    assert "consumer/pop/orders@billing.journal" in done["mirror"]["installed"]
    manual_clock.advance(31_000)
    # As the gRPC endpoint pops (a group without state there would start at offset 0).
    again = s.pop("billing", "orders", max_msgs=200, invisible_ms=30_000, consume_from="max")
    assert {(x.queue_id, x.queue_offset) for x in again if x.delivery_attempt > 1} == in_flight
    assert len(again) == len(in_flight) + (200 - 64)

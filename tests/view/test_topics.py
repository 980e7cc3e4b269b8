"""Topic configs: ``config/topics.json`` in RocketMQ's format, and the put path by them.

The file is read as a RocketMQ broker writes it (4.x and 5.x shapes), written back as fastjson
pretty-prints it, and refused, never reset, when damaged. A store with configs picks among each
topic's write queues, refuses queue ids past them with MESSAGE_ILLEGAL, creates unknown topics
(``topics.auto_create``) or answers TOPIC_NOT_EXIST, and answers NO_PERMISSION for a topic
without the write bit; a store without the file behaves as it always did.
"""

from __future__ import annotations

import json
import shutil
import time

import numpy as np
import pytest

from mqstore import Message, MessageBatch, MessageStore, PutStatus, load_config
from mqstore.errors import CorruptStateError, TopicNotFoundError
from mqstore.format.topic_config import decode_table, encode_table
from mqstore.view import topics as topics_module
from mqstore.view.topics import Topics

pytestmark = pytest.mark.usefixtures("no_plugin_env")

# A RocketMQ 4.9 broker's config/topics.json for the fixture store's topics, in the shape its
# TopicConfigManager persists (fastjson, pretty: tabs, fields sorted, no stateVersion, no
# attributes), with the system topics a 4.9 broker records beside them.
ROCKETMQ_49_TOPICS = """{
\t"dataVersion":{
\t\t"counter":9,
\t\t"timestamp":1795733467123
\t},
\t"topicConfigTable":{
\t\t"SCHEDULE_TOPIC_XXXX":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":18,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"SCHEDULE_TOPIC_XXXX",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":18
\t\t},
\t\t"TBW102":{
\t\t\t"order":false,
\t\t\t"perm":7,
\t\t\t"readQueueNums":8,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"TBW102",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":8
\t\t},
\t\t"OrderEvents":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":2,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"OrderEvents",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":2
\t\t},
\t\t"audit-log":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":4,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"audit-log",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":4
\t\t},
\t\t"metrics.cpu":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":8,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"metrics.cpu",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":8
\t\t},
\t\t"%RETRY%fixture-consumer-group":{
\t\t\t"order":false,
\t\t\t"perm":6,
\t\t\t"readQueueNums":1,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"%RETRY%fixture-consumer-group",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":1
\t\t},
\t\t"DefaultCluster":{
\t\t\t"order":false,
\t\t\t"perm":7,
\t\t\t"readQueueNums":16,
\t\t\t"topicFilterType":"SINGLE_TAG",
\t\t\t"topicName":"DefaultCluster",
\t\t\t"topicSysFlag":0,
\t\t\t"writeQueueNums":16
\t\t}
\t}
}"""

# The same shape from a 5.x broker: stateVersion, attributes, and a key a later version added.
ROCKETMQ_5_TOPICS = """{
\t"dataVersion":{
\t\t"counter":3,
\t\t"stateVersion":0,
\t\t"timestamp":1700000000000
\t},
\t"topicConfigTable":{
\t\t"Fifo":{
\t\t\t"attributes":{
\t\t\t\t"message.type":"FIFO"
\t\t\t},
\t\t\t"order":true,
\t\t\t"perm":6,
\t\t\t"readQueueNums":8,
\t\t\t"topicFilterType":"MULTI_TAG",
\t\t\t"topicName":"Fifo",
\t\t\t"topicSysFlag":1,
\t\t\t"writeQueueNums":4,
\t\t\t"queueTypeLater":"Standard"
\t\t}
\t}
}"""


def thread_loops(overrides=None) -> dict:
    return {"dispatch": {"worker": "thread"}, "flush": {"worker": "thread"}, **(overrides or {})}


def write_topics(root, text: str) -> None:
    (root / "config").mkdir(parents=True, exist_ok=True)
    (root / "config" / "topics.json").write_text(text, encoding="utf-8")


def topics_bytes(root) -> bytes:
    return (root / "config" / "topics.json").read_bytes()


@pytest.fixture
def fresh_reads(monkeypatch):
    """Every lookup re-reads the file (another process's change is seen at once)."""
    monkeypatch.setattr(topics_module, "RELOAD_INTERVAL_S", 0.0)


# -- the file ------------------------------------------------------------------------------
def test_reads_a_rocketmq_4_9_file():
    table = decode_table(ROCKETMQ_49_TOPICS)
    assert (table.data_version.counter, table.data_version.timestamp,
            table.data_version.state_version) == (9, 1795733467123, None)
    assert sorted(table.topics) == ["%RETRY%fixture-consumer-group", "DefaultCluster",
                                    "OrderEvents", "SCHEDULE_TOPIC_XXXX", "TBW102",
                                    "audit-log", "metrics.cpu"]
    orders = table.topics["OrderEvents"]
    assert (orders.read_queue_nums, orders.write_queue_nums, orders.perm, orders.perm_text,
            orders.topic_filter_type, orders.topic_sys_flag, orders.order, orders.attributes
            ) == (2, 2, 6, "RW-", "SINGLE_TAG", 0, False, None)
    tbw = table.topics["TBW102"]
    assert (tbw.perm_text, tbw.readable, tbw.writable) == ("RWX", True, True)


def test_reads_a_rocketmq_5_file_and_keeps_what_it_does_not_know():
    table = decode_table(ROCKETMQ_5_TOPICS)
    fifo = table.topics["Fifo"]
    assert (fifo.read_queue_nums, fifo.write_queue_nums, fifo.order, fifo.topic_sys_flag,
            fifo.topic_filter_type, fifo.attributes) == (8, 4, True, 1, "MULTI_TAG",
                                                         {"message.type": "FIFO"})
    assert table.data_version.state_version == 0
    again = json.loads(encode_table(table))
    assert again["topicConfigTable"]["Fifo"]["queueTypeLater"] == "Standard"
    assert again == json.loads(ROCKETMQ_5_TOPICS)


def test_written_as_fastjson_pretty_prints_it():
    text = encode_table(decode_table(ROCKETMQ_49_TOPICS))
    assert json.loads(text) == json.loads(ROCKETMQ_49_TOPICS)
    lines = text.splitlines()
    assert lines[:3] == ["{", '\t"dataVersion":{', '\t\t"counter":9,']
    assert '\t\t\t"perm":6,' in lines and '\t\t\t"topicName":"OrderEvents",' in lines
    # The fixture's fields in fastjson's order (sorted), topics sorted by name.
    orders = lines.index('\t\t"OrderEvents":{')
    assert lines[orders + 1:orders + 9] == [
        '\t\t\t"order":false,', '\t\t\t"perm":6,', '\t\t\t"readQueueNums":2,',
        '\t\t\t"topicFilterType":"SINGLE_TAG",', '\t\t\t"topicName":"OrderEvents",',
        '\t\t\t"topicSysFlag":0,', '\t\t\t"writeQueueNums":2', '\t\t},']


def test_round_trip_through_a_change(tmp_path, manual_clock):
    """A topic created in a broker's file: every other topic is kept as it was, the data
    version moves on (counter + 1, the store clock's time) and keeps the file's shape."""
    write_topics(tmp_path, ROCKETMQ_49_TOPICS)
    topics = Topics(str(tmp_path), load_config(), clock=manual_clock)
    made = topics.create("Payments", queues=3)
    table = decode_table(topics_bytes(tmp_path).decode())
    before = decode_table(ROCKETMQ_49_TOPICS)
    assert {k: v for k, v in table.topics.items() if k != "Payments"} == before.topics
    assert table.topics["Payments"] == made
    assert json.loads(topics_bytes(tmp_path))["topicConfigTable"]["Payments"] == {
        "attributes": {}, "order": False, "perm": 6, "readQueueNums": 3,
        "topicFilterType": "SINGLE_TAG", "topicName": "Payments", "topicSysFlag": 0,
        "writeQueueNums": 3}
    dv = json.loads(topics_bytes(tmp_path))["dataVersion"]
    assert dv == {"counter": 10, "timestamp": manual_clock()}  # 4.x shape: no stateVersion
    topics.update("Payments", write_queues=1, perm=4)
    topics.remove("OrderEvents")
    table = decode_table(topics_bytes(tmp_path).decode())
    assert table.data_version.counter == 12
    assert "OrderEvents" not in table.topics
    pay = table.topics["Payments"]
    assert (pay.read_queue_nums, pay.write_queue_nums, pay.perm) == (3, 1, 4)


DAMAGED = [
    ("{bad", "not valid JSON (Expecting property name enclosed in double quotes at line 1, "
             "column 2)"),
    ("", "the file is empty"),
    ("[1, 2]", "holds a list, not an object with a topicConfigTable"),
    ('{"dataVersion": {"counter": 1, "timestamp": 2}}', "topicConfigTable: missing"),
    ('{"topicConfigTable": {"A": {"topicName": "B"}}}',
     "topicConfigTable key 'A' holds the config of topic 'B' (topicName must equal its key)"),
    ('{"topicConfigTable": {"A": {"topicName": "A", "perm": "6"}}}',
     "topicConfigTable.A.perm: input should be a valid integer (got '6')"),
    ('{"topicConfigTable": {"A": {"topicName": "A", "writeQueueNums": -1}}}',
     "topicConfigTable.A.writeQueueNums: input should be greater than or equal to 0 (got -1)"),
    ('{"topicConfigTable": {"A": {"topicName": "A", "readQueueNums": 2147483648}}}',
     "topicConfigTable.A.readQueueNums: input should be less than or equal to 2147483647 "
     "(got 2147483648)"),
    ('{"topicConfigTable": {"A": {"topicName": "A", "order": "false"}}}',
     "topicConfigTable.A.order: input should be a valid boolean (got 'false')"),
    ('{"topicConfigTable": {"A": {"topicName": "A", "topicFilterType": "TAG"}}}',
     "topicConfigTable.A.topicFilterType: input should be 'single_tag' or 'multi_tag' "
     "(got 'TAG')"),
]


@pytest.mark.parametrize("text, problem", DAMAGED)
def test_a_damaged_file_is_reported_naming_it_and_never_replaced(tmp_path, text, problem):
    write_topics(tmp_path, text)
    path = tmp_path / "config" / "topics.json"
    topics = Topics(str(tmp_path), load_config())
    expected = (f"topic configs {path} are damaged: {problem}; the file is left as it is: "
                f"repair or remove it")
    for call in (lambda: topics.get("A"), lambda: topics.create("C"),
                 lambda: topics.update("A", perm=4), lambda: topics.remove("A"),
                 lambda: topics.write_queues({"A": -1})):
        with pytest.raises(CorruptStateError) as err:
            call()
        assert str(err.value) == expected
    assert path.read_text() == text
    assert sorted(p.name for p in path.parent.iterdir()) == ["topics.json", "topics.json.lock"]


def test_a_damaged_file_points_at_rocketmqs_backup(tmp_path):
    write_topics(tmp_path, '{"topicConfigTable": ')
    (tmp_path / "config" / "topics.json.bak").write_text(ROCKETMQ_49_TOPICS)
    with pytest.raises(CorruptStateError, match=r"repair it, or put back topics\.json\.bak "
                                                r"\(RocketMQ's version before its last change\)"):
        Topics(str(tmp_path), load_config()).all()


def test_a_store_with_a_damaged_file_opens_and_refuses_puts_until_repaired(
        make_store, store_dir, fresh_reads):
    write_topics(store_dir, "{garbled")
    store = make_store()
    path = store_dir / "config" / "topics.json"
    why = (f"topic configs {path} are damaged: not valid JSON (Expecting property name enclosed "
           f"in double quotes at line 1, column 2); the file is left as it is: repair or "
           f"remove it")
    r = store.put(Message("T", b"x"))
    assert (r.status, r.error) == (PutStatus.SERVICE_NOT_AVAILABLE, why)
    b = store.put_batch(MessageBatch(topic="T", bodies=[b"a", b"b"]))
    assert (b.status, b.error, b.error_index) == (PutStatus.SERVICE_NOT_AVAILABLE, why, None)
    with pytest.raises(CorruptStateError):
        store.topic_config("T")
    assert path.read_text() == "{garbled"
    assert store.max_phys_offset == 0
    write_topics(store_dir, ROCKETMQ_49_TOPICS)
    assert store.put(Message("OrderEvents", b"x")).status is PutStatus.PUT_OK


# -- the put path --------------------------------------------------------------------------
def test_a_store_without_topics_json_behaves_as_before(make_store, store_dir):
    store = make_store({"queue_select": {"queues_per_topic": 3}})
    ids = [store.put(Message("T", b"x")).queue_id for _ in range(6)]
    assert sorted(ids) == [0, 0, 1, 1, 2, 2]
    assert store.put(Message("T", b"x", queue_id=1000)).status is PutStatus.PUT_OK
    assert store.put_batch([Message("U", b"y", queue_id=77)]).status is PutStatus.PUT_OK
    assert not (store_dir / "config" / "topics.json").exists()
    assert store.topic_config("T") is None and store.topic_configs() == {}


def test_puts_pick_among_the_topics_write_queues(make_store):
    store = make_store({"queue_select": {"queues_per_topic": 8}})
    store.create_topic("Three", queues=3)
    store.create_topic("Narrow", read_queues=8, write_queues=2)
    ids = [store.put(Message("Three", b"x")).queue_id for _ in range(9)]
    assert sorted(ids) == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert all((b - a) % 3 == 1 for a, b in zip(ids, ids[1:]))  # round robin over 3
    batch = store.put_batch(MessageBatch(topic="Narrow", bodies=[b"%d" % i for i in range(6)]))
    assert sorted(batch.queue_ids.tolist()) == [0, 0, 0, 1, 1, 1]
    mixed = store.put_batch([Message("Three", b"a"), Message("Narrow", b"b"),
                             Message("Three", b"c", queue_id=2)])
    assert mixed.status is PutStatus.PUT_OK
    assert mixed.queue_ids[0] < 3 and mixed.queue_ids[1] < 2 and mixed.queue_ids[2] == 2


def test_a_queue_id_past_the_write_queues_is_refused_with_nothing_written(make_store):
    store = make_store()
    store.create_topic("T", read_queues=6, write_queues=3)
    r = store.put(Message("T", b"x", queue_id=3))
    assert (r.status, r.error) == (
        PutStatus.MESSAGE_ILLEGAL,
        "queue_id 3 is not a write queue of topic 'T': it has 3 write queue(s), ids 0..2")
    b = store.put_batch([Message("T", b"a", queue_id=0), Message("U", b"b"),
                         Message("T", b"c", queue_id=5), Message("T", b"d", queue_id=7)])
    assert (b.status, b.error_index, b.error) == (
        PutStatus.MESSAGE_ILLEGAL, 2,
        "message 2: queue_id 7 is not a write queue of topic 'T': it has 3 write queue(s), "
        "ids 0..2")
    cols = store.put_batch(MessageBatch(topic="T", bodies=[b"a", b"b"], queue_ids=[2, 4]))
    assert (cols.status, cols.error_index) == (PutStatus.MESSAGE_ILLEGAL, 1)
    assert store.max_phys_offset == 0
    assert store.topic_config("U") is None  # the batch that named U was refused: not created
    assert store.put(Message("T", b"x", queue_id=2)).status is PutStatus.PUT_OK


def test_auto_create_on_creates_a_topic_at_its_first_send(make_store, store_dir):
    store = make_store({"queue_select": {"queues_per_topic": 5}})
    store.create_topic("Existing")
    r = store.put(Message("Fresh", b"x"))
    assert r.status is PutStatus.PUT_OK and 0 <= r.queue_id < 5
    fresh = store.topic_config("Fresh")
    assert (fresh.read_queue_nums, fresh.write_queue_nums, fresh.perm) == (5, 5, 6)
    on_disk = json.loads(topics_bytes(store_dir))["topicConfigTable"]
    assert sorted(on_disk) == ["Existing", "Fresh"]
    # A first send naming a queue the new topic would not have creates nothing.
    before = topics_bytes(store_dir)
    r = store.put(Message("Other", b"x", queue_id=5))
    assert (r.status, r.error) == (
        PutStatus.MESSAGE_ILLEGAL,
        "queue_id 5 is not a write queue of topic 'Other': it would be created with 5 write "
        "queue(s), ids 0..4")
    assert topics_bytes(store_dir) == before
    # A message refused for its own content creates nothing either.
    assert store.put(Message("Other", b"x" * (2 << 20))).status is PutStatus.MESSAGE_ILLEGAL
    assert topics_bytes(store_dir) == before


def test_auto_create_off_answers_topic_not_exist(make_store, store_dir):
    store = make_store({"topics": {"auto_create": False,
                                   "declare": [{"name": "Known", "queues": 2}]}})
    before = topics_bytes(store_dir)
    r = store.put(Message("Unknown", b"x"))
    path = store_dir / "config" / "topics.json"
    reason = (f"topic 'Unknown' does not exist: {path} has no config for it and "
              f"topics.auto_create is false; create it first (mqstore topic create, "
              f"store.create_topic or topics.declare)")
    assert (r.status, r.error) == (PutStatus.TOPIC_NOT_EXIST, reason)
    b = store.put_batch(MessageBatch(topic=["Known", "Unknown"], bodies=[b"a", b"b"]))
    assert (b.status, b.error_index, b.error) == (PutStatus.TOPIC_NOT_EXIST, 1,
                                                  f"message 1: {reason}")
    assert not r.status.stored and store.max_phys_offset == 0
    assert store.topic_config("Unknown", create=True) is None
    assert topics_bytes(store_dir) == before
    assert store.put(Message("Known", b"x")).queue_id in (0, 1)


def test_auto_create_off_without_a_file_refuses_every_topic(make_store, store_dir):
    store = make_store({"topics": {"auto_create": False}})
    assert store.put(Message("T", b"x")).status is PutStatus.TOPIC_NOT_EXIST
    assert not (store_dir / "config" / "topics.json").exists()
    store.create_topic("T", queues=1)
    assert store.put(Message("T", b"x")).queue_id == 0


def test_a_topic_without_the_write_bit_answers_no_permission(make_store):
    store = make_store()
    store.create_topic("ReadOnly", perm=4)
    store.create_topic("T")
    r = store.put(Message("ReadOnly", b"x"))
    assert (r.status, r.error) == (
        PutStatus.NO_PERMISSION,
        "topic 'ReadOnly' takes no messages: its perm is 4 (R--), without the write bit 2")
    b = store.put_batch(MessageBatch(topic=["T", "T", "ReadOnly"], bodies=[b"1", b"2", b"3"]))
    assert (b.status, b.error_index) == (PutStatus.NO_PERMISSION, 2)
    store.update_topic("ReadOnly", perm=6)
    assert store.put(Message("ReadOnly", b"x")).status is PutStatus.PUT_OK


def test_the_first_config_adopts_the_topics_a_store_has(make_store):
    """A store without topics.json put to queue 6 of A; once a config is recorded (here by
    creating B), A is listed with 7 queues, so queue 6 still takes puts."""
    store = make_store()
    assert store.put(Message("A", b"x", queue_id=6)).status is PutStatus.PUT_OK
    assert store.put(Message("Small", b"x", queue_id=1)).status is PutStatus.PUT_OK
    store.create_topic("B", queues=2)
    a, small = store.topic_config("A"), store.topic_config("Small")
    assert (a.read_queue_nums, a.write_queue_nums) == (7, 7)
    assert (small.read_queue_nums, small.write_queue_nums) == (4, 4)  # queues_per_topic
    assert store.put(Message("A", b"x", queue_id=6)).status is PutStatus.PUT_OK
    assert store.put(Message("A", b"x", queue_id=7)).status is PutStatus.MESSAGE_ILLEGAL


def test_a_change_by_another_process_is_followed(make_store, store_dir):
    store = make_store()
    store.create_topic("T", queues=4)
    # As `mqstore topic update` beside the running store does: the file changes under it.
    Topics(str(store_dir), load_config()).update("T", write_queues=1)
    deadline = time.monotonic() + 10 * topics_module.RELOAD_INTERVAL_S + 5
    while store.put(Message("T", b"x", queue_id=3)).status is PutStatus.PUT_OK:
        assert time.monotonic() < deadline, "the store never saw the change"
        time.sleep(0.05)
    assert {store.put(Message("T", b"x")).queue_id for _ in range(4)} == {0}


def test_declared_topics_are_made_as_declared_at_every_writable_open(make_store, store_dir):
    declare = [{"name": "Orders", "queues": 8}, {"name": "Audit", "read_queues": 4,
                                                  "write_queues": 2, "perm": 6}]
    make_store({"topics": {"declare": declare}}).close()
    table = decode_table(topics_bytes(store_dir).decode())
    got = {n: (c.read_queue_nums, c.write_queue_nums, c.perm) for n, c in table.topics.items()}
    assert got == {"Orders": (8, 8, 6), "Audit": (4, 2, 6)}
    counter = table.data_version.counter
    make_store({"topics": {"declare": declare}}).close()  # nothing to change: no new version
    assert decode_table(topics_bytes(store_dir).decode()).data_version.counter == counter
    store = make_store({"topics": {"declare": [{"name": "Orders", "queues": 2, "perm": 4}]}})
    orders = store.topic_config("Orders")
    assert (orders.read_queue_nums, orders.write_queue_nums, orders.perm) == (2, 2, 4)
    assert store.topic_config("Audit") is not None  # no longer declared: kept as it is


def test_a_rocketmq_store_brings_its_topics_along(rocketmq_dir, tmp_path, manifest):
    root = tmp_path / "store"
    shutil.copytree(rocketmq_dir, root)
    write_topics(root, ROCKETMQ_49_TOPICS)
    cfg = load_config(overrides={"plugins": {"load_entry_points": False}, **thread_loops()})
    with MessageStore.open(root, cfg) as store:
        assert store.topic_config("OrderEvents").write_queue_nums == 2
        assert store.topic_config("metrics.cpu").read_queue_nums == 8
        r = store.put(Message("OrderEvents", b"after the broker"))
        assert r.status is PutStatus.PUT_OK and r.queue_id in (0, 1)
        assert r.queue_offset == {0: 95, 1: 60}[r.queue_id]  # goes on where RocketMQ stopped
        assert store.put(Message("OrderEvents", b"x", queue_id=2)).status \
            is PutStatus.MESSAGE_ILLEGAL
        assert store.put(Message("audit-log", b"x", queue_id=3)).status is PutStatus.PUT_OK
    table = decode_table(topics_bytes(root).decode())
    assert table.topics == decode_table(ROCKETMQ_49_TOPICS).topics  # nothing rewritten


# -- the facade's calls ------------------------------------------------------------------------
def test_create_and_update_check_their_arguments(make_store, store_dir):
    store = make_store()
    for call, message in [
            (lambda: store.create_topic("bad name"), "topic 'bad name' must match"),
            (lambda: store.create_topic("T", queues=0), r"queues 0 must be an int in \[1, 65536\]"),
            (lambda: store.create_topic("T", write_queues=65537), "write_queues 65537 must be"),
            (lambda: store.create_topic("T", perm=7), "perm 7 must be 2 .write., 4 .read. or 6"),
            (lambda: store.create_topic("T", perm=True), "perm True must be")]:
        with pytest.raises(ValueError, match=message):
            call()
    assert not (store_dir / "config" / "topics.json").exists()
    store.create_topic("T")
    with pytest.raises(ValueError, match=r"topic 'T' exists already \(4 read / 4 write "
                                         r"queue\(s\), perm 6\)"):
        store.create_topic("T", queues=2)
    with pytest.raises(TopicNotFoundError, match="topic 'U' has no config in"):
        store.update_topic("U", queues=2)
    assert store.update_topic("T", read_queues=9).read_queue_nums == 9


def test_a_read_only_store_looks_topics_up_and_changes_none(make_store, store_dir):
    make_store({"topics": {"declare": [{"name": "T", "queues": 2}]}}).close()
    reader = make_store(read_only=True)
    assert reader.topic_config("T").write_queue_nums == 2
    assert sorted(reader.topic_configs()) == ["T"]
    with pytest.raises(PermissionError):
        reader.create_topic("U")
    with pytest.raises(PermissionError):
        reader.topic_config("U", create=True)


def test_topic_config_create_makes_it_as_a_first_send_would(make_store):
    store = make_store({"queue_select": {"queues_per_topic": 6}})
    made = store.topic_config("Route", create=True)
    assert (made.read_queue_nums, made.write_queue_nums, made.perm) == (6, 6, 6)
    assert store.topic_config("Route", create=True) == made  # found, not made again


def test_many_threads_creating_topics_on_send_lose_none(make_store, store_dir):
    store = make_store({"queue_select": {"queues_per_topic": 2}})
    store.create_topic("Seed")
    import threading
    names = [f"T{i}" for i in range(16)]
    errors = []

    def put(name):
        r = store.put(Message(name, b"x"))
        if r.status is not PutStatus.PUT_OK:
            errors.append(r)
    threads = [threading.Thread(target=put, args=(n,)) for n in names]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert sorted(decode_table(topics_bytes(store_dir).decode()).topics) == sorted(
        [*names, "Seed"])


def test_selector_choices_past_the_write_queues_are_refused(make_store):
    """A third-party selector that picks a queue the topic does not have gets the put
    refused, not written to a queue no consumer reads."""
    store = make_store()
    store.create_topic("T", queues=2)
    store._appender.selector = type("Wild", (), {"select": lambda self, m, n: 5})()
    r = store.put(Message("T", b"x"))
    assert (r.status, r.error) == (
        PutStatus.MESSAGE_ILLEGAL,
        "queue selector 'round_robin' chose queue_id 5, not a write queue of topic 'T': it "
        "has 2 write queue(s), ids 0..1")
    b = store.put_batch(MessageBatch(topic="T", bodies=[b"a"]))
    assert (b.status, b.error_index) == (PutStatus.MESSAGE_ILLEGAL, 0)
    assert store.max_phys_offset == 0
    assert np.array_equal(b.queue_ids, [])


def test_check_notes_a_damaged_topics_file(make_store, store_dir):
    from mqstore.ops.checking.checker import check_store
    store = make_store()
    store.create_topic("T")
    store.put(Message("T", b"x"))
    store.close()
    write_topics(store_dir, '{"topicConfigTable": 1}')
    report = check_store(str(store_dir), store.config)
    path = store_dir / "config" / "topics.json"
    assert report.problems == []
    assert (f"topic configs {path} are damaged: topicConfigTable: input should be a valid "
            f"dictionary (got 1); the file is left as it is: repair or remove it") in report.notes


def test_creating_a_topic_the_store_holds_without_a_config_gives_it_the_counts_asked(
        make_store):
    store = make_store()
    assert store.put(Message("Held", b"x", queue_id=5)).status is PutStatus.PUT_OK
    made = store.create_topic("Held", write_queues=2)
    assert (made.read_queue_nums, made.write_queue_nums) == (4, 2)
    with pytest.raises(ValueError, match="topic 'Held' exists already"):
        store.create_topic("Held")

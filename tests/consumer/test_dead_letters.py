"""Group configs and dead letters of pop consumers through the embedding API: the group's
retryMaxTimes + 1 deliveries, then the message in %DLQ%<group> as RocketMQ writes it;
dead_letter(handle) at once; exactly once across a SIGKILL at either step of dead-lettering;
a read-only store leaves exhausted messages for the writer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import textwrap

import pytest

from mqstore import Message
from mqstore.consumer import ReceiptHandleError, StaleReceiptHandleError
from mqstore.consumer.group_configs import groups_path
from mqstore.errors import CorruptStateError
from mqstore.testing import wait_for

TOPIC = "T"
UNIQ = "7F00000103095FFD2B278DBFBB070008"


def put_one(store, body=b"dead body", **extra):
    result = store.put(Message(topic=TOPIC, body=body, tags="TagC", keys=["norm-8", "order-1"],
                               properties={"UNIQ_KEY": UNIQ, "fixSeq": "8"}, queue_id=0,
                               **extra))
    assert result.status.stored
    wait_for(lambda: store.max_offset(TOPIC, 0) >= result.queue_offset + 1)
    return result


def dlq(store, group="G"):
    topic = "%DLQ%" + group
    store.wait_dispatched(30.0)
    if not store.queue_ids(topic):
        return []
    batch = store.read(topic, 0, 0, 100)
    return [batch.message(i) for i in range(len(batch))]


def test_group_configs_default_set_and_survive_a_reopen(make_store):
    store = make_store()
    assert store.group_config("G").retry_max_times == 16
    assert not os.path.exists(groups_path(store.root))
    config = store.set_group_config("G", retry_max_times=2, retry_queue_nums=2)
    assert (config.retry_max_times, config.retry_queue_nums, config.max_attempts) == (2, 2, 3)
    with open(groups_path(store.root), encoding="utf-8") as f:
        doc = json.load(f)
    assert doc["subscriptionGroupTable"]["G"]["retryMaxTimes"] == 2
    assert doc["dataVersion"]["counter"] == 1
    root = store.root
    store.close()
    again = make_store(root=root)
    assert again.group_config("G").retry_max_times == 2
    assert again.group_config("Other").retry_max_times == 16


def test_a_bad_value_changes_nothing_on_disk(make_store):
    store = make_store()
    store.set_group_config("G", retry_max_times=2)
    with open(groups_path(store.root), "rb") as f:
        before = f.read()
    with pytest.raises(ValueError, match=r"retryMaxTimes.*greater than or equal to 0"):
        store.set_group_config("G", retry_max_times=-3)
    with pytest.raises(ValueError, match=r"group 'bad group!'"):
        store.set_group_config("bad group!", retry_max_times=3)
    with open(groups_path(store.root), "rb") as f:
        assert f.read() == before


def test_a_damaged_file_is_reported_and_left(make_store):
    store = make_store()
    os.makedirs(os.path.dirname(groups_path(store.root)), exist_ok=True)
    with open(groups_path(store.root), "w") as f:
        f.write("{oops")
    with pytest.raises(CorruptStateError, match="subscriptionGroup.json are damaged"):
        store.group_config("G")
    with pytest.raises(CorruptStateError):
        store.set_group_config("G", retry_max_times=1)
    with open(groups_path(store.root)) as f:
        assert f.read() == "{oops"


def test_the_broker_fixtures_groups_are_read(make_store, tmp_path, broker_fixture):
    with tarfile.open(broker_fixture / "store.tar.gz") as tar:
        tar.extractall(tmp_path, filter="tar")
    store = make_store(root=tmp_path / "store")
    assert store.group_config("FixGroup").max_attempts == 17
    before = (tmp_path / "store/config/subscriptionGroup.json").read_text()
    store.set_group_config("FixGroup", retry_max_times=1)
    after = (tmp_path / "store/config/subscriptionGroup.json").read_text()
    assert [a for a in after.splitlines() if a not in before.splitlines()] == [
        '\t\t"counter":2,', f'\t\t"timestamp":{store.clock()}', '\t\t\t"retryMaxTimes":1,']


def test_max_attempts_then_the_dead_letter_as_rocketmq_writes_it(make_store, manual_clock,
                                                                  broker_fixture):
    store = make_store()
    store.set_group_config("G", retry_max_times=2)
    put = put_one(store, born_timestamp=1795869352711)
    attempts = []
    for _ in range(5):
        got = store.pop("G", TOPIC, 8, 1000, consume_from="first")
        attempts += [m.delivery_attempt for m in got]
        manual_clock.advance(1001)
    assert attempts == [1, 2, 3]
    dead = dlq(store)
    assert len(dead) == 1
    d, rec = dead[0], dead[0].record
    assert (d.topic, rec.queue_id, rec.reconsume_times) == ("%DLQ%G", 0, 3)
    assert d.body == b"dead body" and d.tags == "TagC" and d.keys == ["norm-8", "order-1"]
    assert d.uniq_key == UNIQ and rec.born_timestamp == 1795869352711
    props = d.properties
    assert {k: props[k] for k in ("RETRY_TOPIC", "ORIGIN_MESSAGE_ID", "DELAY", "RECONSUME_TIME",
                                  "DLQ_ORIGIN_TOPIC", "DLQ_ORIGIN_MESSAGE_ID", "fixSeq")} == {
        "RETRY_TOPIC": TOPIC, "ORIGIN_MESSAGE_ID": put.msg_id, "DELAY": "0",
        "RECONSUME_TIME": "3", "DLQ_ORIGIN_TOPIC": TOPIC, "DLQ_ORIGIN_MESSAGE_ID": UNIQ,
        "fixSeq": "8"}
    # The DLQ topic as the broker fixture's %DLQ%FixGroup: one queue, perm 6.
    with open(broker_fixture / "MANIFEST.json", encoding="utf-8") as f:
        manifest = json.load(f)
    fixture_dead = [s for m in manifest["messages"] for s in m["storedAs"]
                    if s["topic"] == "%DLQ%FixGroup"]
    assert {s["DELAY"] for s in fixture_dead} == {"0"}
    assert all(s["RETRY_TOPIC"] == "FixNormal" for s in fixture_dead)
    config = store.topic_config("%DLQ%G")
    assert (config.read_queue_nums, config.write_queue_nums, config.perm,
            config.topic_sys_flag) == (1, 1, 6, 0)
    assert store.dead_letter_counts() == {"G": 1}
    assert store.pop("G", TOPIC, 8, 1000) == []


def test_dead_letter_now_ends_the_delivery(make_store):
    store = make_store()
    put_one(store)
    (msg,) = store.pop("G", TOPIC, 8, 60_000, consume_from="first", wait_ms=5000)
    store.dead_letter(msg.receipt_handle)
    (dead,) = dlq(store)
    assert dead.properties["RECONSUME_TIME"] == "1" and dead.record.reconsume_times == 1
    with pytest.raises(StaleReceiptHandleError, match="acknowledged"):
        store.ack(msg.receipt_handle)
    with pytest.raises(StaleReceiptHandleError):
        store.dead_letter(msg.receipt_handle)
    with pytest.raises(ReceiptHandleError):
        store.dead_letter("not a handle")
    assert len(dlq(store)) == 1


def test_a_listener_keeps_hearing_after_the_parts_are_rebuilt(make_store):
    """A role change closes the store's parts and opens new ones (``serve`` names its
    listener once, perhaps while that happens): the listener hears the new parts' dead
    letters, once each."""
    store = make_store()
    heard: list = []
    listener = lambda group, count: heard.append((group, count))  # noqa: E731
    store.watch_dead_letters(listener)
    store.watch_dead_letters(listener)  # named twice: told once
    store._reopen()  # what a promotion or a rejoin does to a running store
    put_one(store)
    (msg,) = store.pop("G", TOPIC, 8, 60_000, consume_from="first", wait_ms=5000)
    store.dead_letter(msg.receipt_handle)
    assert heard == [("G", 1)]


def test_a_read_only_store_leaves_exhausted_messages_to_the_writer(make_store, manual_clock):
    store = make_store()
    store.set_group_config("G", retry_max_times=0)
    put_one(store)
    assert len(store.pop("G", TOPIC, 8, 1000, consume_from="first")) == 1
    manual_clock.advance(1001)
    reader = make_store(root=store.root, read_only=True)
    assert reader.pop("G", TOPIC, 8, 1000) == []  # not delivered again, not dead-lettered
    assert dlq(store) == []
    assert store.pop("G", TOPIC, 8, 1000) == []
    assert len(dlq(store)) == 1


_CHILD = textwrap.dedent("""
    import os, signal, sys
    from mqstore import MessageStore
    from mqstore.clock import ManualClock
    from mqstore.consumer import dead_letters, pop_journal
    from mqstore.format.pop_record import DEAD
    root, when, now = sys.argv[1], sys.argv[2], int(sys.argv[3])
    if when == "after-put":
        put = dead_letters.DeadLetters.put_many
        def put_then_die(self, *args):
            put(self, *args)
            os.kill(os.getpid(), signal.SIGKILL)
        dead_letters.DeadLetters.put_many = put_then_die
    else:
        append = pop_journal.PopJournal.append
        def append_then_die(self, rows, *args):
            append(self, rows, *args)
            if rows[0][0] == DEAD:
                os.kill(os.getpid(), signal.SIGKILL)
        pop_journal.PopJournal.append = append_then_die
    clock = ManualClock(now)
    store = MessageStore.open(root, clock=clock)
    store.pop("G", "T", 8, 1000)
    print("not killed")
""")


@pytest.mark.parametrize("when", ["after-intent", "after-put"])
def test_a_sigkill_while_dead_lettering_leaves_one_dead_letter(make_store, manual_clock, when):
    store = make_store()
    store.set_group_config("G", retry_max_times=0)
    put_one(store)
    assert len(store.pop("G", TOPIC, 8, 1000, consume_from="first")) == 1
    root = store.root
    store.close()
    manual_clock.advance(1001)
    child = subprocess.run([sys.executable, "-c", _CHILD, str(root), when,
                            str(manual_clock())], capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    again = make_store(root=root)
    assert len(dlq(again)) == (1 if when == "after-put" else 0)
    assert again.pop("G", TOPIC, 8, 1000) == []  # resumed: written if it was not, once
    assert len(dlq(again)) == 1
    assert again.pop("G", TOPIC, 8, 1000) == []
    assert len(dlq(again)) == 1


def test_a_checkpoint_keeps_the_dead_lettering_begun(tmp_path):
    from mqstore.consumer.pop_state import PopState, parse_checkpoint
    from mqstore.format import pop_record
    from mqstore.format.pop_record import DEAD, INFLIGHT, NEXT
    state = PopState()
    state.apply([(NEXT, 0, 5, 0, 0, 0, 0), (INFLIGHT, 0, 3, 100, 7, 2, 0),
                 (INFLIGHT, 0, 4, 100, 8, 1, 0)], 0, 8)
    state.apply([(DEAD, 0, 3, 4096, 7, 0, 0), (DEAD, 0, 4, 4096, 99, 0, 0)], 0, 8)
    assert state.dead == {(0, 3): 4096}  # a stale delivery's DEAD is not taken
    doc = state.to_doc(2)
    assert doc["queues"]["0"]["dead"] == {"3": 4096}
    again, generation = parse_checkpoint("cp", json.dumps(doc).encode())
    assert (again.dead, generation) == ({(0, 3): 4096}, 2)
    doc["queues"]["0"]["dead"] = {"2": 1}
    with pytest.raises(CorruptStateError, match="being dead-lettered but not in flight"):
        parse_checkpoint("cp", json.dumps(doc).encode())
    # The record layout refuses a DEAD entry with a negative log position.
    bad = pop_record.encode_record([(DEAD, 0, 3, -1, 7, 0, 0)], 0, 8)
    assert pop_record.scan(bad).damage is not None

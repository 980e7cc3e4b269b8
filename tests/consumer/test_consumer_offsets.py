"""config/consumerOffset.json (issue 14): RocketMQ's shape read and written, commits from many
processes at once with none lost, and a damaged file left alone."""

from __future__ import annotations

import json
import multiprocessing as mp
import os

import pytest

from mqstore import Message
from mqstore.consumer import CorruptStateError
from mqstore.consumer.offsets import ConsumerOffsets, decode_offsets, journal_lines
from mqstore.testing import consumer_proc, fill

TOPIC = "TopicTest"

# What a RocketMQ 4.9 / 5.x broker's ConsumerOffsetManager persists: fastjson's pretty print,
# integer map keys without quotes, and (5.x) a dataVersion beside the table.
BROKER_FILE = """{
\t"dataVersion":{
\t\t"counter":7,
\t\t"stateVersion":0,
\t\t"timestamp":1700000000000
\t},
\t"offsetTable":{
\t\t"%RETRY%please_rename@please_rename":{0:0},
\t\t"TopicTest@billing":{0:3,1:2,2:5,3:1},
\t\t"OtherTopic@billing":{0:42}
\t}
}"""


def _offsets_path(root) -> str:
    return os.path.join(root, "config", "consumerOffset.json")


def _fill(store, per_queue: int = 8, queues: int = 4) -> None:
    fill(store, per_queue * queues, topic=TOPIC, queues=queues)


def test_a_broker_file_is_read_and_written_back_in_its_shape(make_store, store_dir):
    os.makedirs(store_dir / "config")
    with open(_offsets_path(store_dir), "w") as f:
        f.write(BROKER_FILE)
    store = make_store()
    _fill(store)
    with store.consumer("billing", TOPIC, consume_from="first") as c:
        assert c.positions() == {0: 3, 1: 2, 2: 5, 3: 1}  # the broker's offsets, not "first"
        got = sorted((m.queue_id, m.queue_offset) for m in c.poll(100))
        assert got == [(q, o) for q in range(4) for o in range({0: 3, 1: 2, 2: 5, 3: 1}[q], 8)]
        c.commit()
    with open(_offsets_path(store_dir)) as f:
        written = json.load(f)  # standard JSON now (fastjson reads it as well)
    assert written == {
        "dataVersion": {"counter": 7, "stateVersion": 0, "timestamp": 1700000000000},
        "offsetTable": {"%RETRY%please_rename@please_rename": {"0": 0},
                        "TopicTest@billing": {"0": 8, "1": 8, "2": 8, "3": 8},
                        "OtherTopic@billing": {"0": 42}}}
    assert store.consumer_groups() == {
        ("%RETRY%please_rename", "please_rename"): {0: 0},
        (TOPIC, "billing"): {0: 8, 1: 8, 2: 8, 3: 8}, ("OtherTopic", "billing"): {0: 42}}


def test_decoding_takes_both_spellings():
    assert decode_offsets('{"offsetTable":{"T@g":{0:12, 13 :4}}}') == {
        "offsetTable": {"T@g": {"0": 12, "13": 4}}}
    assert decode_offsets('{"offsetTable":{"T@g":{"0":12}}}') == {
        "offsetTable": {"T@g": {"0": 12}}}


def _commit_many(root: str, group: str, rounds: int, queues: int, barrier=None) -> None:
    offsets = ConsumerOffsets(root)
    if barrier is not None:
        barrier.wait(60)  # all writers at once
    for r in range(1, rounds + 1):
        offsets.commit(TOPIC, group, {r % queues: r})


def test_commits_from_many_processes_at_once_are_never_lost(tmp_path):
    root = str(tmp_path / "store")
    ctx = mp.get_context("forkserver")
    barrier = ctx.Barrier(5)
    procs = [ctx.Process(target=_commit_many, args=(root, f"g{i}", 300, 3, barrier))
             for i in range(4)]
    for p in procs:
        p.start()
    _commit_many(root, "parent", 300, 3, barrier)
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    table = ConsumerOffsets(root).table()
    # Every writer's last commit of each queue survived every other writer's rewrites.
    expected = {0: 300, 1: 298, 2: 299}
    assert table == {(TOPIC, g): expected for g in ("g0", "g1", "g2", "g3", "parent")}
    assert not os.path.exists(_offsets_path(root) + ".tmp")


def test_a_damaged_file_is_left_alone_and_named(make_store, store_dir):
    store = make_store()
    _fill(store, 2, 2)
    os.makedirs(store_dir / "config", exist_ok=True)
    damaged = '{"offsetTable":{"TopicTest@other":{"0":5}'  # cut short
    with open(_offsets_path(store_dir), "w") as f:
        f.write(damaged)
    with pytest.raises(CorruptStateError, match=r"consumerOffset.json is not a valid document"):
        store.consumer("g", TOPIC)
    with open(_offsets_path(store_dir)) as f:
        assert f.read() == damaged
    offsets = ConsumerOffsets(str(store_dir))
    offsets.commit(TOPIC, "g", {0: 1})  # kept in the journal: NOTE [ Offset journal ]
    with pytest.raises(CorruptStateError, match="repair or remove it"):
        offsets.persist()
    with pytest.raises(CorruptStateError):
        offsets.offsets(TOPIC, "g")
    with open(_offsets_path(store_dir)) as f:
        assert f.read() == damaged
    os.unlink(_offsets_path(store_dir))  # the operator removes it: the journal's commits stay
    assert offsets.offsets(TOPIC, "g") == {0: 1}


def test_a_writer_killed_mid_write_leaves_the_last_whole_file(tmp_path):
    root = str(tmp_path / "store")
    offsets = ConsumerOffsets(root, persist_interval_ms=0)
    offsets.commit(TOPIC, "g", {0: 4})
    with open(_offsets_path(root) + ".tmp", "w") as f:
        f.write('{"offsetTable":{"Topic')  # what a killed writer leaves
    assert ConsumerOffsets(root).offsets(TOPIC, "g") == {0: 4}
    ConsumerOffsets(root, persist_interval_ms=0).commit(TOPIC, "g", {1: 2})
    assert ConsumerOffsets(root).offsets(TOPIC, "g") == {0: 4, 1: 2}
    assert not os.path.exists(_offsets_path(root) + ".tmp")


def test_commit_fsync_forces_each_commit(make_store, monkeypatch):
    store = make_store({"consumer": {"commit_fsync": True}})
    _fill(store, 2, 2)
    forced = []
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    monkeypatch.setattr(os, "fsync", lambda fd: forced.append("fsync") or real_fsync(fd))
    monkeypatch.setattr(os, "fdatasync",
                        lambda fd: forced.append("fdatasync") or real_fdatasync(fd))
    with store.consumer("g", TOPIC, consume_from="first") as c:
        forced.clear()
        c.poll(10)
        c.commit()
        assert forced == ["fdatasync"]  # the journal line, before commit returns
        forced.clear()
    # Closing rewrites the document: the new file, then the directory holding the rename.
    assert forced == ["fsync", "fsync"]
    assert ConsumerOffsets(store.root).offsets(TOPIC, "g") == {0: 2, 1: 2}


def test_forgetting_a_group_removes_only_its_entries(make_store):
    store = make_store()
    _fill(store, 2, 2)
    for group in ("keep", "drop"):
        with store.consumer(group, TOPIC, consume_from="first") as c:
            c.poll(10)
            c.commit()
    assert store.delete_consumer_group("drop") == [(TOPIC, "drop")]
    assert store.consumer_groups() == {(TOPIC, "keep"): {0: 2, 1: 2}}
    assert store.delete_consumer_group("drop") == []


def test_forgetting_a_group_removes_its_membership_files_unless_an_instance_is_live(
        make_store, store_dir):
    store = make_store()
    _fill(store, 2, 2)
    groups = os.path.join(store.root, "consumer", "groups")
    for group in ("keep", "drop"):
        with store.consumer(group, TOPIC, consume_from="first") as c:
            c.poll(10)
            c.commit()
    store.put(Message("Other", b"o", queue_id=0))
    store.wait_dispatched()
    with store.consumer("drop", "Other", consume_from="first"):
        pass
    drop = os.path.join(groups, "drop")
    assert sorted(os.listdir(os.path.join(drop, TOPIC, "queues"))) == ["0.lock", "1.lock"]
    assert store.delete_consumer_group("drop", "Other") == [("Other", "drop")]
    assert os.listdir(drop) == [TOPIC]  # only that topic's files
    assert store.delete_consumer_group("drop") == [(TOPIC, "drop")]
    assert sorted(os.listdir(groups)) == ["keep"]  # the closed instances' files are gone
    # Live instances, in this process and in another: their files stay and they go on.
    live = store.consumer("keep", TOPIC)
    child = consumer_proc.ConsumerProcess(store_dir, "other", TOPIC)
    try:
        assert child.wait_for(lambda p: p.assignment == [0, 1]), child.errors()
        assert store.delete_consumer_group("keep") == [(TOPIC, "keep")]
        assert store.delete_consumer_group("other") == [(TOPIC, "other")]
        members = os.path.join(groups, "keep", TOPIC, "members")
        assert os.listdir(members) == [live.member_id]
        assert sorted(os.listdir(os.path.join(groups, "keep", TOPIC, "queues"))) == [
            "0.lock", "1.lock"]
        assert len(os.listdir(os.path.join(groups, "other", TOPIC, "members"))) == 1
        store.put(Message(TOPIC, b"more", queue_id=1))
        store.wait_dispatched()
        assert [m.body for m in live.poll(10)] == [b"more"]  # from its own position
        assert live.assignment == [0, 1]
        assert child.wait_for(lambda p: any(b == ["more"] for _q, _f, _l, b in p.polled()))
        assert child.assignment == [0, 1]
    finally:
        child.kill()  # SIGKILL: its seat is left behind, its locks go with it
    live.close()
    store.delete_consumer_group("keep")
    store.delete_consumer_group("other")
    assert not os.path.exists(groups) or os.listdir(groups) == []
    assert store.consumer_groups() == {}


def _document(root) -> dict:
    with open(_offsets_path(root)) as f:
        return json.load(f)


def test_commits_go_to_the_journal_and_the_document_follows(tmp_path, caplog):
    root = str(tmp_path / "store")
    offsets = ConsumerOffsets(root, persist_interval_ms=60_000)
    offsets.commit(TOPIC, "g", {0: 1, 1: 1})
    offsets.commit(TOPIC, "g", {0: 2})
    assert not os.path.exists(_offsets_path(root))  # not rewritten yet: NOTE [ Offset journal ]
    with open(_offsets_path(root) + ".journal", "rb") as f:
        assert f.read() == journal_lines("TopicTest@g", {0: 1, 1: 1}) + journal_lines(
            "TopicTest@g", {0: 2})
    assert ConsumerOffsets(root).offsets(TOPIC, "g") == {0: 2, 1: 1}  # another reader sees it
    # A line cut short by a crash is skipped; the lines around it count.
    with open(_offsets_path(root) + ".journal", "ab") as f:
        f.write(journal_lines("TopicTest@g", {1: 9})[:-5] + b"\n")
        f.write(journal_lines("TopicTest@g", {2: 3}))
    assert ConsumerOffsets(root).offsets(TOPIC, "g") == {0: 2, 1: 1, 2: 3}
    assert "1 damaged line(s) skipped" in caplog.text
    offsets.persist()
    assert _document(root) == {"offsetTable": {"TopicTest@g": {"0": 2, "1": 1, "2": 3}}}
    assert os.path.getsize(_offsets_path(root) + ".journal") == 0
    offsets.commit(TOPIC, "g", {1: 5})
    offsets.close()  # closing rewrites the document too
    assert _document(root) == {"offsetTable": {"TopicTest@g": {"0": 2, "1": 5, "2": 3}}}


def test_a_zero_persist_interval_rewrites_the_document_at_every_commit(tmp_path):
    root = str(tmp_path / "store")
    offsets = ConsumerOffsets(root, persist_interval_ms=0)
    offsets.commit(TOPIC, "g", {0: 7})
    assert _document(root) == {"offsetTable": {"TopicTest@g": {"0": 7}}}
    offsets.commit(TOPIC, "h", {1: 2})
    assert _document(root) == {"offsetTable": {"TopicTest@g": {"0": 7}, "TopicTest@h": {"1": 2}}}
    assert not os.path.exists(_offsets_path(root) + ".journal")


# -- documents that parse but are not offset tables ------------------------------------------
@pytest.mark.parametrize("text, says", [
    ('{"offsetTable": {"TopicTest@g": "zzz"}}',
     "offsetTable['TopicTest@g'] is 'zzz', not an object of queue offsets"),
    ('{"offsetTable": {"TopicTest@g": {"0": "abc"}}}',
     "offsetTable['TopicTest@g']['0'] is 'abc', not a queue offset (a JSON integer >= 0)"),
    ('{"offsetTable": {"TopicTest@g": {"0": -1}}}', "['0'] is -1, not a queue offset"),
    ('{"offsetTable": {"TopicTest@g": {"0": 1.5}}}', "['0'] is 1.5, not a queue offset"),
    ('{"offsetTable": {"TopicTest@g": {"0": true}}}', "['0'] is True, not a queue offset"),
    ('{"offsetTable": {"TopicTest@g": {"07": 1}}}', "queue id '07' is not a decimal int >= 0"),
    ('{"offsetTable": {"TopicTest": {"0": 1}}}',
     "offsetTable key 'TopicTest' is not <topic>@<group>"),
    ('{"offsetTable": []}', "offsetTable is [], not an object of <topic>@<group> entries"),
    ('{"0": "abc"}', "no offsetTable: not an offset table"),
    ('{}', "no offsetTable: not an offset table"),
    ('[1, 2]', "the document is [1, 2], not a JSON object"),
    ("[" * 100_000, "nested too deep to parse"),
])
def test_a_document_of_the_wrong_shape_is_refused_naming_the_file(make_store, store_dir, text,
                                                                   says):
    store = make_store()
    _fill(store, 2, 2)
    os.makedirs(store_dir / "config", exist_ok=True)
    with open(_offsets_path(store_dir), "w") as f:
        f.write(text)
    calls = [lambda: store.consumer("g", TOPIC), lambda: store.peek("g", TOPIC),
             lambda: store.consumer_lag("g", TOPIC), store.consumer_groups,
             lambda: store.delete_consumer_group("g"),
             lambda: ConsumerOffsets(str(store_dir), persist_interval_ms=0).commit(TOPIC, "g",
                                                                                  {0: 1})]
    for call in calls:
        with pytest.raises(CorruptStateError) as err:
            call()
        assert str(err.value).startswith(f"{_offsets_path(store_dir)} ")
        assert says in str(err.value)
    with open(_offsets_path(store_dir)) as f:
        assert f.read() == text  # left as it is
    assert not os.path.exists(store_dir / "consumer" / "groups" / "g")


def test_a_document_that_lost_a_group_is_refused_not_read_as_a_new_group(make_store,
                                                                        store_dir):
    """A group consumed part of its queues and closed; the document is then replaced by one
    that parses but holds nothing for it (or removed). Read as a new group it would start at
    ``last`` and skip the 30 messages it never consumed: refused, naming the file, until the
    operator restores the file or forgets the group."""
    store = make_store()
    _fill(store, 10, 4)
    with store.consumer("g", TOPIC, consume_from="first") as c:
        assert len(c.poll(10)) == 10
        c.commit()
    with store.consumer("other", TOPIC, consume_from="first") as c:
        c.poll(40)
    mark = store_dir / "consumer" / "groups" / "g" / TOPIC / "recorded"
    assert mark.exists()
    saved = (store_dir / "config" / "consumerOffset.json").read_text()
    for replacement in ('{"offsetTable": {}}', '{"offsetTable": {"TopicTest@other": {"0": 10}}}',
                        None):
        if replacement is None:
            os.unlink(_offsets_path(store_dir))
        else:
            with open(_offsets_path(store_dir), "w") as f:
                f.write(replacement)
        for call in (lambda: store.consumer("g", TOPIC, consume_from="last"),
                     lambda: store.peek("g", TOPIC), lambda: store.consumer_lag("g", TOPIC),
                     store.consumer_groups):
            with pytest.raises(CorruptStateError) as err:
                call()
            assert str(err.value).startswith(
                f"{_offsets_path(store_dir)} has no offsets for group 'g' on topic "
                f"'{TOPIC}' (the file {'is missing' if replacement is None else 'holds none'}),"
                f" but {mark} says the group recorded some")
            assert "store.delete_consumer_group('g', 'TopicTest')" in str(err.value)
        if replacement is not None:
            with open(_offsets_path(store_dir)) as f:
                assert f.read() == replacement
    with open(_offsets_path(store_dir), "w") as f:
        f.write(saved)  # restored: the group goes on where it committed
    with store.consumer("g", TOPIC, consume_from="last") as c:
        assert sum(len(b) for _q, b in c.poll(100).batches) == 30
    os.unlink(_offsets_path(store_dir))
    assert store.delete_consumer_group("g") == []  # forgotten: nothing left but the marks
    assert not mark.exists()
    with store.consumer("g", TOPIC, consume_from="last") as c:  # a new group now
        assert len(c.poll(100)) == 0
        assert c.positions() == {q: 10 for q in range(4)}


def test_membership_entries_that_are_not_files_are_refused_naming_them(make_store, store_dir):
    store = make_store()
    _fill(store, 2, 2)
    with store.consumer("g", TOPIC, consume_from="first"):
        pass
    base = store_dir / "consumer" / "groups" / "g" / TOPIC
    os.mkdir(base / "members" / "stray")
    with pytest.raises(CorruptStateError, match=f"{base / 'members' / 'stray'} is not a plain "
                                                f"file"):
        store.consumer("g", TOPIC)
    os.rmdir(base / "members" / "stray")
    os.mkfifo(base / "members" / "fifo")  # opened without waiting for a writer
    with pytest.raises(CorruptStateError, match="members/fifo is not a plain file"):
        store.consumer("g", TOPIC)
    os.unlink(base / "members" / "fifo")
    os.unlink(base / "queues" / "1.lock")
    os.symlink(base / "queues" / "0.lock", base / "queues" / "1.lock")
    with pytest.raises(CorruptStateError, match="queues/1.lock is not a plain file"):
        store.consumer("g", TOPIC)
    assert os.path.islink(base / "queues" / "1.lock")
    os.unlink(base / "queues" / "1.lock")
    with store.consumer("g", TOPIC) as c:
        assert c.assignment == [0, 1]

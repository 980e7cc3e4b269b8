"""``config/topics.json`` on disk (``storage.topic_file``): changes applied to the file as it is
now and written whole, a refusal writing nothing, and a damaged file left alone, named, with
RocketMQ's backup pointed at."""

from __future__ import annotations

import os

import pytest

from mqstore.errors import CorruptStateError
from mqstore.format.topic_config import TopicTable, encode_table, new_topic
from mqstore.storage.topic_file import identity, read_table, topics_path, update_table


def _add(name: str, queues: int = 4):
    def change(current: TopicTable | None) -> TopicTable:
        topics = dict(current.topics) if current is not None else {}
        topics[name] = new_topic(name, queues, queues)
        return TopicTable(topicConfigTable=topics)
    return change


def test_changes_are_applied_to_the_file_as_it_is_now_and_written_as_rocketmq_does(tmp_path):
    path = topics_path(str(tmp_path))
    assert read_table(path) is None and identity(path) is None
    table, ident = update_table(path, _add("A"))
    assert ident == identity(path) and list(table.topics) == ["A"]
    table, _ident = update_table(path, _add("B", 8))  # on top of A, not instead of it
    assert sorted(table.topics) == ["A", "B"]
    text = open(path, encoding="utf-8").read()
    assert text == encode_table(table) and text.startswith("{\n\t\"dataVersion\":")
    assert read_table(path).topics["B"].write_queue_nums == 8
    assert sorted(os.listdir(os.path.dirname(path))) == ["topics.json", "topics.json.lock"]


def test_a_change_that_refuses_writes_nothing(tmp_path):
    path = topics_path(str(tmp_path))
    update_table(path, _add("A"))
    before = open(path, "rb").read(), identity(path)

    def refuse(current):
        raise ValueError("no")

    with pytest.raises(ValueError, match="^no$"):
        update_table(path, refuse)
    table, ident = update_table(path, lambda current: current)  # unchanged: not rewritten
    assert (open(path, "rb").read(), ident) == before and list(table.topics) == ["A"]


@pytest.mark.parametrize("content, problem", [
    (b"", "the file is empty"),
    (b"\xff{}", "not UTF-8 (invalid start byte at byte 0)"),
    (b'{"topicConfigTable": ', "not valid JSON"),
])
def test_a_damaged_file_is_refused_naming_it_and_left_as_it_is(tmp_path, content, problem):
    path = topics_path(str(tmp_path))
    os.makedirs(os.path.dirname(path))
    with open(path, "wb") as f:
        f.write(content)
    with pytest.raises(CorruptStateError) as caught:
        update_table(path, _add("A"))
    message = str(caught.value)
    assert message.startswith(f"topic configs {path} are damaged: {problem}")
    assert message.endswith("the file is left as it is: repair or remove it")
    assert open(path, "rb").read() == content
    with open(path + ".bak", "wb") as f:
        f.write(b"{}")
    with pytest.raises(CorruptStateError, match=r"put back topics\.json\.bak \(RocketMQ's "
                                                r"version before its last change\)"):
        read_table(path)

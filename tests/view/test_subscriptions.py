"""``subscriptions.json``: what is written, what a damaged file does (read as empty, logged, kept
aside before it is replaced), and what the bloom positions of an entry are."""

from __future__ import annotations

import json
import logging
import os

import pytest

from mqstore.format.cq_ext import bloom_positions, subscription_key
from mqstore.view.subscriptions import SUBSCRIPTIONS_FILE, Subscriptions, read_entries


def test_a_registration_is_written_whole_sorted_and_read_back(tmp_path):
    subs = Subscriptions(str(tmp_path))
    subs.register("g1", "T", "a > 1", 1000)
    subs.register("g2", "T", "b = 'x'", 2000, expression_type="SQL92")
    subs.register("g1", "T", "a > 2", 3000)  # replaces g1's
    doc = json.loads((tmp_path / SUBSCRIPTIONS_FILE).read_text())
    assert doc == [
        {"expression": "b = 'x'", "group": "g2", "registered_at": 2000, "topic": "T",
         "type": "SQL92"},
        {"expression": "a > 2", "group": "g1", "registered_at": 3000, "topic": "T",
         "type": "SQL92"}]
    again = Subscriptions(str(tmp_path))
    assert again.lookup("g1", "T")["expression"] == "a > 2"
    assert [e["group"] for e in again.for_topic("T")] == ["g2", "g1"]
    assert again.unregister("g2", "T") and not again.unregister("g2", "T")
    assert not os.path.exists(tmp_path / (SUBSCRIPTIONS_FILE + ".tmp"))


def test_an_entry_written_before_the_type_field_is_sql92(tmp_path):
    (tmp_path / SUBSCRIPTIONS_FILE).write_text(json.dumps(
        [{"group": "g", "topic": "T", "expression": "a > 1", "registered_at": 5}]))
    entries, problem = read_entries(str(tmp_path / SUBSCRIPTIONS_FILE))
    assert problem is None and entries[0]["type"] == "SQL92"


@pytest.mark.parametrize("content, problem", [
    (b"\xff[]", "not UTF-8 (invalid start byte at byte 0)"),
    (b'[{"group": ', "not valid JSON (Expecting value at line 1, column 12)"),
    (b'{"group": "g"}', "holds a dict, not a list of subscriptions"),
    (b'[{"group": "g", "topic": "T", "expression": "x", "registered_at": true}]',
     "entry 0: 'registered_at' is True, not a number"),
    (b'[3]', "entry 0 is a int, not an object"),
])
def test_a_damaged_file_reads_as_empty_with_its_problem_logged(tmp_path, caplog, content,
                                                               problem):
    (tmp_path / SUBSCRIPTIONS_FILE).write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="mqstore.view.subscriptions"):
        subs = Subscriptions(str(tmp_path))
    path = tmp_path / SUBSCRIPTIONS_FILE
    assert subs.entries == [] and subs.problem == f"{path}: {problem}"
    assert [r.getMessage() for r in caplog.records] == [
        f"subscriptions ignored, the file is damaged: {path}: {problem}; pulls filter every "
        f"message exactly until the groups register again"]
    assert path.read_bytes() == content  # reading changes nothing


def test_the_next_registration_keeps_the_damaged_file_aside(tmp_path):
    path = tmp_path / SUBSCRIPTIONS_FILE
    path.write_bytes(b"{not json")
    stamp = os.stat(path).st_mtime_ns
    subs = Subscriptions(str(tmp_path))
    subs.register("g", "T", "a > 1", 7)
    assert (tmp_path / f"{SUBSCRIPTIONS_FILE}.damaged.{stamp}").read_bytes() == b"{not json"
    assert subs.problem is None
    assert [e["group"] for e in json.loads(path.read_text())] == ["g"]


def test_reload_sees_another_writers_change_and_nothing_else(tmp_path):
    mine = Subscriptions(str(tmp_path))
    assert not mine.reload()
    Subscriptions(str(tmp_path)).register("g", "T", "a > 1", 7)
    assert mine.reload() and mine.lookup("g", "T") is not None
    assert not mine.reload()


def test_an_entrys_bloom_positions_are_its_group_and_topic_key(tmp_path):
    entry = {"group": "g", "topic": "T", "expression": "a > 1", "registered_at": 1}
    assert Subscriptions.positions(entry) == bloom_positions(subscription_key("g", "T"))

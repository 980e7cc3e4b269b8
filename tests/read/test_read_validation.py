"""Bad arguments to every public read: a ValueError naming the value and the rule, and nothing
touched on disk.

Reads take the put path's rules (``appender``): a queue id as a put's, ints in their field's
range, and topics by the rule of every name a read or a consumer uses as a path component
(the put rule's characters and dots, at most 255 characters, not only dots). The stores run in
the default configuration: the reading process follows the queues a dispatch worker writes,
so a read looks the queue's directory up (a 1000-character topic once raised
``OSError: File name too long`` there).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mqstore import GetStatus, Message

LONG = "x" * 1000
INT32_MAX, INT64_MAX = (1 << 31) - 1, (1 << 63) - 1
TOPIC_RULE = "must match ^[%|a-zA-Z0-9_.-]+$, at most 255 characters, not only dots"
LONG_TOPIC = f"topic 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx'... (1000 characters) {TOPIC_RULE}"
INT64 = f"[-{INT64_MAX + 1}, {INT64_MAX}]"

BAD_READS = [
    # get / read
    (lambda s: s.get("g", LONG, 0, 0), LONG_TOPIC),
    (lambda s: s.read(LONG, 0, 0), LONG_TOPIC),
    (lambda s: s.get("g", "../T", 0, 0), f"topic '../T' {TOPIC_RULE}"),
    (lambda s: s.read("a/b", 0, 0), f"topic 'a/b' {TOPIC_RULE}"),
    (lambda s: s.get("g", "..", 0, 0), f"topic '..' {TOPIC_RULE}"),
    (lambda s: s.get("g", "", 0, 0), f"topic '' {TOPIC_RULE}"),
    (lambda s: s.read(None, 0, 0), f"topic None {TOPIC_RULE}"),
    (lambda s: s.get("g", "T", -1, 0), f"queue_id -1 must be an int in [0, {INT32_MAX}]"),
    (lambda s: s.read("T", "0", 0), f"queue_id '0' must be an int in [0, {INT32_MAX}]"),
    (lambda s: s.get("g", "T", 0, 1.5), f"offset 1.5 must be an int in {INT64}"),
    (lambda s: s.read("T", 0, 1 << 64), f"offset {1 << 64} must be an int in {INT64}"),
    (lambda s: s.get("g", "T", 0, 0, -1), f"max_msgs -1 must be an int in [0, {INT32_MAX}]"),
    (lambda s: s.read("T", 0, 0, 2.0), f"max_msgs 2.0 must be an int in [0, {INT32_MAX}]"),
    (lambda s: s.read("T", 0, 0, max_total_bytes=-1),
     f"max_total_bytes -1 must be an int in [0, {INT64_MAX}]"),
    (lambda s: s.get("g", "T", 0, 0, max_total_bytes="1k"),
     f"max_total_bytes '1k' must be an int in [0, {INT64_MAX}]"),
    (lambda s: s.read("T", 0, 0, verify="no"), "verify 'no' must be True or False"),
    (lambda s: s.get(None, "T", 0, 0), "group None must be a string"),
    (lambda s: s.get("g", "T", 0, 0, expression=5), "expression 5 must be a string"),
    (lambda s: s.read("T", 0, 0, expression="a", expression_type=None),
     "expression_type None must be a string naming a filter type (e.g. 'TAG', 'SQL92')"),
    # lookups by commit-log offset and id
    (lambda s: s.message_at(1.5), f"phys_offset 1.5 must be an int in [0, {INT64_MAX}]"),
    (lambda s: s.message_at("0"), f"phys_offset '0' must be an int in [0, {INT64_MAX}]"),
    (lambda s: s.message_at(-1), f"phys_offset -1 must be an int in [0, {INT64_MAX}]"),
    (lambda s: s.message_at(True), f"phys_offset True must be an int in [0, {INT64_MAX}]"),
    (lambda s: s.message_by_id(7), "msg id 7 is not a hex string"),
    (lambda s: s.message_by_id("7F00"), "msg id '7F00' must be 32 (IPv4) or 56 (IPv6) hex "
                                        "characters, got 4"),
    # time
    (lambda s: s.offset_by_time("T", 0, None), f"timestamp_ms None must be an int in {INT64}"),
    (lambda s: s.offset_by_time("T", 0, 1.5), f"timestamp_ms 1.5 must be an int in {INT64}"),
    (lambda s: s.offset_by_time("T", 0, "5"), f"timestamp_ms '5' must be an int in {INT64}"),
    (lambda s: s.offset_by_time(LONG, 0, 0), LONG_TOPIC),
    (lambda s: s.offset_by_time("T", 0, 0, "sideways"),
     "boundary 'sideways' must be 'lower' or 'upper'"),
    (lambda s: s.earliest_message_time(LONG, 0), LONG_TOPIC),
    (lambda s: s.earliest_message_time("T", 1.5),
     f"queue_id 1.5 must be an int in [0, {INT32_MAX}]"),
    # queue bounds and queues
    (lambda s: s.min_offset(LONG, 0), LONG_TOPIC),
    (lambda s: s.max_offset("T", -1), f"queue_id -1 must be an int in [0, {INT32_MAX}]"),
    (lambda s: s.max_offset(None, 0), f"topic None {TOPIC_RULE}"),
    (lambda s: s.queue_ids(LONG), LONG_TOPIC),
    (lambda s: s.queue_ids(".."), f"topic '..' {TOPIC_RULE}"),
    (lambda s: s.consume_queue("../T", 0, create=True), f"topic '../T' {TOPIC_RULE}"),
    (lambda s: s.consume_queue(LONG, 0), LONG_TOPIC),
    # keys
    (lambda s: s.query_by_key(LONG, "k"), LONG_TOPIC),
    (lambda s: s.query_by_key("T", "k", max_num=1.5),
     f"max_num 1.5 must be an int in [0, {INT32_MAX}]"),
    (lambda s: s.query_by_key("T", "k", begin_ms="0"), f"begin_ms '0' must be an int in {INT64}"),
    (lambda s: s.query_by_key("T", "k", end_ms=1 << 64),
     f"end_ms {1 << 64} must be an int in {INT64}"),
    (lambda s: s.query_by_unique_key("../T", "k"), f"topic '../T' {TOPIC_RULE}"),
]


def files_of(root) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size
            for p in Path(root).rglob("*") if p.is_file() and p.name != "lock"}


@pytest.fixture(params=["writer", "read-only"])
def store(request, make_store, store_dir):
    store = make_store()
    assert store.put(Message("T", b"x", queue_id=0, keys=["k"])).status.stored
    store.wait_dispatched()
    if request.param == "read-only":
        store.close()
        store = make_store(read_only=True)
    return store


def test_every_read_refuses_bad_arguments_naming_them(store):
    before = files_of(store.root)
    dirs_before = sorted(p for p in Path(store.root).rglob("*") if p.is_dir())
    answers = []
    for call, _message in BAD_READS:
        try:
            call(store)
            answers.append("no error")
        except Exception as exc:  # noqa: BLE001 - any other exception is the failure shown
            answers.append(str(exc) if type(exc) is ValueError else repr(exc))
    assert answers == [message for _call, message in BAD_READS]
    assert sorted(p for p in Path(store.root).rglob("*") if p.is_dir()) == dirs_before
    assert {k: v for k, v in files_of(store.root).items() if k in before} == before
    # Good arguments still read: the rule lets every stored topic through.
    assert [m.body for m in store.get("g", "T", 0, 0).messages] == [b"x"]
    assert store.read("T", 0, 0, max_total_bytes=0).status is GetStatus.FOUND
    assert store.offset_by_time("T", 0, -1) == 0
    assert store.message_at(0).body == b"x"
    assert store.read("metrics.cpu", 0, 0).status is GetStatus.NO_MESSAGE_IN_QUEUE


def test_a_consumer_names_its_topic_by_the_same_rule(store):
    for bad in (LONG, "../T"):
        with pytest.raises(ValueError) as read_err:
            store.read(bad, 0, 0)
        with pytest.raises(ValueError) as consumer_err:
            store.consumer("g", bad)
        with pytest.raises(ValueError) as pop_err:
            store.pop("g", bad)
        assert str(read_err.value) == str(consumer_err.value) == str(pop_err.value)
    assert not os.path.exists(Path(store.root) / "consumer" / "groups" / "g")

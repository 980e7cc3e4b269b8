"""Group consumers (issue 14): poll and commit, resume after a restart and after SIGKILL,
isolated groups, where a new group starts, auto-commit, filters, lag, lazily decoded messages,
and bad input refused before anything reaches the disk."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from mqstore import GetStatus, Message, MessageStore
from mqstore.consumer import ConsumedMessage, Polled, QueueLag
from mqstore.consumer.offsets import ConsumerOffsets
from mqstore.errors import PluginError, StoreClosedError
from mqstore.testing import consumer_proc, fill

TOPIC = "T"


def put_all(store, count: int, queues: int = 3, topic: str = TOPIC, tags=None) -> None:
    fill(store, count, topic=topic, queues=queues, tags=tags)  # bodies m0000, m0001, ...


def drain(consumer, max_msgs: int = 7) -> list[tuple[int, int, bytes]]:
    got = []
    while True:
        polled = consumer.poll(max_msgs)
        if not polled:
            return got
        got += [(m.queue_id, m.queue_offset, m.body) for m in polled]


def offsets_file(store) -> dict:
    with open(os.path.join(store.root, "config", "consumerOffset.json")) as f:
        return json.load(f)


def test_poll_commit_and_resume_exactly_after_the_last_commit(make_store):
    store = make_store()
    put_all(store, 30)
    with store.consumer("billing", TOPIC, consume_from="first") as c:
        assert c.assignment == [0, 1, 2]
        first = c.poll(12)
        assert isinstance(first, Polled) and len(first) == 12
        # Each queue's messages in queue-offset order, no queue visited twice in one poll.
        for q in range(3):
            offs = [m.queue_offset for m in first if m.queue_id == q]
            assert offs == list(range(len(offs)))
        expected = {}
        for m in first:
            expected[m.queue_id] = max(expected.get(m.queue_id, 0), m.queue_offset + 1)
        assert c.commit() == expected
        committed = c.committed()
        assert committed == {q: expected.get(q, 0) for q in range(3)}
        second = c.poll(5)  # polled, never committed: delivered again after the restart
        assert len(second) == 5
    assert offsets_file(store) == {"offsetTable": {"T@billing": {
        str(q): off for q, off in committed.items()}}}
    with store.consumer("billing", TOPIC, consume_from="last") as c:
        assert c.positions() == {q: committed.get(q, 0) for q in range(3)}
        rest = drain(c)
    seen = [(m.queue_id, m.queue_offset) for m in first] + [(q, o) for q, o, _b in rest]
    assert sorted(seen) == sorted((i % 3, i // 3) for i in range(30))
    assert {(m.queue_id, m.queue_offset) for m in second} <= {(q, o) for q, o, _b in rest}


def test_a_killed_consumer_resumes_at_its_last_commit_and_skips_nothing(make_store, store_dir):
    store = make_store()
    put_all(store, 300)
    child = consumer_proc.ConsumerProcess(store_dir, "g", TOPIC, "--max-msgs", "10")
    try:
        assert child.wait_for(lambda p: len(p.committed()) == 3 and sum(
            p.committed().values()) >= 60), child.lines
    finally:
        child.kill()
    polled = child.polled()
    printed = child.committed()
    in_file = ConsumerOffsets(str(store_dir)).offsets(TOPIC, "g")  # document + journal
    with store.consumer("g", TOPIC) as c:
        assert c.positions() == in_file  # exactly where the file says
        rest = drain(c, 50)
    for q in range(3):
        # The file is at or past the last commit the child reported, and never past what it
        # polled: nothing is skipped.
        assert printed[q] <= in_file[q]
        assert in_file[q] in {last + 1 for pq, _f, last, _b in polled if pq == q} | {0}
        got = sorted(o for pq, o, _b in rest if pq == q)
        assert got == list(range(in_file[q], 100))
        child_got = {o for pq, f, last, _b in polled if pq == q for o in range(f, last + 1)}
        assert set(range(in_file[q])) <= child_got


def test_groups_are_isolated(make_store):
    store = make_store()
    put_all(store, 12)
    with store.consumer("a", TOPIC, consume_from="first") as a, \
            store.consumer("b", TOPIC, consume_from="first") as b:
        got_a = drain(a, 5)
        a.commit()
        assert len(got_a) == 12
        assert b.committed() == {0: 0, 1: 0, 2: 0}
        got_b = drain(b, 100)
        assert sorted(got_b) == sorted(got_a)
    table = offsets_file(store)["offsetTable"]
    assert table == {"T@a": {"0": 4, "1": 4, "2": 4}, "T@b": {"0": 0, "1": 0, "2": 0}}


def test_where_a_new_group_starts(make_store, manual_clock):
    store = make_store()
    manual_clock.now = 1_000_000
    put_all(store, 6, queues=2)
    manual_clock.now = 2_000_000
    put_all(store, 6, queues=2)  # offsets 3..5 of each queue, stored at 2,000,000
    with store.consumer("first", TOPIC, consume_from="first") as c:
        assert c.positions() == {0: 0, 1: 0}
    with store.consumer("ts", TOPIC, consume_from="timestamp",
                        consume_timestamp=1_500_000) as c:
        assert c.positions() == {0: 3, 1: 3}
    with store.consumer("last", TOPIC) as c:  # RocketMQ's default: CONSUME_FROM_LAST_OFFSET
        assert c.positions() == {0: 6, 1: 6}
        # The start is recorded at once: messages put now are not skipped after a restart.
        assert c.committed() == {0: 6, 1: 6}
    put_all(store, 2, queues=2)
    store.put(Message(TOPIC, b"q2-first", queue_id=2))  # a queue new to the group
    store.wait_dispatched()
    with store.consumer("last", TOPIC) as c:
        got = drain(c)
        assert sorted((q, o) for q, o, _b in got) == [(0, 6), (1, 6), (2, 0)]
    with store.consumer("half", TOPIC, consume_from="timestamp") as c:  # 30 min back
        assert c.positions() == {0: 0, 1: 0, 2: 0}


def test_auto_commit_commits_what_earlier_polls_returned(make_store, manual_scheduler):
    store = make_store({"consumer": {"auto_commit": True, "auto_commit_interval_ms": 5_000}},
                       scheduler=manual_scheduler)
    put_all(store, 9)
    with store.consumer("auto", TOPIC, consume_from="first") as c:
        assert c.auto_commit
        first = c.poll(4)
        assert c.committed() == {0: 0, 1: 0, 2: 0}
        manual_scheduler.advance(5.0)  # auto_commit_interval_ms
        c.poll(2)  # commits what the first poll returned, before reading on
        assert sum(c.committed().values()) == len(first) == 4
    assert sum(store._consumers.offsets.offsets(TOPIC, "auto").values()) == 6  # at close
    with pytest.raises(RuntimeError):
        with store.consumer("auto", TOPIC) as c:
            assert len(c.poll(3)) == 3
            raise RuntimeError("handler failed")
    assert sum(store._consumers.offsets.offsets(TOPIC, "auto").values()) == 6
    with store.consumer("manual", TOPIC, consume_from="first", auto_commit=False) as c:
        c.poll(9)
    assert store._consumers.offsets.offsets(TOPIC, "manual") == {0: 0, 1: 0, 2: 0}


def test_subscription_expressions_filter_what_poll_returns(make_store):
    store = make_store()
    put_all(store, 30, tags=lambda i: "TagA" if i % 3 == 0 else "TagB" if i % 3 == 1 else "TagC")
    with store.consumer("tags", TOPIC, "TagA || TagC", consume_from="first") as c:
        got = drain(c, 4)
        assert sorted(b for _q, _o, b in got) == [b"m%04d" % i for i in range(30) if i % 3 != 1]
        assert c.positions() == {0: 10, 1: 10, 2: 10}  # filtered ones are passed, not stuck
    with store.consumer("sql", TOPIC, "TAGS = 'TagB'", expression_type="SQL92",
                        consume_from="first") as c:
        assert sorted(b for _q, _o, b in drain(c)) == [b"m%04d" % i for i in range(30)
                                                        if i % 3 == 1]


def test_messages_are_lazy_rows_of_columnar_reads(make_store):
    store = make_store()
    store.put(Message(TOPIC, b"hello", queue_id=0, tags="A", keys=["k1"],
                      properties={"p": "v"}))
    store.wait_dispatched()
    with store.consumer("lazy", TOPIC, consume_from="first") as c:
        polled = c.poll(10)
    assert len(polled) == 1 and len(polled.batches) == 1
    q, batch = polled.batches[0]
    assert (q, len(batch), batch.status) == (0, 1, GetStatus.FOUND)
    msg = polled[0]
    assert isinstance(msg, ConsumedMessage)
    assert (msg.queue_id, msg.queue_offset, msg.body) == (0, 0, b"hello")
    assert msg._full is None  # columns only, so far
    assert (msg.tags, msg.keys, msg.properties["p"], msg.topic) == ("A", ["k1"], "v", TOPIC)
    assert msg._full is not None
    assert msg.msg_id == store.get("x", TOPIC, 0, 0, 1).messages[0].msg_id
    assert polled[-1].body == polled[0:1][0].body == b"hello"
    with pytest.raises(IndexError):
        polled[1]


def test_lag_counts_messages_and_the_age_of_the_oldest_unconsumed(make_store, manual_clock):
    store = make_store()
    manual_clock.now = 5_000_000
    put_all(store, 10, queues=2)
    manual_clock.now = 5_060_000
    with store.consumer("lagging", TOPIC, consume_from="first") as c:
        c.poll(3)  # 3 from one queue
        c.commit()
        lags = c.lag()
    assert lags == store.consumer_lag("lagging", TOPIC)
    by_q = {lag.queue_id: lag for lag in lags}
    assert all(isinstance(lag, QueueLag) for lag in lags)
    done = {q: off for q, off in store._consumers.offsets.offsets(TOPIC, "lagging").items()}
    for q in (0, 1):
        assert by_q[q].max_offset == 5
        assert by_q[q].committed_offset == done[q]
        assert by_q[q].lag == 5 - done[q]
        assert by_q[q].oldest_unconsumed_age_ms == 60_000
    with store.consumer("lagging", TOPIC) as c:
        drain(c)
        c.commit()
    assert [(lag.lag, lag.oldest_unconsumed_age_ms) for lag in store.consumer_lag(
        "lagging", TOPIC)] == [(0, 0), (0, 0)]
    assert [lag.committed_offset for lag in store.consumer_lag("nobody", TOPIC)] == [None, None]
    assert [lag.lag for lag in store.consumer_lag("nobody", TOPIC)] == [5, 5]


def test_a_read_only_opener_and_the_writer_commit_to_one_file(make_store, store_dir):
    store = make_store()
    put_all(store, 40, queues=4)
    with MessageStore.open(store_dir, read_only=True) as reader:
        with reader.consumer("ro", TOPIC, consume_from="first") as a, \
                store.consumer("rw", TOPIC, consume_from="first") as b:
            for _ in range(5):
                a.poll(3)
                a.commit()
                b.poll(2)
                b.commit()
            ro, rw = a.committed(), b.committed()
    table = offsets_file(store)["offsetTable"]
    assert {int(q): o for q, o in table["T@ro"].items()} == ro and sum(ro.values()) == 15
    assert {int(q): o for q, o in table["T@rw"].items()} == rw and sum(rw.values()) == 10


def _files(root, *dirs) -> dict:
    """Every path under ``root``'s ``dirs`` with its size and mtime."""
    out = {}
    for d in dirs:
        for path in sorted(Path(root, d).rglob("*")):
            st = path.lstat()
            out[str(path)] = (st.st_size, st.st_mtime_ns)
    return out


def test_a_peek_reads_what_the_group_would_get_without_joining_or_writing(make_store):
    store = make_store()
    put_all(store, 30)
    live = store.consumer("g", TOPIC, consume_from="first")
    assert len(live.poll(7)) == 7
    live.commit()
    committed = live.committed()
    store.put(Message(TOPIC, b"q3-first", queue_id=3))  # a queue new to the group
    store.wait_dispatched()
    members = os.path.join(store.root, "consumer", "groups", "g", TOPIC, "members")
    seats = os.listdir(members)
    before = _files(store.root, "consumer", "config")
    with store.peek("g", TOPIC, consume_from="last") as peek:
        # the committed offsets; a queue the group has none for from its first message
        assert peek.positions() == {**committed, 3: 0}
        peeked = drain(peek, 4)
        assert len(peek.poll(4)) == 0 and peek.positions() == {0: 10, 1: 10, 2: 10, 3: 1}
        assert live.assignment == [0, 1, 2]  # the live instance was not made to share
    assert os.listdir(members) == seats
    assert _files(store.root, "consumer", "config") == before  # not a byte written
    assert sorted((q, o) for q, o, _b in peeked) == sorted(
        [(q, o) for q in range(3) for o in range(committed[q], 10)] + [(3, 0)])
    live.close(commit=False)
    with store.consumer("g", TOPIC) as again:  # the group's own polls, from the same offsets
        assert drain(again, 4) == peeked  # the same messages in the same order
    # A group with no offsets: where consume_from says, and nothing recorded.
    with store.peek("new", TOPIC, consume_from="first") as peek:
        assert len(drain(peek, 100)) == 31
    with store.peek("new", TOPIC) as peek:
        assert len(peek.poll(100)) == 0
        assert peek.positions() == {0: 10, 1: 10, 2: 10, 3: 1}
    with store.peek("new", TOPIC, consume_from="timestamp", consume_timestamp=0) as peek:
        assert peek.positions() == {0: 0, 1: 0, 2: 0, 3: 0}
    assert (TOPIC, "new") not in store.consumer_groups()
    assert not os.path.exists(os.path.join(store.root, "consumer", "groups", "new"))


@pytest.mark.parametrize("call, needle", [
    (lambda s: s.consumer("bad group", TOPIC), "group 'bad group' must match ^[%|a-zA-Z0-9_-]+$"),
    (lambda s: s.consumer("g", "../etc"), "topic '../etc' must match ^[%|a-zA-Z0-9_.-]+$"),
    (lambda s: s.consumer("g", TOPIC, consume_from="middle"),
     "consume_from 'middle' must be one of 'first', 'last', 'timestamp'"),
    (lambda s: s.consumer("g", TOPIC, consume_timestamp=5),
     "consume_timestamp 5 is only used with consume_from='timestamp'"),
    (lambda s: s.consumer("g", TOPIC, consume_from="timestamp", consume_timestamp=-1),
     "consume_timestamp -1 must be an int >= 0"),
    (lambda s: s.consumer("g", TOPIC, "TAGS = ", expression_type="SQL92"), "SQL92"),
    (lambda s: s.consumer("g", TOPIC, auto_commit="yes"), "auto_commit 'yes' must be"),
    (lambda s: s.consumer("g", TOPIC, allocation="nearest"),
     "consumer.allocation: unknown allocation strategy 'nearest'; registered: average, "
     "average_by_circle"),
    (lambda s: s.consumer_lag("g g", TOPIC), "group 'g g' must match"),
    (lambda s: s.peek("g g", TOPIC), "group 'g g' must match"),
    (lambda s: s.peek("g", TOPIC, "TAGS = ", expression_type="SQL92"), "SQL92"),
    (lambda s: s.peek("g", TOPIC, consume_from="middle"), "consume_from 'middle' must be"),
])
def test_bad_input_is_refused_and_changes_nothing_on_disk(make_store, call, needle):
    store = make_store()
    put_all(store, 3)
    with pytest.raises((ValueError, PluginError)) as err:
        call(store)
    assert needle in str(err.value)
    assert not os.path.exists(os.path.join(store.root, "config", "consumerOffset.json"))
    assert not os.path.exists(os.path.join(store.root, "consumer", "groups"))


def test_bad_poll_arguments_and_closed_consumers(make_store):
    store = make_store()
    put_all(store, 3)
    c = store.consumer("g", TOPIC, consume_from="first")
    for kwargs, needle in (({"max_msgs": 0}, "max_msgs 0 must be an int >= 1"),
                           ({"timeout_ms": -1}, "timeout_ms -1 must be a number >= 0"),
                           ({"timeout_ms": float("nan")}, "timeout_ms nan")):
        with pytest.raises(ValueError, match=needle):
            c.poll(**kwargs)
    with pytest.raises(ValueError, match=r"queue_id 7 is not consumed by this instance"):
        c.seek(7, 0)
    with pytest.raises(ValueError, match=r"offset -2 must be an int >= 0"):
        c.seek(0, -2)
    assert c.committed() == {0: 0, 1: 0, 2: 0}
    c.seek(1, 1)
    assert [m.queue_offset for m in c.poll(10) if m.queue_id == 1] == []
    c.close()
    with pytest.raises(StoreClosedError):
        c.poll(1)
    members = os.path.join(store.root, "consumer", "groups", "g", TOPIC, "members")
    assert os.listdir(members) == []


def test_closing_the_store_closes_its_consumers(make_store):
    store = make_store({"consumer": {"auto_commit": True}})
    put_all(store, 3)
    c = store.consumer("g", TOPIC, consume_from="first")
    assert len(c.poll(10)) == 3
    store.close()  # commits (auto-commit) and leaves the group
    with pytest.raises(StoreClosedError):
        c.poll(1)
    with open(os.path.join(store.root, "config", "consumerOffset.json")) as f:
        assert json.load(f) == {"offsetTable": {"T@g": {"0": 1, "1": 1, "2": 1}}}

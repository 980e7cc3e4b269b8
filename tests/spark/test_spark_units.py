"""The connector's pure parts, without a SparkSession: splitting, admission, pushdown bounds,
options."""

from __future__ import annotations

import datetime as dt

import pytest
from pyspark.sql.datasource import (
    EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull, LessThan, LessThanOrEqual, Not,
)
from pyspark.sql.types import BinaryType, StringType, StructField, StructType

from mqstore.spark.options import (
    EARLIEST, LATEST, OptionError, parse_read_options, parse_write_options,
)
from mqstore.spark.planning import QueueRange, split
from mqstore.spark.pushdown import Pushed, accept
from mqstore.spark.stream_reader import admit
from mqstore.spark.writer import StreamWriter

UTC = dt.timezone.utc


def test_split_covers_each_range_exactly():
    ranges = [QueueRange("s", "a", 0, 10, 1010), QueueRange("s", "a", 1, 0, 7),
              QueueRange("s", "b", 0, 5, 305)]
    pieces = split(ranges, 4, 400)
    by_queue = {}
    for p in pieces:
        by_queue.setdefault((p.topic, p.queue_id), []).append((p.start, p.end))
    # a/0: 1000 messages: max(ceil(1000/400), round(1000*4/1307)) = 3 pieces.
    assert by_queue[("a", 0)] == [(10, 343), (343, 676), (676, 1010)]
    assert by_queue[("a", 1)] == [(0, 7)]
    assert by_queue[("b", 0)] == [(5, 305)]
    assert split([], 4, 10) == []


@pytest.mark.loops("thread")
def test_read_range_reads_across_segment_ends_with_the_same_rows(make_store, tmp_path,
                                                                  monkeypatch):
    from mqstore.message import MessageBatch
    from mqstore.spark import arrow_rows
    from mqstore.spark.arrow_rows import ReadSettings, read_range, to_record_batch
    monkeypatch.setattr(arrow_rows, "READ_ROWS", 200)  # about 2.5 segments of this queue
    root = tmp_path / "segments"
    store = make_store({"commit_log": {"segment_bytes": 64 * 1024}}, root=root)
    for k in range(30):
        store.put_batch(MessageBatch(topic="S", bodies=[b"%05d" % (k * 100 + i) + b"x" * 300
                                                        for i in range(100)],
                                     queue_ids=[i % 2 for i in range(100)], tags="t"))
    store.wait_dispatched()
    whole = store.read("S", 0, 0, 10_000)
    assert len(whole) == 1500 and len(set(whole.phys_offsets // (64 * 1024))) > 10
    part = QueueRange(str(root), "S", 0, 0, 1500)
    batches = list(read_range(part, ReadSettings()))
    assert [b.num_rows for b in batches] == [200] * 7 + [100]  # READ_ROWS, not cut at ends
    import pyarrow as pa
    got = pa.Table.from_batches(batches).to_pylist()
    assert got == pa.Table.from_batches([to_record_batch(store, part, whole)]).to_pylist()


def test_admit_shares_a_row_limit_by_backlog():
    start = {"/s": {"a": {"0": 10, "1": 0}}}
    latest = {"/s": {"a": {"0": 20, "1": 30}, "b": {"0": 5}}}
    assert admit(start, latest, None) == latest
    # Backlogs 10, 30, 5 (45) share 9: 2, 6, 1 exactly.
    assert admit(start, latest, 9) == {"/s": {"a": {"0": 12, "1": 6}, "b": {"0": 1}}}
    # One message: the largest remainder, ties broken by key.
    assert admit(start, latest, 1) == {"/s": {"a": {"0": 10, "1": 1}}}
    assert admit(latest, latest, 5) == latest  # nothing new: the same offsets


def _push(*filters) -> Pushed | None:
    pushed = Pushed()
    for f in filters:
        pushed = accept(pushed, f)
        if pushed is None:
            return None
    return pushed


def test_pushed_bounds():
    t0 = dt.datetime(2024, 1, 1, tzinfo=UTC)
    ms0 = int(t0.timestamp() * 1000)
    p = _push(GreaterThan(("store_timestamp",), t0 + dt.timedelta(microseconds=500)),
              LessThanOrEqual(("store_timestamp",), t0 + dt.timedelta(milliseconds=5)),
              GreaterThanOrEqual(("queue_offset",), 3), LessThan(("queue_offset",), 9),
              In(("queue_id",), [1, 2]), EqualTo(("topic",), "a"), IsNotNull(("body",)))
    assert p.time_range == (ms0 + 1, ms0 + 6)
    assert p.offset_range == (3, 9)
    assert p.queue_ids == {1, 2} and p.topics == {"a"}
    assert _push(In(("queue_id",), [1, "2"])) is None
    assert _push(EqualTo(("store_timestamp",), dt.datetime(2024, 1, 1))) is None  # naive
    assert _push(Not(EqualTo(("queue_id",), 1))) is None
    assert _push(EqualTo(("properties", "k"), "v")) is None
    assert _push(EqualTo(("queue_offset",), True)) is None
    assert _push(In(("tags",), ["x", "y"]), EqualTo(("tags",), "y")).tags == {"y"}
    assert Pushed(tags=frozenset({"a||b"})).tag_expression() is None
    assert Pushed(tags=frozenset({"b", "a"})).tag_expression() == "a || b"


def test_read_options():
    opts = parse_read_options({"path": "/a, /b", "topics": "x,y,x", "queue_ids": "0,3",
                               "startingOffsets": '{"x": {"0": 5, "3": -2}}',
                               "endingOffsets": "latest", "verifyChecksums": "FALSE"},
                              streaming=False)
    assert opts.paths == ("/a", "/b") and opts.topics == ("x", "y")
    assert opts.queue_ids == {0, 3} and not opts.verify_checksums
    assert opts.starting.per_queue == {"x": {0: 5, 3: EARLIEST}}
    assert opts.ending.default == LATEST
    assert parse_read_options({"path": "/a"}, streaming=True).starting.default == LATEST
    with pytest.raises(OptionError, match="option path is required"):
        parse_read_options({}, streaming=False)
    with pytest.raises(OptionError, match="endingOffsets does not apply to a streaming read"):
        parse_read_options({"path": "/a", "endingOffsets": "latest"}, streaming=True)
    with pytest.raises(OptionError, match="queue 0 has offset -1, which is not allowed here"):
        parse_read_options({"path": "/a", "startingOffsets": '{"x": {"0": -1}}'},
                           streaming=False)


def test_write_options_and_sink_identity(tmp_path):
    a = parse_write_options({"path": str(tmp_path / "s"), "checkpointLocation": "/ck/q1"})
    b = parse_write_options({"path": str(tmp_path / "s"), "checkpointLocation": "/ck/q1/"})
    assert a.sink_id == b.sink_id and a.sink_id.startswith("ckpt-")
    assert a.staging_dir == str(tmp_path / "s" / "spark-staging")
    assert parse_write_options({"path": "/s", "sinkId": "orders-copy"}).sink_id == "orders-copy"
    with pytest.raises(OptionError, match="sinkId 'a/b' must be a non-empty name"):
        parse_write_options({"path": "/s", "sinkId": "a/b"})
    with pytest.raises(OptionError, match="must name one store directory"):
        parse_write_options({"path": "/s1,/s2"})
    schema = StructType([StructField("topic", StringType()), StructField("body", BinaryType())])
    with pytest.raises(OptionError, match="needs the checkpointLocation option"):
        StreamWriter(parse_write_options({"path": "/s"}), schema)


def test_every_option_is_documented():
    from pathlib import Path

    from mqstore.spark import options
    doc = (Path(__file__).resolve().parents[2] / "docs" / "spark.md").read_text()
    for name in (*options._READ.values(), *options._WRITE.values()):
        assert f"`{name}`" in doc, name

"""df.write / writeStream.format("mqstore"): staged rows appended by the job's commit under the
store's writer lock; aborts, bad rows and a busy store append nothing and leave no staged files;
streaming commits append each batch id once."""

from __future__ import annotations

import json
import os

import pytest
import yaml
from pyspark.sql import Row
from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, MapType, StringType, StructField, StructType,
)

from mqstore import Message, MessageStore, load_config
from mqstore.spark import sink_ledger
from spark_helpers import SMALL_STORE, put_messages, stored_rows

SCHEMA = StructType([
    StructField("topic", StringType()), StructField("body", BinaryType()),
    StructField("tags", StringType()), StructField("keys", ArrayType(StringType())),
    StructField("properties", MapType(StringType(), StringType())),
    StructField("queue_id", IntegerType()), StructField("ignored", StringType()),
])


def rows(n, topic="orders", **over):
    return [Row(**{"topic": topic, "body": b"b%d" % i, "tags": f"t{i % 2}",
                   "keys": [f"k{i}"], "properties": {"n": str(i)}, "queue_id": i % 2,
                   "ignored": "x", **over}) for i in range(n)]


def write(spark, data, root, config, schema=SCHEMA, slices=2, **options):
    df = spark.createDataFrame(data, schema).repartition(slices) if slices != 2 else \
        spark.sparkContext.parallelize(data, 2).toDF(schema)
    writer = df.write.format("mqstore").mode("append").option("path", str(root)) \
        .option("config", config)
    for name, value in options.items():
        writer = writer.option(name, value)
    writer.save()


def contents(root) -> list[tuple]:
    with MessageStore.open(root, read_only=True) as store:
        return [(r["topic"], r["queue_id"], r["queue_offset"], r["body"], r["tags"], r["keys"],
                 {k: v for k, v in r["properties"].items() if k not in ("TAGS", "KEYS")})
                for r in stored_rows(store)]


def staged_files(root) -> list[str]:
    staging = os.path.join(root, "spark-staging")
    return [os.path.join(d, f) for d, _dirs, files in os.walk(staging) for f in files]


def test_batch_write_appends_every_row_in_partition_order(spark, tmp_path, config_file):
    root = tmp_path / "new-store"  # created by the write, with the config's small segments
    write(spark, rows(6), root, config_file)
    assert contents(root) == [
        ("orders", 0, 0, b"b0", "t0", ["k0"], {"n": "0"}),
        ("orders", 0, 1, b"b2", "t0", ["k2"], {"n": "2"}),
        ("orders", 0, 2, b"b4", "t0", ["k4"], {"n": "4"}),
        ("orders", 1, 0, b"b1", "t1", ["k1"], {"n": "1"}),
        ("orders", 1, 1, b"b3", "t1", ["k3"], {"n": "3"}),
        ("orders", 1, 2, b"b5", "t1", ["k5"], {"n": "5"})]
    with MessageStore.open(root, read_only=True) as store:
        assert store.internals.commit_log.segment_bytes == 1 << 20
        phys = [r["phys_offset"] for r in stored_rows(store)]
    assert sorted(phys)[:3] == [phys[0], phys[3], phys[1]]  # appended b0, b1, b2, ...
    assert staged_files(root) == [] and not os.path.exists(root / "spark-staging")
    # Only topic and body, a string body, the queue selector choosing: appended after.
    plain = StructType([StructField("topic", StringType()), StructField("body", StringType())])
    write(spark, [("orders", "héllo"), ("audit", "x")], root, config_file, schema=plain)
    got = contents(root)
    assert [r[3] for r in got if r[0] == "audit"] == [b"x"]
    assert len(got) == 8 and "héllo".encode() in [r[3] for r in got]


def test_failed_job_appends_nothing_and_leaves_no_staged_files(spark, tmp_path, config_file):
    root = tmp_path / "s"
    write(spark, rows(4), root, config_file)
    before = contents(root)

    def explode(index, it):
        if index == 1:
            raise RuntimeError("task blew up")
        return it

    df = spark.sparkContext.parallelize(rows(6), 2).mapPartitionsWithIndex(explode).toDF(SCHEMA)
    with pytest.raises(Exception, match="task blew up"):
        df.write.format("mqstore").mode("append").option("path", str(root)) \
            .option("config", config_file).save()
    assert contents(root) == before
    assert staged_files(root) == []


@pytest.mark.parametrize("bad, message", [
    # Six rows in two partitions: row i is row i % 3 of partition i // 3.
    ({3: {"topic": None}}, "row 0 of partition 1: topic is null"),
    ({2: {"topic": "no spaces"}}, "row 2 of partition 0: topic 'no spaces' must match"),
    ({4: {"body": b"x" * 2000}}, "row 1 of partition 1: body of 2000 bytes exceeds "
                                 "commit_log.max_message_bytes (1024)"),
    ({5: {"tags": "a\x01b"}}, "row 2 of partition 1: tags 'a\\x01b' contains a reserved"),
    ({1: {"properties": {"TAGS": "dup"}}}, "row 1 of partition 0: property 'TAGS' is 'dup' in "
                                           "properties but the tags column holds 't1'"),
])
def test_bad_rows_fail_the_job_naming_position_and_reason(spark, tmp_path, bad, message):
    config = tmp_path / "small.yaml"
    config.write_text(yaml.safe_dump({**SMALL_STORE, "commit_log": {
        "segment_bytes": 1 << 20, "max_message_bytes": 1024}}))
    root = tmp_path / "s"
    write(spark, rows(2), root, str(config))
    before = contents(root)
    data = rows(6)
    for i, change in bad.items():
        data[i] = Row(**{**data[i].asDict(), **change})
    with pytest.raises(Exception) as err:
        write(spark, data, root, str(config))
    assert message in str(err.value) and "nothing was written" in str(err.value)
    assert contents(root) == before
    assert staged_files(root) == []


def test_store_open_for_writing_elsewhere_is_refused(spark, tmp_path, config_file, open_store):
    root = tmp_path / "s"
    store = open_store(root)  # this process holds the writer lock; Spark's commit cannot
    put_messages(store, "orders", 3)
    with pytest.raises(Exception) as err:
        write(spark, rows(4), root, config_file)
    assert "is open for writing by another process" in str(err.value)
    assert len(stored_rows(store)) == 3
    assert staged_files(root) == []


def test_mode_and_columns_are_checked(spark, tmp_path, config_file):
    df = spark.createDataFrame([("a",)], "topic string")
    with pytest.raises(Exception, match="needs a 'body' column"):
        df.write.format("mqstore").mode("append").option("path", str(tmp_path / "s")).save()
    df = spark.createDataFrame([("a", b"x")], "topic string, body binary")
    with pytest.raises(Exception, match="only appends"):
        df.write.format("mqstore").mode("overwrite").option("path", str(tmp_path / "s")).save()
    df = spark.createDataFrame([("a", b"x", 1.5)], "topic string, body binary, queue_id double")
    with pytest.raises(Exception, match="column 'queue_id' has type double"):
        df.write.format("mqstore").mode("append").option("path", str(tmp_path / "s")).save()


# -- streaming ------------------------------------------------------------------------------
def _ledger_table(n, start=0):
    import pyarrow as pa
    return pa.table({"topic": ["orders"] * n, "body": [b"s%d" % i for i in range(start, start + n)],
                     "queue_id": pa.array([i % 2 for i in range(n)], pa.int64())})


def _marked(root, value):
    with MessageStore.open(root, read_only=True) as store:
        return [r["body"] for r in stored_rows(store)
                if r["properties"].get(sink_ledger.MARKER) == value]


def test_ledger_appends_each_batch_once_whatever_the_crash(tmp_path):
    """Every place a commit can die: after the append (ledger not written), inside the
    append (a prefix of the rows written), and a plain replay of a recorded batch."""
    from mqstore.spark.appends import append_rows
    root = tmp_path / "s"
    config = load_config(overrides=SMALL_STORE)
    parts = [(0, 5)]
    with MessageStore.open(root, config) as store:
        assert sink_ledger.commit_batch(store, "q1", 0, _ledger_table(5), parts) == 5
        assert sink_ledger.commit_batch(store, "q1", 0, _ledger_table(5), parts) == 0  # replay
        before = sink_ledger.load(store, "q1")
        assert sink_ledger.commit_batch(store, "q1", 1, _ledger_table(5, 5), parts) == 5
        # Died after the append, before the ledger: the ledger still says batch 0.
        sink_ledger.save_entry(store, "q1", before)
        assert sink_ledger.commit_batch(store, "q1", 1, _ledger_table(5, 5), parts) == 0
        assert sink_ledger.load(store, "q1")["batch_id"] == 1
        # Died inside the append of batch 2: its first 3 rows made it.
        before = sink_ledger.load(store, "q1")
        append_rows(store, _ledger_table(5, 10).slice(0, 3), parts,
                    {sink_ledger.MARKER: "q1/2"})
        assert sink_ledger.commit_batch(store, "q1", 2, _ledger_table(5, 10), parts) == 2
        # Another sink's batch ids are its own.
        assert sink_ledger.commit_batch(store, "q2", 0, _ledger_table(1, 99), [(0, 1)]) == 1
    assert _marked(root, "q1/0") == [b"s0", b"s2", b"s4", b"s1", b"s3"]  # queue order
    assert sorted(_marked(root, "q1/1")) == sorted(b"s%d" % i for i in range(5, 10))
    assert sorted(_marked(root, "q1/2")) == sorted(b"s%d" % i for i in range(10, 15))
    assert _marked(root, "q2/0") == [b"s99"]


def _copy_stream(spark, src, dest, checkpoint, config, **options):
    df = (spark.readStream.format("mqstore").option("path", str(src))
          .option("startingOffsets", "earliest").load().select("topic", "body", "tags"))
    writer = (df.writeStream.format("mqstore").option("path", str(dest))
              .option("config", config).option("checkpointLocation", str(checkpoint)))
    for name, value in options.items():
        writer = writer.option(name, value)
    query = writer.trigger(availableNow=True).start()
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()


def test_stream_write_exactly_once_across_replays(spark, tmp_path, config_file, open_store):
    src, dest, ck = tmp_path / "src", tmp_path / "dest", tmp_path / "ck"
    source = open_store(src)
    put_messages(source, "orders", 6, queues=2)
    _copy_stream(spark, src, dest, ck, config_file)
    bodies = lambda: sorted(r[3] for r in contents(dest))  # noqa: E731
    assert bodies() == sorted(b"orders-%d" % i for i in range(6))
    put_messages(source, "orders", 3, queues=2, start=6)
    _copy_stream(spark, src, dest, ck, config_file)  # a restart goes on where it stopped
    assert bodies() == sorted(b"orders-%d" % i for i in range(9))
    last = max(int(n) for n in os.listdir(ck / "commits") if n.isdigit())
    (ledger_file,) = (dest / sink_ledger.LEDGER_DIR).iterdir()
    assert json.loads(ledger_file.read_text())["batch_id"] == last
    # Spark replays the last batch (its commit marker is gone), and the ledger lost it too,
    # as after a crash between the append and the ledger: nothing is appended twice.
    ledger_file.write_text(json.dumps({"batch_id": last - 1, "queue_offsets": {}}))
    for name in (str(last), f".{last}.crc"):
        os.remove(ck / "commits" / name)
    _copy_stream(spark, src, dest, ck, config_file)
    assert bodies() == sorted(b"orders-%d" % i for i in range(9))
    assert json.loads(ledger_file.read_text())["batch_id"] == last
    assert staged_files(dest) == []


# -- mirroring a store ----------------------------------------------------------------------
def _answers(root, topic, queue_id):
    """What ``get`` answers for every message of one queue: body, tags, keys, properties."""
    with MessageStore.open(root, read_only=True) as store:
        got = store.get("mirror-check", topic, queue_id, 0, 64)
        return [(m.body, m.tags, m.keys, m.properties) for m in got.messages]


def test_a_store_mirrors_into_another_with_every_column(spark, tmp_path, config_file,
                                                        open_store):
    """Read with every column selected (TAGS and KEYS are in properties too), optionally
    filter, write: the copy answers ``get`` like the original, with new offsets. Before,
    the write refused the first row: "property 'TAGS' is set both as a field and in
    properties"."""
    src, dest, filtered = tmp_path / "src", tmp_path / "dest", tmp_path / "filtered"
    source = open_store(src)
    put_messages(source, "orders", 8, queues=2)
    source.put_batch([  # no tag, no keys, keys that a read splits, a KEYS property alone
        Message("orders", b"plain", queue_id=0),
        Message("orders", b"spaced", queue_id=1, properties={"KEYS": "a  b", "x": "1"}),
        Message("orders", b"tagged", tags="t9", keys=["only"], queue_id=1)])
    source.wait_dispatched()
    df = spark.read.format("mqstore").option("path", str(src)).load()
    df.write.format("mqstore").mode("append").option("path", str(dest)) \
        .option("config", config_file).save()
    for q in (0, 1):
        original = _answers(src, "orders", q)
        assert len(original) in (5, 6) and _answers(dest, "orders", q) == original
    with MessageStore.open(dest, read_only=True) as copy:
        assert [copy.max_offset("orders", q) for q in (0, 1)] == [5, 6]
        assert copy.query_by_key("orders", "a", 10)[0].body == b"spaced"
    # Filtered on the way (the store takes both filters): what they keep, queue by queue.
    df.where("tags IN ('t1', 't9') AND queue_offset >= 1").write.format("mqstore") \
        .mode("append").option("path", str(filtered)).option("config", config_file).save()
    kept = [a for q in (0, 1) for offset, a in enumerate(_answers(src, "orders", q))
            if a[1] in ("t1", "t9") and offset >= 1]
    assert [a for q in (0, 1) for a in _answers(filtered, "orders", q)] == kept
    assert len(kept) == 3


def test_tags_or_keys_that_their_properties_contradict_are_refused(spark, tmp_path,
                                                                   config_file, open_store):
    src = tmp_path / "src"
    put_messages(open_store(src), "orders", 4, queues=1)
    from pyspark.sql import functions as F
    df = spark.read.format("mqstore").option("path", str(src)).load() \
        .withColumn("keys", F.when(F.col("queue_offset") == 2, F.array(F.lit("other")))
                    .otherwise(F.col("keys")))
    with pytest.raises(Exception) as err:
        df.coalesce(1).write.format("mqstore").mode("append").option("path", str(tmp_path / "d")) \
            .option("config", config_file).save()
    assert ("row 2 of partition 0: property 'KEYS' is 'k2' in properties but the keys column "
            "holds ['other']") in str(err.value)
    assert "nothing was written" in str(err.value)
    assert not (tmp_path / "d" / "commitlog").exists() or contents(tmp_path / "d") == []

"""spark.read.format("mqstore"): columns, options, partitions, several stores, RocketMQ's own
store, and a store another process is writing."""

from __future__ import annotations

import base64
import ipaddress
import os
import subprocess
import sys
import textwrap

import pytest

from mqstore import Message
from mqstore.spark.schema import COLUMN_NAMES
from spark_helpers import SMALL_STORE, keys_of, put_messages, rows_of, spark_time, stored_rows

ISSUE_COLUMNS = ["topic", "queue_id", "queue_offset", "phys_offset", "msg_id", "tags", "keys",
                 "properties", "body", "born_timestamp", "store_timestamp", "born_host",
                 "store_host", "flag", "sys_flag", "reconsume_times", "size", "store"]
BASE_MS = 1_700_000_000_000  # the manual clock's start


def read(spark, path, **options):
    reader = spark.read.format("mqstore").option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


@pytest.fixture
def varied(tmp_path, open_store, manual_clock):
    """Two topics over three queues with tags, keys, properties and hosts of every kind;
    message i is stored at BASE_MS + 1000 i."""
    root = tmp_path / "varied"
    store = open_store(root)
    for i in range(30):
        store.put(Message(
            topic="orders" if i % 5 else "audit", body=b"body-%d" % i, queue_id=i % 3,
            tags=None if i % 4 == 0 else f"tag{i % 2}",
            keys=[] if i % 3 == 0 else [f"k{i}", "shared"],
            properties={"温度": f"{i}℃"} if i % 2 else None, flag=i % 7,
            born_host="[2001:db8::1]:7" if i % 6 == 0 else "10.0.0.%d:5%d" % (i % 4, i % 3)))
        manual_clock.advance(1000)
    store.wait_dispatched()
    return root, store


def test_schema_and_every_field(spark, varied):
    root, store = varied
    df = read(spark, root)
    assert df.columns == ISSUE_COLUMNS == list(COLUMN_NAMES)
    assert dict(df.dtypes) == {
        "topic": "string", "queue_id": "int", "queue_offset": "bigint",
        "phys_offset": "bigint", "msg_id": "string", "tags": "string", "keys": "array<string>",
        "properties": "map<string,string>", "body": "binary", "born_timestamp": "timestamp",
        "store_timestamp": "timestamp", "born_host": "string", "store_host": "string",
        "flag": "int", "sys_flag": "int", "reconsume_times": "int", "size": "int",
        "store": "string"}
    got = rows_of(df)
    assert len(got) == 30 and got == stored_rows(store, str(root))
    first = got[0]  # audit/0 offset 0 is message 0
    assert (first["body"], first["tags"], first["keys"]) == (b"body-0", None, [])
    assert first["store_timestamp"] == spark_time(BASE_MS)
    assert first["born_host"] == "[2001:db8::1]:7" and first["store_host"] == "127.0.0.1:10911"
    assert {r["properties"].get("温度") for r in got} >= {"1℃", "29℃", None}


def test_offsets_options(spark, varied):
    root, _store = varied
    assert keys_of(read(spark, root, topics="audit")) == [
        ("audit", 0, 0), ("audit", 0, 1), ("audit", 1, 0), ("audit", 1, 1),
        ("audit", 2, 0), ("audit", 2, 1)]
    assert keys_of(read(spark, root, topics="orders,audit", queue_ids="2")) == [
        ("audit", 2, 0), ("audit", 2, 1), *(("orders", 2, o) for o in range(8))]
    df = read(spark, root, topics="orders", startingOffsets='{"orders": {"0": 5, "1": -2}}',
              endingOffsets='{"orders": {"0": 7, "2": 1}}')
    assert keys_of(df) == [("orders", 0, 5), ("orders", 0, 6), *(("orders", 1, o)
                                                                  for o in range(8)),
                           ("orders", 2, 0)]
    assert keys_of(read(spark, root, startingOffsets="earliest", endingOffsets="latest",
                        topics="audit", queue_ids="0")) == [("audit", 0, 0), ("audit", 0, 1)]


def test_timestamp_options(spark, varied):
    root, _store = varied
    # Messages 10..19 are stored in [BASE + 10 s, BASE + 20 s).
    df = read(spark, root, startingTimestamp=str(BASE_MS + 10_000),
              endingTimestamp=str(BASE_MS + 20_000))
    bodies = sorted(int(r.body[5:]) for r in df.select("body").collect())
    assert bodies == list(range(10, 20))


def test_expression_options(spark, varied):
    root, _store = varied
    tagged = read(spark, root, expression="tag1 || nothing")
    assert sorted(int(r.body[5:]) for r in tagged.collect()) == [
        i for i in range(30) if i % 4 and i % 2 == 1]
    sql = read(spark, root, expression="TAGS = 'tag0' AND KEYS IS NOT NULL",
               expressionType="SQL92")
    assert sorted(int(r.body[5:]) for r in sql.collect()) == [
        i for i in range(30) if i % 4 and i % 2 == 0 and i % 3]


def test_partitions_split_long_ranges(spark, tmp_path, open_store):
    root = tmp_path / "long"
    store = open_store(root)
    put_messages(store, "big", 1000, queues=2)
    put_messages(store, "small", 10)
    df = read(spark, root, minPartitions="4", maxMessagesPerPartition="300")
    # big/0 and big/1 hold 500 each: 2 pieces each for 4 cores, 300 at most: 2 (250 each).
    assert df.rdd.getNumPartitions() == 5
    sizes = sorted(len(p) for p in df.select("topic").rdd.glom().collect())
    assert sizes == [10, 250, 250, 250, 250]
    assert keys_of(df) == sorted([("big", i % 2, i // 2) for i in range(1000)]
                                 + [("small", 0, i) for i in range(10)])
    assert read(spark, root, minPartitions="1").rdd.getNumPartitions() == 3


def test_verify_checksums_off_reads_the_same(spark, varied):
    root, store = varied
    assert rows_of(read(spark, root, verifyChecksums="false")) == stored_rows(store, str(root))


@pytest.mark.parametrize("options, message", [
    ({"path": "/nonexistent/store"}, "'/nonexistent/store' is not a store directory"),
    ({"startingOffsets": "soon"}, "'soon' must be earliest, latest or JSON"),
    ({"startingOffsets": "latest"}, "startingOffsets 'latest' is not allowed here"),
    ({"endingOffsets": '{"orders": {"x": 1}}'}, "queue id 'x', not an integer"),
    ({"queue_ids": "1,-2"}, "'-2' is not a queue id"),
    ({"expressionType": "XPATH"}, "'XPATH' must be TAG or SQL92"),
    ({"startingOffsets": "earliest", "startingTimestamp": "5"}, "not both"),
    ({"minPartitions": "0"}, "minPartitions '0' must be an integer >= 1"),
    ({"maxMessagesPerTrigger": "5"}, "maxMessagesPerTrigger does not apply to a batch read"),
    ({"topics": "missing"}, "topics names 'missing', which none of the stores"),
    ({"startingOfsets": "earliest"}, "unknown mqstore read option(s) ['startingofsets']"),
])
def test_bad_options_name_value_and_rule(spark, varied, options, message):
    root, _store = varied
    options = {"path": str(root), **options}
    with pytest.raises(Exception) as err:
        read(spark, options.pop("path"), **options).count()
    assert message in str(err.value)


def test_several_stores_and_a_glob(spark, tmp_path, open_store):
    roots = [tmp_path / "brokers" / f"broker-{i}" for i in range(3)]
    stores = [open_store(root) for root in roots]
    for i, store in enumerate(stores):
        put_messages(store, "orders", 4 + i, queues=2)
    listed = read(spark, ",".join(map(str, roots[:2]))).select("store").collect()
    assert sorted(r.store for r in listed) == [str(roots[0])] * 4 + [str(roots[1])] * 5
    # A glob: every store's rows as that store numbered them, told apart by `store`.
    globbed = rows_of(read(spark, tmp_path / "brokers" / "broker-*"))
    assert globbed == [row for root, store in zip(roots, stores)
                       for row in stored_rows(store, str(root))]
    assert len(globbed) == 15


def test_rocketmq_store_read_only(spark, rocketmq_dir, manifest):
    before = {p: os.path.getmtime(p) for p in rocketmq_dir.rglob("*") if p.is_file()}
    rows = rows_of(read(spark, rocketmq_dir))
    assert len(rows) == manifest["summary"]["messageCount"] == 300
    by_offset = {m["commitLogOffset"]: m for m in manifest["messages"]}
    for row in rows:
        m = by_offset[row["phys_offset"]]
        assert (row["topic"], row["queue_id"], row["queue_offset"]) == (
            m["topic"], m["queueId"], m["queueOffset"])
        assert row["msg_id"] == m["msgId"] and row["size"] == m["size"]
        assert row["tags"] == m["tags"] and row["properties"] == m["propertiesDecoded"]
        assert row["keys"] == [k for k in (m["keys"] or "").split(" ") if k]
        assert row["body"] == base64.b64decode(m["body"])
        assert row["sys_flag"] == m["sysFlag"] and row["flag"] == m["flag"]
        assert row["born_timestamp"] == spark_time(m["bornTimestamp"])
        assert row["store_timestamp"] == spark_time(m["storeTimestamp"])
        for col, host in (("born_host", m["bornHost"]), ("store_host", m["storeHost"])):
            ip = ipaddress.ip_address(host["ip"])  # written as Java spells it, read as Python
            assert row[col] == (f"[{ip}]:{host['port']}" if ip.version == 6
                                else f"{ip}:{host['port']}")
    after = {p: os.path.getmtime(p) for p in rocketmq_dir.rglob("*") if p.is_file()}
    assert after == before  # read-only: not a file touched


WRITER = textwrap.dedent("""
    import json, os, sys, time
    from mqstore import MessageStore, load_config
    from mqstore.message import MessageBatch
    root, stop, config = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    store = MessageStore.open(root, load_config(overrides=config))
    i = 0
    while not os.path.exists(stop) and i < 1_000_000:
        bodies = [b"m%08d" % (i + k) + b"x" * (i % 500) for k in range(20)]
        store.put_batch(MessageBatch(topic="live", bodies=bodies, queue_ids=0))
        if i == 0:  # a read from now on finds rows
            store.wait_dispatched(60)
            print("ready", flush=True)
        i += 20
        time.sleep(0.01)
    store.close()
""")
# What a whole row holds: its offset in the body, padded by its batch's first offset mod 500.
EXPECTED_BODY = ("concat(cast(format_string('m%08d', queue_offset) as binary), "
                 "cast(repeat('x', cast(((queue_offset - queue_offset % 20) % 500) as int)) "
                 "as binary))")


def test_store_written_by_another_process(spark, tmp_path):
    """Each read sees a prefix of what the writer appended: contiguous offsets from 0 and
    every body whole, fixed when the DataFrame is planned."""
    import json
    root, stop = tmp_path / "live", tmp_path / "stop"
    writer = subprocess.Popen([sys.executable, "-c", WRITER, str(root), str(stop),
                               json.dumps(SMALL_STORE)], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        seen = []
        for _ in range(3):
            df = read(spark, root, topics="live", minPartitions="2")
            check = df.selectExpr(
                "count(*) AS n", "min(queue_offset) AS lo", "max(queue_offset) AS hi",
                "count(DISTINCT queue_offset) AS distinct_offsets",
                f"sum(CASE WHEN body = {EXPECTED_BODY} THEN 0 ELSE 1 END) AS torn").first()
            assert check.n > 0 and check.torn == 0
            assert (check.lo, check.hi, check.distinct_offsets) == (0, check.n - 1, check.n)
            assert df.count() == check.n  # planned once: a later action, the same rows
            seen.append(check.n)
        assert writer.poll() is None, "the writer finished before the reads"
        assert seen == sorted(seen)
    finally:
        stop.touch()
        writer.wait(timeout=60)
    assert writer.returncode == 0

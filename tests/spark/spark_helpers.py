"""What the Spark tests compare against: the store's own answers, as rows."""

from __future__ import annotations

import datetime as dt
import os
import sys

from mqstore import Message

# Small stores: 1 MiB commit-log segments, loops on threads of the test process.
SMALL_STORE = {
    "commit_log": {"segment_bytes": 1 << 20},
    "store": {"hash": "java", "store_host": "127.0.0.1:10911"},
    "get": {"physical_memory_bytes": 24 << 30},
    "plugins": {"load_entry_points": False},
    "index": {"max_hash_slots": 4096, "max_index_entries": 16384},
    "dispatch": {"worker": "thread"},
    "flush": {"worker": "thread"},
}
EPOCH = dt.datetime(1970, 1, 1)  # the session runs in UTC; Spark hands back naive datetimes


def local_spark(app: str, conf: dict[str, str]):
    """A local[2] SparkSession without the UI, its Python workers on this interpreter: the
    test session's, and the driver a test kills."""
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    from pyspark.sql import SparkSession
    builder = (SparkSession.builder.master("local[2]").appName(app)
               .config("spark.ui.enabled", "false")
               .config("spark.ui.showConsoleProgress", "false"))
    for key, value in conf.items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("ERROR")
    return session


def spark_time(ms: int) -> dt.datetime:
    return EPOCH + dt.timedelta(milliseconds=ms)


def stored_rows(store, root: str | None = None, topics=None, queues=None) -> list[dict]:
    """Every message of ``store`` as the row a read should give, in (topic, queue, offset)
    order, read through the store's own per-message decoding."""
    rows = []
    for topic in topics or store.topics():
        for q in store.queue_ids(topic):
            if queues is not None and q not in queues:
                continue
            offset = store.min_offset(topic, q)
            while offset < store.max_offset(topic, q):
                batch = store.read(topic, q, offset, 1024)
                rows += [message_row(batch.message(i), root or store.root)
                         for i in range(len(batch))]
                offset = batch.next_begin_offset
    return rows


def message_row(m, root: str) -> dict:
    return {
        "topic": m.topic, "queue_id": m.queue_id, "queue_offset": m.queue_offset,
        "phys_offset": m.phys_offset, "msg_id": m.msg_id, "tags": m.tags, "keys": m.keys,
        "properties": m.properties, "body": m.body,
        "born_timestamp": spark_time(m.born_timestamp),
        "store_timestamp": spark_time(m.store_timestamp),
        "born_host": m.born_host, "store_host": m.store_host, "flag": m.flag,
        "sys_flag": m.sysflag, "reconsume_times": m.reconsume_times, "size": m.size,
        "store": root,
    }


def rows_of(df, order=("store", "topic", "queue_id", "queue_offset")) -> list[dict]:
    return [r.asDict() for r in df.orderBy(*order).collect()]


def keys_of(df) -> list[tuple]:
    """(topic, queue, offset) of every row, sorted."""
    return sorted(tuple(r) for r in df.select("topic", "queue_id", "queue_offset").collect())


def put_messages(store, topic: str, n: int, queues: int = 1, *, start: int = 0,
                 tags=lambda i: f"t{i % 3}", clock=None, step_ms: int = 0) -> None:
    """``n`` messages ``topic-i`` spread round-robin over ``queues`` queues (one put_batch per
    store time when ``clock`` advances by ``step_ms`` between messages)."""
    msgs = [Message(topic=topic, body=f"{topic}-{i}".encode(), queue_id=i % queues,
                    tags=tags(i), keys=[f"k{i}"], properties={"seq": str(i)})
            for i in range(start, start + n)]
    if clock is None or not step_ms:
        assert store.put_batch(msgs).status.stored
    else:
        for m in msgs:
            assert store.put(m).status.stored
            clock.advance(step_ms)
    store.wait_dispatched()

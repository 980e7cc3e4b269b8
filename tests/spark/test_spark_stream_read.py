"""spark.readStream.format("mqstore"): offsets per store/topic/queue, admission control,
Trigger.AvailableNow, restart and replay from the checkpoint, messages from another process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time

from spark_helpers import SMALL_STORE, put_messages


def stream(spark, path, **options):
    reader = spark.readStream.format("mqstore").option("path", str(path))
    for name, value in options.items():
        reader = reader.option(name, value)
    return reader.load()


def run_available_now(df, checkpoint) -> list[tuple[int, list]]:
    """Run ``df`` to the end of what is there now; (batch id, its rows' keys) per batch."""
    batches = []

    def collect(batch_df, batch_id):
        rows = batch_df.select("store", "topic", "queue_id", "queue_offset", "body").collect()
        batches.append((batch_id, sorted(tuple(r) for r in rows)))

    query = (df.writeStream.foreachBatch(collect).option("checkpointLocation", str(checkpoint))
             .trigger(availableNow=True).start())
    query.awaitTermination(120)
    assert query.exception() is None, query.exception()
    return batches


def checkpoint_offsets(checkpoint, batch_id: int) -> dict:
    with open(os.path.join(checkpoint, "offsets", str(batch_id)), encoding="utf-8") as f:
        return json.loads(f.read().splitlines()[-1])


def test_admission_restart_and_checkpointed_offsets(spark, tmp_path, open_store):
    root = tmp_path / "s"
    store = open_store(root)
    put_messages(store, "a", 8, queues=2)
    put_messages(store, "b", 3)
    ck = tmp_path / "ck"
    first = run_available_now(stream(spark, root, startingOffsets="earliest",
                                     maxMessagesPerTrigger="3"), ck)
    assert [b for b, _rows in first] == [0, 1, 2, 3]
    assert [len(rows) for _b, rows in first] == [3, 3, 3, 2]
    seen = [row for _b, rows in first for row in rows]
    assert sorted(seen) == sorted(
        [(str(root), "a", i % 2, i // 2, b"a-%d" % i) for i in range(8)]
        + [(str(root), "b", 0, i, b"b-%d" % i) for i in range(3)])
    # Offsets are kept per store, topic and queue, with string keys.
    assert checkpoint_offsets(ck, 3) == {str(root): {"a": {"0": 4, "1": 4}, "b": {"0": 3}}}

    put_messages(store, "a", 4, queues=3, start=8)  # queue 2 is new
    put_messages(store, "c", 2)  # so is topic c
    second = run_available_now(stream(spark, root, startingOffsets="earliest"), ck)
    assert [b for b, _rows in second] == [4]
    r = str(root)
    assert second[0][1] == sorted([(r, "a", 0, 4, b"a-9"), (r, "a", 1, 4, b"a-10"),
                                   (r, "a", 2, 0, b"a-8"), (r, "a", 2, 1, b"a-11"),
                                   (r, "c", 0, 0, b"c-0"), (r, "c", 0, 1, b"c-1")])
    assert run_available_now(stream(spark, root, startingOffsets="earliest"), ck) == []


def test_starting_latest_and_timestamp(spark, tmp_path, open_store, manual_clock):
    root = tmp_path / "s"
    store = open_store(root)
    put_messages(store, "a", 4)
    manual_clock.advance(60_000)
    put_messages(store, "a", 3, start=4)
    latest = run_available_now(stream(spark, root), tmp_path / "ck1")  # default: latest
    assert [rows for _b, rows in latest] in ([], [[]])
    from_time = run_available_now(stream(spark, root, startingTimestamp=str(manual_clock.now)),
                                  tmp_path / "ck2")
    assert [r[-1] for _b, rows in from_time for r in rows] == [b"a-4", b"a-5", b"a-6"]


def test_replayed_batch_reads_the_same_rows(spark, tmp_path, open_store):
    root = tmp_path / "s"
    put_messages(open_store(root), "a", 7, queues=2)
    ck = tmp_path / "ck"
    df = stream(spark, root, startingOffsets="earliest", maxMessagesPerTrigger="4")
    first = run_available_now(df, ck)
    assert [len(rows) for _b, rows in first] == [4, 3]
    for name in ("1", ".1.crc"):  # as if the query died before committing batch 1
        os.remove(ck / "commits" / name)
    replay = run_available_now(df, ck)
    assert replay == [first[1]]  # batch 1 again, with the very same rows


WRITER = textwrap.dedent("""
    import json, sys, time
    from mqstore import MessageStore, load_config, Message
    root, config = sys.argv[1], json.loads(sys.argv[2])
    with MessageStore.open(root, load_config(overrides=config)) as store:
        for wave in range(3):
            store.put_batch([Message(topic="live", body=b"%d-%d" % (wave, i), queue_id=i % 2)
                             for i in range(5)])
            store.wait_dispatched()
            print("wave", wave, flush=True)
            time.sleep(1.0)
""")


def test_messages_from_another_process_appear(spark, tmp_path):
    root = tmp_path / "live"
    ck = tmp_path / "ck"
    got = []

    def collect(batch_df, batch_id):
        got.extend(tuple(r) for r in batch_df.select("queue_id", "queue_offset", "body").collect())

    # The store exists (empty) before the query starts; a writer fills it while it runs.
    from mqstore import MessageStore, load_config
    MessageStore.open(root, load_config(overrides=SMALL_STORE)).close()
    query = (stream(spark, root, startingOffsets="earliest").writeStream.foreachBatch(collect)
             .option("checkpointLocation", str(ck)).trigger(processingTime="200 milliseconds")
             .start())
    try:
        writer = subprocess.run([sys.executable, "-c", WRITER, str(root),
                                 json.dumps(SMALL_STORE)], capture_output=True, text=True,
                                timeout=120)
        assert writer.returncode == 0, writer.stderr
        deadline = time.monotonic() + 60
        while len(got) < 15 and time.monotonic() < deadline:
            time.sleep(0.2)
    finally:
        query.stop()
    by_queue = {}
    for q, off, body in sorted(got, key=lambda r: (r[0], r[1])):
        by_queue.setdefault(q, []).append((off, body))
    assert [off for off, _b in by_queue[0]] == list(range(9))
    assert [off for off, _b in by_queue[1]] == list(range(6))
    assert sorted(body for _q, _o, body in got) == sorted(
        b"%d-%d" % (wave, i) for wave in range(3) for i in range(5))

"""Spark reads of mqstore against Parquet, in one Spark session (see benchmarks/README.md).

One store gets N messages (``--count``, default 1,000,000) of 256 B, round-robin over 4 queues
of one topic, 1,000 per ``put_batch``, the store clock 1 ms further for each batch (so a
store-time range selects whole batches). The same rows are then exported to Parquet. Timed
(``time.perf_counter``, the best of ``--rounds``), all in one local SparkSession:

* ``mqstore count``: ``spark.read.format("mqstore")...load().count()``;
* ``mqstore noop``: the same DataFrame written to Spark's ``noop`` sink (every column made);
  ``mqstore noop, no CRC`` the same with ``verifyChecksums=false`` (what checking costs);
* ``parquet count`` / ``parquet noop``: the same for the Parquet copy;
* ``mqstore 1% range``: a store-time range holding 1% of the messages, pushed down
  (``spark.sql.python.filterPushdown.enabled``), to ``noop``;
* ``stream``: a producer process appends ``--stream-rate`` messages/s (default 50,000) for
  ``--stream-seconds`` while a streaming query reads them into ``noop`` (default trigger);
  the query first reads 1,000 messages, so its workers are up and following the store as in
  a running stream. Reported: the rows the query read per second while the producer ran, and
  how long after the producer stopped the query had read everything (its lag).

* ``spark floor count`` / ``spark floor noop``: a data source defined here whose tasks yield
  one precomputed mqstore record batch (READ_ROWS rows of the store, built once per task) over
  and over, as many rows per task as the mqstore read: all of Spark's, the JVM's and the Arrow
  transfer's work on the same rows and none of the reader's. ``mqstore X - spark floor X`` is
  what the reader itself costs; no reader change can go below the floor. ``spark floor 1%
  range``: the same for the 1% range's row count, in as many tasks (one per queue): what any
  Python data-source query of that shape costs.

Targets, printed as PASS/MISS (a miss never fails the run): the full read at least half of
Parquet's rows/s; the 1% range at least 20x faster than the full read; the stream keeping up
(lag under 2 s).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time

BODY_BYTES = 256
QUEUES = 4
BATCH = 1000
BASE_MS = 1_700_000_000_000
WARM_UP = 1000  # messages the stream reads before the producer starts

CONFIG = {
    "commit_log": {"segment_bytes": 256 << 20},
    "plugins": {"load_entry_points": False},
    "dispatch": {"worker": "thread"},
    "flush": {"worker": "thread"},
}


def fill(root: str, count: int) -> None:
    from mqstore import MessageStore, load_config
    from mqstore.clock import ManualClock
    from mqstore.message import MessageBatch
    clock = ManualClock(BASE_MS)
    body = bytes(range(256)) * (BODY_BYTES // 256)
    with MessageStore.open(root, load_config(overrides=CONFIG), clock=clock) as store:
        for i in range(0, count, BATCH):
            n = min(BATCH, count - i)
            ids = [(i + k) % QUEUES for k in range(n)]
            result = store.put_batch(MessageBatch(topic="bench", bodies=[body] * n,
                                                  queue_ids=ids, tags="t"))
            assert result.status.stored, result
            clock.advance(1)
        store.wait_dispatched(timeout=300)


def floor_source():
    """The ``mqstore_bench_floor`` data source (see the module docstring). Defined when asked
    for, after pyspark is importable; its classes live in this script, so Spark pickles them
    by value and its workers need nothing but mqstore."""
    from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

    class FloorReader(DataSourceReader):
        def __init__(self, options) -> None:
            self.root, self.count = options["path"], int(options["count"])

        def partitions(self):
            per = [self.count // QUEUES + (q < self.count % QUEUES) for q in range(QUEUES)]
            return [InputPartition((q, n)) for q, n in enumerate(per) if n]

        def read(self, partition):
            from mqstore.spark.arrow_rows import READ_ROWS, to_record_batch
            from mqstore.spark.planning import QueueRange
            from mqstore.spark.stores import open_read_only
            q, n = partition.value
            store = open_read_only(self.root)
            part = QueueRange(self.root, "bench", q, 0, min(n, READ_ROWS))
            rows = to_record_batch(store, part, store.read("bench", q, 0, part.end))
            for at in range(0, n, READ_ROWS):
                yield rows if n - at >= READ_ROWS else rows.slice(0, n - at)

    class FloorSource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "mqstore_bench_floor"

        def schema(self):
            from mqstore.spark.schema import message_schema
            return message_schema()

        def reader(self, schema):
            return FloorReader(self.options)

    return FloorSource


def best(rounds: int, fn) -> tuple[float, object]:
    times, value = [], None
    for _ in range(rounds):
        t0 = time.perf_counter()
        value = fn()
        times.append(time.perf_counter() - t0)
    return min(times), value


PRODUCER = textwrap.dedent("""
    import json, sys, time
    from mqstore import MessageStore, load_config
    from mqstore.message import MessageBatch
    root, rate, seconds = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
    config = json.loads(sys.argv[4])
    body = bytes(256)
    step = max(1, rate // 20)  # 20 batches a second
    with MessageStore.open(root, load_config(overrides=config)) as store:
        # A first 1,000 messages, read before the clock starts: the query's workers are up
        # and following the store, as in a stream that has been running.
        store.put_batch(MessageBatch(topic="live", bodies=[body] * 1000,
                                     queue_ids=[k % 4 for k in range(1000)]))
        print("ready", flush=True)
        sys.stdin.readline()
        start = time.perf_counter()
        sent = 0
        while time.perf_counter() - start < seconds:
            due = int((time.perf_counter() - start) * rate)
            if due > sent:
                n = min(due - sent, 4 * step)
                store.put_batch(MessageBatch(topic="live", bodies=[body] * n,
                                             queue_ids=[k % 4 for k in range(n)]))
                sent += n
            else:
                time.sleep(0.005)
        store.wait_dispatched(timeout=60)
        print(json.dumps({"sent": sent, "seconds": time.perf_counter() - start}), flush=True)
""")


def bench_stream(spark, tmp: str, rate: int, seconds: float) -> dict:
    from mqstore import MessageStore, load_config
    root = os.path.join(tmp, "live")
    MessageStore.open(root, load_config(overrides=CONFIG)).close()
    producer = subprocess.Popen([sys.executable, "-c", PRODUCER, root, str(rate), str(seconds),
                                 json.dumps(CONFIG)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, text=True)
    assert producer.stdout.readline().strip() == "ready"
    query = (spark.readStream.format("mqstore").option("path", root)
             .option("startingOffsets", "earliest").load()
             .writeStream.format("noop").option("checkpointLocation", os.path.join(tmp, "ck"))
             .start())

    def rows_read() -> int:
        """Messages read so far: the sum of the last finished batch's end offsets (the query
        started from offset 0 everywhere)."""
        progress = query.lastProgress
        end = progress["sources"][0]["endOffset"] if progress else None
        if not end:
            return 0
        if isinstance(end, str):
            end = json.loads(end)
        return sum(off for topics in end.values() for queues in topics.values()
                   for off in queues.values())

    deadline = time.perf_counter() + 120
    while rows_read() < WARM_UP and time.perf_counter() < deadline:
        time.sleep(0.05)
    producer.stdin.write("go\n")
    producer.stdin.flush()
    t0 = time.perf_counter()
    done = json.loads(producer.stdout.readline())
    t_end = time.perf_counter()
    read_during = rows_read() - WARM_UP
    while rows_read() < done["sent"] + WARM_UP and time.perf_counter() - t_end < 120:
        time.sleep(0.05)
    lag = time.perf_counter() - t_end
    total = rows_read() - WARM_UP
    if os.environ.get("BENCH_SPARK_TRACE"):
        for p in query.recentProgress:
            print("batch", p["batchId"], p["numInputRows"], p["durationMs"], flush=True)
    query.stop()
    producer.wait(timeout=60)
    return {"sent": done["sent"], "produce_rate": done["sent"] / done["seconds"],
            "read_during": read_during / (t_end - t0), "lag_s": lag, "read": total}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--stream-rate", type=int, default=50_000)
    parser.add_argument("--stream-seconds", type=float, default=10.0)
    parser.add_argument("--json", action="store_true", help="also print a BENCH-JSON line")
    args = parser.parse_args()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    tmp = tempfile.mkdtemp(prefix="mqstore-bench-spark-")
    try:
        root = os.path.join(tmp, "store")
        t0 = time.perf_counter()
        fill(root, args.count)
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} cpus, {args.count} x "
              f"{BODY_BYTES} B, {QUEUES} queues, temp {tmp} (filled in "
              f"{time.perf_counter() - t0:.1f} s)", flush=True)
        spark = (SparkSession.builder.master("local[*]").appName("bench-spark")
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.sql.session.timeZone", "UTC")
                 .config("spark.sql.python.filterPushdown.enabled", "true")
                 .config("spark.driver.memory", "2g").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        mq = spark.read.format("mqstore").option("path", root).load()
        parquet_dir = os.path.join(tmp, "parquet")
        mq.write.parquet(parquet_dir)  # also warms the Python workers up
        pq = spark.read.parquet(parquet_dir)
        rows = {}
        rows["mqstore count"] = best(args.rounds, mq.count)
        rows["parquet count"] = best(args.rounds, pq.count)
        rows["mqstore noop"] = best(args.rounds,
                                    lambda: mq.write.format("noop").mode("overwrite").save())
        unchecked = (spark.read.format("mqstore").option("path", root)
                     .option("verifyChecksums", "false").load())
        rows["mqstore noop, no CRC"] = best(
            args.rounds, lambda: unchecked.write.format("noop").mode("overwrite").save())
        rows["parquet noop"] = best(args.rounds,
                                    lambda: pq.write.format("noop").mode("overwrite").save())
        spark.dataSource.register(floor_source())
        floor = (spark.read.format("mqstore_bench_floor").option("path", root)
                 .option("count", str(args.count)).load())
        floor.write.format("noop").mode("overwrite").save()  # its workers up, as mqstore's
        rows["spark floor count"] = best(args.rounds, floor.count)
        rows["spark floor noop"] = best(
            args.rounds, lambda: floor.write.format("noop").mode("overwrite").save())
        batches = args.count // BATCH
        lo = BASE_MS + batches // 2
        hi = lo + max(1, batches // 100)
        window = mq.filter(f"store_timestamp >= timestamp_millis({lo}) AND "
                           f"store_timestamp < timestamp_millis({hi})")
        in_range = window.count()
        rows["mqstore 1% range"] = best(
            args.rounds, lambda: window.write.format("noop").mode("overwrite").save())
        floor_window = (spark.read.format("mqstore_bench_floor").option("path", root)
                        .option("count", str(in_range)).load())
        rows["spark floor 1% range"] = best(
            args.rounds, lambda: floor_window.write.format("noop").mode("overwrite").save())
        stream = bench_stream(spark, tmp, args.stream_rate, args.stream_seconds)
        spark.stop()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    n = args.count
    print(f"{'phase':<22} {'rows':>10} {'seconds':>9} {'rows/s':>12}")
    for name, (seconds, _v) in rows.items():
        count = in_range if "range" in name else n
        print(f"{name:<22} {count:>10} {seconds:>9.3f} {count / seconds:>12,.0f}")
    full_ratio = rows["parquet noop"][0] / rows["mqstore noop"][0]
    count_ratio = rows["parquet count"][0] / rows["mqstore count"][0]
    range_speedup = rows["mqstore noop"][0] / rows["mqstore 1% range"][0]
    floor_noop = rows["spark floor noop"][0] / rows["mqstore noop"][0]
    floor_count = rows["spark floor count"][0] / rows["mqstore count"][0]
    floor_range = rows["spark floor 1% range"][0] / rows["mqstore 1% range"][0]
    print(f"Spark's own share (the floor's time / mqstore's): noop {floor_noop:.0%}, count "
          f"{floor_count:.0%}, 1% range {floor_range:.0%}; with a reader costing nothing the "
          f"ratios would be noop {rows['parquet noop'][0] / rows['spark floor noop'][0]:.2f}x "
          f"Parquet, count {rows['parquet count'][0] / rows['spark floor count'][0]:.2f}x "
          f"Parquet, range {rows['spark floor noop'][0] / rows['spark floor 1% range'][0]:.1f}x")
    print(f"stream: producer {stream['produce_rate']:,.0f} msg/s for {args.stream_seconds:.0f} s "
          f"({stream['sent']} messages); the query read {stream['read_during']:,.0f} rows/s "
          f"meanwhile and had read all {stream['read']} {stream['lag_s']:.2f} s after the "
          f"producer stopped")
    targets = [
        ("full read (noop) >= 0.5x Parquet's rows/s", full_ratio, full_ratio >= 0.5),
        ("full read (count) >= 0.5x Parquet's rows/s", count_ratio, count_ratio >= 0.5),
        ("1% store-time range >= 20x faster than the full read", range_speedup,
         range_speedup >= 20),
        ("stream keeps up with the producer (lag < 2 s)", stream["lag_s"],
         stream["lag_s"] < 2 and stream["read"] >= stream["sent"]),
    ]
    for what, value, ok in targets:
        print(f"{'PASS' if ok else 'MISS'}  {what}: {value:.2f}")
    if args.json:
        from benchlib import emit_json
        emit_json("spark", [
            ("mqstore_noop_rows_per_s", n / rows["mqstore noop"][0], "rows/s", "higher"),
            ("mqstore_count_rows_per_s", n / rows["mqstore count"][0], "rows/s", "higher"),
            ("noop_vs_parquet", full_ratio, "x", "higher"),
            ("range_speedup", range_speedup, "x", "higher"),
            ("spark_floor_noop_share", floor_noop, "x", "higher"),
            ("stream_lag_s", stream["lag_s"], "s", "lower")])
    return 0


if __name__ == "__main__":
    sys.exit(main())

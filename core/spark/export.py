"""Export stores to Parquet, partitioned by topic and store date (UTC), with progress.

    python -m mqstore.spark.export STORE [STORE ...] --to DIR [--topics a,b] [--mode MODE]
    mqstore export STORE [STORE ...] --to DIR ...   (the same job, from the operator CLI)

Every message becomes one row of the read schema plus ``date`` (the store time's UTC date), in
``DIR/topic=<topic>/date=<yyyy-mm-dd>/``. Before the job it prints what it will export per
topic (from the planned offset ranges), while it runs the share of tasks done, and at the
end the row count Spark wrote.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from collections import Counter

from mqstore.spark.options import parse_read_options
from mqstore.spark.planning import plan_batch
from mqstore.spark.pushdown import Pushed
from mqstore.spark.stores import resolve_paths

PROGRESS_EVERY_S = 2.0


def planned_counts(paths: list[str], topics: str | None, config: str | None) -> Counter:
    """Messages per topic the export will read, from the planned offset ranges."""
    options = {"path": ",".join(paths)}
    if topics:
        options["topics"] = topics
    if config:
        options["config"] = config
    opts = parse_read_options(options, streaming=False)
    counts: Counter = Counter()
    for r in plan_batch(resolve_paths(opts.paths), opts, Pushed()):
        counts[r.topic] += r.end - r.start
    return counts


class Progress:
    """Prints the share of the export's tasks done, every PROGRESS_EVERY_S, from a thread."""

    def __init__(self, spark, out, group: str) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.out, self.group = out, group
        self._last = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="export-progress", daemon=True)

    def __enter__(self) -> "Progress":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self._report()  # the final count, however short the job was

    def _run(self) -> None:
        while not self._stop.wait(PROGRESS_EVERY_S):
            self._report()

    def _report(self) -> None:
        done = total = 0
        for job_id in self.tracker.getJobIdsForGroup(self.group):
            job = self.tracker.getJobInfo(job_id)
            for stage_id in (job.stageIds if job else ()):
                stage = self.tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        if total and (done, total) != self._last:
            self._last = (done, total)
            print(f"export: {done}/{total} tasks done ({100 * done // total}%)", file=self.out,
                  flush=True)


def run(paths: list[str], dest: str, *, master: str = "local[*]", topics: str | None = None,
        mode: str = "errorifexists", config: str | None = None, out=sys.stdout,
        planned: Counter | None = None) -> int:
    """``export`` in the process's SparkSession, or in a new one (``master``; dates in UTC, no
    console progress bars, Python workers on this interpreter unless PYSPARK_PYTHON says
    otherwise) that is stopped after. Returns the rows written."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from pyspark.errors import PySparkRuntimeError
    from pyspark.sql import SparkSession

    from mqstore.spark import register
    try:
        existing = SparkSession.active()  # this thread's, or the process's default session
    except PySparkRuntimeError:  # none
        existing = None
    spark = existing or (SparkSession.builder.master(master).appName("mqstore-export")
                         .config("spark.sql.session.timeZone", "UTC")
                         .config("spark.ui.showConsoleProgress", "false").getOrCreate())
    try:
        register(spark)
        return export(spark, paths, dest, topics=topics, mode=mode, config=config, out=out,
                      planned=planned)
    finally:
        if existing is None:
            spark.stop()


def spark_errors() -> tuple[type[BaseException], ...]:
    """What Spark raises for a failed job or session (for callers turning them into one
    line without importing pyspark themselves)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException
    return PySparkException, Py4JError


def export(spark, paths: list[str], dest: str, *, topics: str | None = None,
           mode: str = "errorifexists", config: str | None = None, out=sys.stdout,
           planned: Counter | None = None) -> int:
    """Write the stores' messages under ``dest`` as Parquet; returns the rows written.
    ``planned``: the ``planned_counts`` of the same arguments, when the caller has them."""
    from pyspark.sql import functions as F
    counts = planned if planned is not None else planned_counts(paths, topics, config)
    print(f"export: {sum(counts.values())} messages of {len(counts)} topic(s) from "
          f"{len(paths)} store path(s) to {dest}", file=out, flush=True)
    for topic, n in sorted(counts.items()):
        print(f"  {topic}: {n}", file=out)
    reader = spark.read.format("mqstore").option("path", ",".join(paths))
    if topics:
        reader = reader.option("topics", topics)
    if config:
        reader = reader.option("config", config)
    df = reader.load().withColumn("date", F.to_date(F.col("store_timestamp")))
    group = f"mqstore-export-{time.monotonic_ns()}"
    spark.sparkContext.setJobGroup(group, f"mqstore export to {dest}")
    try:
        with Progress(spark, out, group):
            df.write.mode(mode).partitionBy("topic", "date").parquet(dest)
    finally:
        spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
    written = spark.read.parquet(dest).count() if mode != "append" else sum(counts.values())
    # No duration: the caller times the whole job, session start included (mqstore export
    # prints that one figure); the write alone would be a second, smaller one.
    print(f"export: wrote {written} rows", file=out, flush=True)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mqstore.spark.export",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("stores", nargs="+", help="store directories (or globs)")
    parser.add_argument("--to", required=True, metavar="DIR", help="Parquet output directory")
    parser.add_argument("--format", default="parquet", choices=["parquet"],
                        help="output format (parquet)")
    parser.add_argument("--topics", help="comma-separated topics (default: all)")
    parser.add_argument("--mode", default="errorifexists",
                        choices=["errorifexists", "overwrite", "append", "ignore"],
                        help="what to do when DIR exists (Spark's save modes)")
    parser.add_argument("--config", help="store configuration YAML to open the stores with")
    parser.add_argument("--master", default="local[*]", help="Spark master (default local[*])")
    args = parser.parse_args(argv)
    run(args.stores, args.to, master=args.master, topics=args.topics, mode=args.mode,
        config=args.config)
    return 0


if __name__ == "__main__":
    sys.exit(main())

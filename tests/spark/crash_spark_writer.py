"""A Spark driver for the staging-sweep test: ``python crash_spark_writer.py STORE CONFIG``.

Starts its own local SparkSession and writes 6 rows to STORE in two partitions: partition 0
stages its rows and finishes, partition 1 stages one batch and then hangs, so the job never
reaches its commit. The parent kills this driver with SIGKILL while it hangs, leaving the job's
staged files behind as a crashed driver would.
"""

from __future__ import annotations

import sys
import time

from spark_helpers import local_spark


def rows(index, it):
    yield from it
    if index == 1:
        time.sleep(3600)  # mid-write: the task never finishes, the job never commits


def main(root: str, config: str) -> None:
    spark = local_spark("mqstore-crash-writer", {"spark.driver.memory": "512m"})
    data = [("orders", b"crashed-%d" % i) for i in range(6)]
    df = spark.sparkContext.parallelize(data, 2).mapPartitionsWithIndex(rows) \
        .toDF("topic string, body binary")
    df.write.format("mqstore").mode("append").option("path", root) \
        .option("config", config).save()
    raise SystemExit("the hanging write finished")  # never: the parent kills this driver


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])

"""The export job: stores to Parquet partitioned by topic and UTC date, progress on the way."""

from __future__ import annotations

import io
import subprocess
import sys

from mqstore.spark.export import export, planned_counts
from spark_helpers import put_messages, stored_rows

DAY_MS = 24 * 3600 * 1000


def test_export_partitions_by_topic_and_date(spark, tmp_path, open_store, manual_clock):
    root = tmp_path / "s"
    store = open_store(root)
    put_messages(store, "orders", 5, queues=2)  # 2023-11-14 (the manual clock's start)
    put_messages(store, "audit", 2)
    manual_clock.advance(DAY_MS)
    put_messages(store, "orders", 3, queues=2, start=5)  # 2023-11-15
    dest = tmp_path / "parquet"
    out = io.StringIO()
    assert planned_counts([str(root)], None, None) == {"orders": 8, "audit": 2}
    assert export(spark, [str(root)], str(dest), out=out) == 10
    log = out.getvalue()
    assert "export: 10 messages of 2 topic(s)" in log and "  orders: 8" in log
    assert "export: wrote 10 rows" in log
    assert "tasks done (100%)" in log
    assert sorted(str(p.relative_to(dest)) for p in dest.glob("topic=*/date=*")) == [
        "topic=audit/date=2023-11-14", "topic=orders/date=2023-11-14",
        "topic=orders/date=2023-11-15"]
    back = spark.read.parquet(str(dest))
    got = sorted((r.topic, r.queue_id, r.queue_offset, r.body, str(r.date)) for r in back.collect())
    want = sorted((r["topic"], r["queue_id"], r["queue_offset"], r["body"],
                   str(r["store_timestamp"].date())) for r in stored_rows(store, str(root)))
    assert got == want
    # The rows keep every column of the read.
    assert set(back.columns) >= {"msg_id", "keys", "properties", "store", "date"}


def test_export_command_line_help():
    out = subprocess.run([sys.executable, "-m", "mqstore.spark.export", "--help"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0
    assert "--to DIR" in out.stdout and "partitioned by topic and store date" in out.stdout

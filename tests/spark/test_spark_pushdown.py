"""Filter pushdown is exact: every query gives the rows Spark alone would give, with
spark.sql.python.filterPushdown.enabled on and off (NOTE [ Pushdown with the conf off ])."""

from __future__ import annotations

import datetime as dt

import pytest

from mqstore import Message
from spark_helpers import stored_rows

CONF = "spark.sql.python.filterPushdown.enabled"
BASE_MS = 1_700_000_000_000
# "Aa" and "BB" have the same Java string hash, so the same tag code in the consume queue.
TAGS = ["Aa", "BB", "x", None, "y z"]


@pytest.fixture(scope="module")
def store_rows(tmp_path_factory, small_config):
    """40 messages over two topics and three queues; message i stored at BASE_MS + 10 i ms
    (the store's clock is fixed per put), tagged from TAGS."""
    from mqstore import MessageStore
    from mqstore.clock import ManualClock
    clock = ManualClock(BASE_MS)
    root = tmp_path_factory.mktemp("pushdown") / "store"
    with MessageStore.open(root, small_config, clock=clock) as store:
        for i in range(40):
            store.put(Message(topic="a" if i % 4 else "b", body=b"%d" % i, queue_id=i % 3,
                              tags=TAGS[i % len(TAGS)]))
            clock.advance(10)
        store.wait_dispatched()
        rows = stored_rows(store, str(root))
    return str(root), rows


@pytest.fixture(params=["on", "off"])
def pushdown(request, spark):
    spark.conf.set(CONF, "true" if request.param == "on" else "false")
    yield request.param
    spark.conf.set(CONF, "true")


def at(ms: float) -> str:
    """A SQL timestamp literal for ``ms`` after the epoch (UTC), microseconds kept."""
    t = dt.datetime(1970, 1, 1) + dt.timedelta(microseconds=round(ms * 1000))
    return f"timestamp'{t.isoformat(sep=' ')}'"


def t(i: float) -> float:
    return BASE_MS + 10 * i


# (SQL condition, the same condition on a row dict); every one of them is exact.
PUSHABLE = [
    ("topic = 'a'", lambda r: r["topic"] == "a"),
    ("topic IN ('a', 'zz') AND queue_id IN (0, 2)",
     lambda r: r["topic"] == "a" and r["queue_id"] in (0, 2)),
    ("queue_id >= 1 AND queue_id < 2", lambda r: r["queue_id"] == 1),
    ("queue_offset >= 3 AND queue_offset < 7", lambda r: 3 <= r["queue_offset"] < 7),
    ("queue_offset = 5", lambda r: r["queue_offset"] == 5),
    ("queue_offset > 10", lambda r: r["queue_offset"] > 10),
    (f"store_timestamp >= {at(t(5))} AND store_timestamp < {at(t(17))}",
     lambda r: 5 <= _i(r) < 17),
    (f"store_timestamp > {at(t(5) + 0.5)} AND store_timestamp <= {at(t(30))}",
     lambda r: 6 <= _i(r) <= 30),
    (f"store_timestamp = {at(t(12))}", lambda r: _i(r) == 12),
    (f"store_timestamp = {at(t(12) + 0.25)}", lambda r: False),
    ("tags = 'Aa'", lambda r: r["tags"] == "Aa"),
    ("tags IN ('BB', 'y z', 'none')", lambda r: r["tags"] in ("BB", "y z")),
    ("tags IS NOT NULL AND queue_id = 0", lambda r: r["tags"] is not None and r["queue_id"] == 0),
    ("tags = 'Aa' AND topic = 'b' AND queue_offset >= 1",
     lambda r: r["tags"] == "Aa" and r["topic"] == "b" and r["queue_offset"] >= 1),
]
# Spark keeps these (OR, NOT, LIKE, arithmetic, IS NULL): the rows must still be right.
UNPUSHABLE = [
    ("queue_offset < 2 OR queue_offset > 10",
     lambda r: r["queue_offset"] < 2 or r["queue_offset"] > 10),
    ("NOT (queue_id = 1)", lambda r: r["queue_id"] != 1),
    ("tags LIKE 'A%'", lambda r: (r["tags"] or "").startswith("A")),
    ("size % 2 = 0 AND topic = 'a'", lambda r: r["size"] % 2 == 0 and r["topic"] == "a"),
    ("tags IS NULL AND queue_id = 2", lambda r: r["tags"] is None and r["queue_id"] == 2),
]


def _i(row) -> int:
    return int(row["body"])


def _store_ms(row) -> int:
    return (row["store_timestamp"] - dt.datetime(1970, 1, 1)) // dt.timedelta(milliseconds=1)


def test_store_times_are_as_planned(store_rows):
    _root, rows = store_rows
    assert all(_store_ms(r) == t(_i(r)) for r in rows)


@pytest.mark.parametrize("condition, keep", PUSHABLE + UNPUSHABLE,
                         ids=[c for c, _k in PUSHABLE + UNPUSHABLE])
def test_same_rows_with_the_conf_on_and_off(spark, store_rows, pushdown, condition, keep):
    root, rows = store_rows
    df = spark.read.format("mqstore").option("path", root).load().filter(condition)
    got = sorted((r.topic, r.queue_id, r.queue_offset, r.body) for r in df.collect())
    want = sorted((r["topic"], r["queue_id"], r["queue_offset"], r["body"]) for r in rows
                  if keep(r))
    assert got == want


def test_pushed_filters_leave_the_plan_and_narrow_the_read(spark, store_rows, pushdown):
    root, _rows = store_rows
    base = spark.read.format("mqstore").option("path", root).option("minPartitions", "1").load()
    df = base.filter("topic = 'a' AND queue_id = 1 AND queue_offset >= 2 AND tags = 'x'")
    plan = df._jdf.queryExecution().optimizedPlan().toString()
    if pushdown == "on":
        assert "Filter" not in plan, plan
        assert df.rdd.getNumPartitions() == 1  # only a/1 was planned
    else:
        assert "Filter" in plan, plan
        assert df.rdd.getNumPartitions() == 6  # every queue of both topics
    unpushed = base.filter("queue_offset < 2 OR queue_offset > 10")
    assert "Filter" in unpushed._jdf.queryExecution().optimizedPlan().toString()


def test_pushed_tags_and_a_store_expression_together(spark, store_rows, pushdown):
    root, rows = store_rows
    df = (spark.read.format("mqstore").option("path", root)
          .option("expression", "Aa || x").load().filter("tags IN ('Aa', 'BB')"))
    assert sorted(r.body for r in df.collect()) == sorted(
        r["body"] for r in rows if r["tags"] == "Aa")


def test_a_pushed_store_filter_with_topics_option(spark, store_rows, pushdown):
    root, rows = store_rows
    df = spark.read.format("mqstore").option("path", root).option("topics", "b").load()
    assert df.filter(f"store = '{root}/elsewhere'").count() == 0
    assert df.filter(f"store = '{root}'").count() == sum(r["topic"] == "b" for r in rows)


def test_the_log_says_which_filters_the_store_took(spark, store_rows, capsys):
    """``explain()`` shows only the filters Spark still applies; the reader logs the ones it
    took (collected by Spark's Python worker logging)."""
    root, rows = store_rows
    spark.conf.set("spark.sql.pyspark.worker.logging.enabled", "true")
    try:
        query = spark.read.format("mqstore").option("path", root).load() \
            .where("tags = 'x' AND queue_offset >= 2 AND body != X'31'")
        assert query.count() == len([r for r in rows if r["tags"] == "x"
                                     and r["queue_offset"] >= 2 and r["body"] != b"1"])
        query.explain()
        plan = capsys.readouterr().out
        assert "NOT (body" in plan and "tags" not in plan.split("Filter", 1)[1].split("\n")[0]
        logged = [r.msg for r in spark.tvf.python_worker_logs()
                  .where("logger = 'mqstore.spark.pushdown'").collect() if root in r.msg]
    finally:
        spark.conf.unset("spark.sql.pyspark.worker.logging.enabled")
    assert logged[-1] == (
        f"read of {root}: pushed to the store: tags IS NOT NULL, queue_offset IS NOT NULL, "
        f"body IS NOT NULL, tags = 'x', queue_offset >= 2; left to Spark: NOT (body = X'31')")

"""The rows a read produces: one per message, every stored field a typed column.

The Spark schema is built from type objects, not DDL text, so it needs no SparkSession: the
planner and executor workers make it on their own. The Arrow schema a reader's record
batches must match exactly is derived from it with Spark's own conversion (timestamps as
microseconds in UTC, lists of ``element``, maps with non-null keys).
"""

from __future__ import annotations

from functools import lru_cache

from pyspark.sql.types import (
    ArrayType, BinaryType, IntegerType, LongType, MapType, StringType, StructField, StructType,
    TimestampType,
)

COLUMNS: tuple[tuple[str, object], ...] = (
    ("topic", StringType()),
    ("queue_id", IntegerType()),
    ("queue_offset", LongType()),
    ("phys_offset", LongType()),
    ("msg_id", StringType()),
    ("tags", StringType()),
    ("keys", ArrayType(StringType())),
    ("properties", MapType(StringType(), StringType())),
    ("body", BinaryType()),
    ("born_timestamp", TimestampType()),
    ("store_timestamp", TimestampType()),
    ("born_host", StringType()),
    ("store_host", StringType()),
    ("flag", IntegerType()),
    ("sys_flag", IntegerType()),
    ("reconsume_times", IntegerType()),
    ("size", IntegerType()),
    ("store", StringType()),
)
COLUMN_NAMES = tuple(name for name, _type in COLUMNS)

# Columns every row has a value in: a pushed IS NOT NULL on them holds without a check.
NEVER_NULL = frozenset(COLUMN_NAMES) - {"tags"}


def message_schema() -> StructType:
    return StructType([StructField(name, dtype, nullable=True) for name, dtype in COLUMNS])


@lru_cache(maxsize=1)
def arrow_schema():
    """The Arrow schema of the record batches a read yields (what Spark checks them against)."""
    from pyspark.sql.pandas.types import to_arrow_schema
    return to_arrow_schema(message_schema(), timezone="UTC")


__all__ = ["COLUMNS", "COLUMN_NAMES", "NEVER_NULL", "arrow_schema", "message_schema"]

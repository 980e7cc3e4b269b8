"""mqstore as a PySpark data source: ``format("mqstore")`` for batch and streaming reads and
writes (PySpark 4.3's Python Data Source API; the ``spark`` extra installs it).

    spark.read.format("mqstore").option("path", "/data/broker-*").load()

Installing the extra is enough: Spark finds the top-level ``pyspark_mqstore`` module itself.
``register(spark)`` registers the source explicitly (needed only where that discovery is off).
Nothing else in mqstore imports this package or pyspark (an import-linter contract).
"""

from __future__ import annotations

try:
    import pyarrow  # noqa: F401 - Spark's data-source workers need it too
    import pyspark  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"mqstore.spark needs the 'spark' extra (pip install 'mqstore[spark]'): "
                      f"{exc}") from exc

from mqstore.spark.source import NAME, MqstoreDataSource


def register(spark) -> None:
    """Register the ``mqstore`` format with ``spark`` (a SparkSession)."""
    spark.dataSource.register(MqstoreDataSource)


__all__ = ["NAME", "MqstoreDataSource", "register"]

"""Spark's data-source discovery entry for mqstore: ``format("mqstore")`` with no registration.

At its first data-source lookup a SparkSession imports every top-level ``pyspark_*`` module it
finds with ``pkgutil.iter_modules()`` and registers its ``DefaultSource``. The source itself
lives in ``mqstore.spark``.
"""

from mqstore.spark.source import MqstoreDataSource as DefaultSource

__all__ = ["DefaultSource"]

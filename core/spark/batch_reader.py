"""``spark.read.format("mqstore")``: plans (store, topic, queue) offset ranges, reads them.

Runs in Spark's Python workers: the planner worker calls ``push_filters`` (through
``PushFilters``, see NOTE [ Pushdown with the conf off ]) and ``partitions``; executor
workers call ``read`` once per partition. The reader itself travels between them pickled, so
it holds only options and what the pushed filters allow; stores are opened where they are read.
"""

from __future__ import annotations

from pyspark.sql.datasource import DataSourceReader

from mqstore.spark.arrow_rows import ReadSettings, read_range
from mqstore.spark.options import ReadOptions
from mqstore.spark.planning import plan_batch
from mqstore.spark.pushdown import PushFilters, Pushed, accept, log_pushdown
from mqstore.spark.stores import resolve_paths


class BatchReader(DataSourceReader):
    pushFilters = PushFilters()

    def __init__(self, opts: ReadOptions) -> None:
        self.opts = opts
        self.pushed = Pushed()

    def push_filters(self, filters) -> list:
        """Keep the filters ``pushdown.accept`` takes; hand the others back to Spark (and log
        both: ``explain()`` shows only the others)."""
        taken, left = [], []
        for f in filters:
            pushed = accept(self.pushed, f)
            if pushed is None:
                left.append(f)
            else:
                self.pushed = pushed
                taken.append(f)
        log_pushdown(self.opts.paths, taken, left)
        return left

    def partitions(self):
        # Spark keeps what this returns with the plan: every offset is fixed now.
        return plan_batch(resolve_paths(self.opts.paths), self.opts, self.pushed)

    def read(self, partition):
        if not hasattr(partition, "store"):  # Spark's stand-in for an empty plan
            return iter(())
        opts, pushed = self.opts, self.pushed
        return read_range(partition, ReadSettings(
            config=opts.config, expression=opts.expression,
            expression_type=opts.expression_type, verify_checksums=opts.verify_checksums,
            tags=pushed.tags, tags_present=pushed.tags_present,
            time_range=pushed.time_range))


__all__ = ["BatchReader"]

"""``df.write.format("mqstore")`` and ``writeStream.format("mqstore")``: stage, then append.

Tasks (executors) stage their rows under the job's own directory (``staging``); the commit
(Spark's driver-side worker) opens the store for writing, which takes its writer lock (a store
another process holds open for writing is refused with StoreBusyError, nothing touched),
appends every staged row with one ``put_batch`` (``appends``) and removes the staged files.
An abort, or a commit that fails, removes them too and appends nothing. Streaming commits go
through the sink ledger, exactly once per batch id (NOTE [ Streaming sink ledger ]).

Creating a writer (on the driver side, before any task) sweeps the staging directory of what
crashed drivers left, then makes the job's directory (a stream: its sink's) under a lease that
lasts while this driver lives (NOTE [ Staging leases ] in ``lease``).

The writer objects are pickled to every task: they hold options and the staged columns. A
batch job's directory is fixed when Spark creates its writer, once per job, and travels with
it to the tasks and the commit. A streaming commit gets a writer of its own (Spark creates
one per micro-batch for the tasks and another for the commit), so a micro-batch's directory is
named after the sink and the batch id, which the tasks read from their TaskContext:
``<staging>/stream-<sink>/batch-<id>/``.
"""

from __future__ import annotations

import os

from pyspark.sql.datasource import DataSourceArrowWriter, DataSourceStreamArrowWriter

from mqstore.config import load_config
from mqstore.spark import sink_ledger
from mqstore.spark.appends import append_rows
from mqstore.spark.options import OptionError, WriteOptions
from mqstore.spark.staging import (
    open_job, open_sink, read_staged, remove_job, stage, write_columns,
)
from mqstore.spark.stores import open_for_append


class _Staging:
    def __init__(self, opts: WriteOptions, schema) -> None:
        self.opts = opts
        self.columns = write_columns(schema)
        self.max_body_bytes = load_config(opts.config).commit_log.max_message_bytes

    def write(self, iterator):
        return stage(iterator, self._task_job_dir(), self.columns, self.max_body_bytes)


class BatchWriter(_Staging, DataSourceArrowWriter):
    def __init__(self, opts: WriteOptions, schema) -> None:
        super().__init__(opts, schema)
        self.job_dir = open_job(opts.staging_dir)

    def _task_job_dir(self) -> str:
        return self.job_dir

    def commit(self, messages) -> None:
        try:
            table, parts = read_staged(messages)
            if table is not None and table.num_rows:
                with open_for_append(self.opts.path, self.opts.config) as store:
                    append_rows(store, table, parts)
        finally:
            remove_job(self.job_dir, self.opts.staging_dir)

    def abort(self, messages) -> None:
        remove_job(self.job_dir, self.opts.staging_dir)


class StreamWriter(_Staging, DataSourceStreamArrowWriter):
    def __init__(self, opts: WriteOptions, schema) -> None:
        if opts.sink_id is None:
            raise OptionError("a streaming write to mqstore needs the checkpointLocation option "
                              "(or sinkId) to commit each batch exactly once")
        super().__init__(opts, schema)
        self.sink_dir = open_sink(opts.staging_dir, opts.sink_id)

    def _batch_dir(self, batch_id) -> str:
        return os.path.join(self.sink_dir, f"batch-{batch_id}")

    def _task_job_dir(self) -> str:
        from pyspark import TaskContext
        batch_id = TaskContext.get().getLocalProperty("streaming.sql.batchId")
        if batch_id is None:  # set by Spark's micro-batch execution, the only one for us
            raise RuntimeError("a streaming write task without a micro-batch id")
        return self._batch_dir(batch_id)

    def commit(self, messages, batchId: int) -> None:
        try:
            table, parts = read_staged(messages)
            if table is None or not table.num_rows:
                return  # an empty micro-batch: nothing to append, the lock is left alone
            with open_for_append(self.opts.path, self.opts.config) as store:
                sink_ledger.commit_batch(store, self.opts.sink_id, batchId, table, parts)
        finally:
            remove_job(self._batch_dir(batchId), self.opts.staging_dir)

    def abort(self, messages, batchId: int) -> None:
        remove_job(self._batch_dir(batchId), self.opts.staging_dir)


__all__ = ["BatchWriter", "StreamWriter"]

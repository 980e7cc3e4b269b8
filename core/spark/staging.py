"""Rows a write's tasks stage before its commit appends them: checked, then kept in files.

Each task writes its partition's rows, checked column-wise, to one Arrow IPC file under the
job's own directory (``<staging>/job-<uuid>/part-<partition>-<attempt>.arrow``, renamed into
place only once complete), and reports it in a ``Staged`` commit message. The commit reads
the files of the messages, in partition order; an abort, a failed commit or a finished one
removes the job's directory whole, files of failed attempts included.

A streaming micro-batch stages under its sink's directory instead,
``<staging>/stream-<sink>/batch-<id>/``. Every job directory and sink directory is created
by the writer on the driver side and locked by a lease for as long as its driver lives
(NOTE [ Staging leases ] in ``lease``); whatever a crashed driver left staged is removed by the
next write's sweep (``open_job``, ``open_sink``), and nothing a live job holds is touched.

Rows are named by position: row i of partition p, counted from 0 in the order the task got
them. Checks here catch what can be told from a column at once (missing topic or body, a
topic outside RocketMQ's characters, an oversized body, a bad queue id, tags or keys that
their properties contradict); everything else is ``put_batch``'s to refuse at commit, where
its message index is turned back into a position.

Rows read from a store say TAGS and KEYS twice: as the ``tags`` and ``keys`` columns and in
``properties``. Where both say the same, the staged row keeps the property as it was read (its
spelling and its place among the properties) and drops the column's value, so a copy holds
the original's properties block; a null tag or an empty key list says nothing.
"""

from __future__ import annotations

import fcntl
import os
import re
import shutil
import uuid
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql.datasource import WriterCommitMessage
from pyspark.sql.types import (
    ArrayType, BinaryType, ByteType, IntegerType, LongType, MapType, ShortType, StringType,
    StructType,
)

from mqstore.append.encoding import body_too_large, check_queue_id, check_topic
from mqstore.storage.file_locks import is_file_at
from mqstore.spark import lease

# The columns a write takes, and the Spark types each may have; others are ignored.
WRITE_COLUMNS = {
    "topic": (StringType,),
    "body": (BinaryType, StringType),
    "tags": (StringType,),
    "keys": (ArrayType,),
    "properties": (MapType,),
    "queue_id": (IntegerType, LongType, ShortType, ByteType),
}
STAGED_TYPES = {"topic": pa.string(), "body": pa.binary(), "tags": pa.string(),
                "keys": pa.list_(pa.string()), "properties": pa.map_(pa.string(), pa.string()),
                "queue_id": pa.int64()}


class BadRowError(ValueError):
    """A row the store cannot take; the message names its position and the reason."""


@dataclass
class Staged(WriterCommitMessage):
    path: str
    rows: int
    partition_id: int


def write_columns(schema: StructType) -> tuple[str, ...]:
    """The columns of ``schema`` a write takes, after checking their presence and types."""
    fields = {f.name: f.dataType for f in schema.fields}
    for required in ("topic", "body"):
        if required not in fields:
            raise BadRowError(f"a DataFrame written to mqstore needs a {required!r} column; it "
                              f"has {sorted(fields)}")
    for name, allowed in WRITE_COLUMNS.items():
        dtype = fields.get(name)
        if dtype is None:
            continue
        ok = isinstance(dtype, allowed)
        if isinstance(dtype, ArrayType):
            ok = isinstance(dtype.elementType, StringType)
        if isinstance(dtype, MapType):
            ok = isinstance(dtype.keyType, StringType) and isinstance(dtype.valueType, StringType)
        if not ok:
            want = " or ".join(t.__name__.replace("Type", "").lower() for t in allowed)
            if name == "keys":
                want = "array<string>"
            if name == "properties":
                want = "map<string,string>"
            raise BadRowError(f"column {name!r} has type {dtype.simpleString()}; a write needs "
                              f"{want}")
    return tuple(n for n in WRITE_COLUMNS if n in fields)


_JOB_NAME = re.compile(r"job-[0-9a-f]{32}")
_SINK_NAME = re.compile(r"stream-[A-Za-z0-9._-]+")  # sink ids: letters, digits, '-_.'
_SPARK_DRIVER = object()  # a lease's default driver: the Spark driver of the calling worker


def new_job_dir(staging_dir: str) -> str:
    return os.path.join(staging_dir, f"job-{uuid.uuid4().hex}")


def sink_dir(staging_dir: str, sink_id: str) -> str:
    return os.path.join(staging_dir, f"stream-{sink_id}")


def open_job(staging_dir: str, driver=_SPARK_DRIVER) -> str:
    """Sweep ``staging_dir``, then make a new job directory there, leased to ``driver`` (a
    ``lease.Driver``; by default the Spark driver this worker serves)."""
    with _locked_root(staging_dir):
        sweep_locked(staging_dir)
        path = new_job_dir(staging_dir)
        os.mkdir(path)
        _lease(path, driver)
    return path


def open_sink(staging_dir: str, sink_id: str, driver=_SPARK_DRIVER) -> str:
    """Sweep ``staging_dir``, then make sure the sink's directory exists under a live lease
    (this driver's, unless another live one holds it already); its micro-batches stage in it."""
    path = sink_dir(staging_dir, sink_id)
    with _locked_root(staging_dir):
        sweep_locked(staging_dir)  # what is left is held by a live lease
        if not os.path.isdir(path):
            os.mkdir(path)
            _lease(path, driver)
    return path


def sweep(staging_dir: str) -> list[str]:
    """Remove the job and sink directories under ``staging_dir`` that no live lease holds
    (a crashed driver's); returns them."""
    if not os.path.isdir(staging_dir):
        return []
    with _locked_root(staging_dir):
        removed = sweep_locked(staging_dir)
    _remove_if_empty(staging_dir)
    return removed


def sweep_locked(staging_dir: str) -> list[str]:
    """``sweep`` for a caller holding the staging directory's lock."""
    removed = []
    for name in sorted(os.listdir(staging_dir)):
        if not (_JOB_NAME.fullmatch(name) or _SINK_NAME.fullmatch(name)):
            continue  # not ours: a stagingDir may hold other things
        path = os.path.join(staging_dir, name)
        fd = _try_lock(path)
        if fd is None:
            continue  # a live job's (or not a directory)
        try:
            shutil.rmtree(path, ignore_errors=True)
        finally:
            os.close(fd)
        if not os.path.lexists(path):
            removed.append(path)
    return removed


@contextmanager
def _locked_root(staging_dir: str):
    """The staging directory, made if missing and flock-ed exclusively, so that sweeps, new
    leases and its removal take turns."""
    while True:
        os.makedirs(staging_dir, exist_ok=True)
        try:
            fd = os.open(staging_dir, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            continue  # removed in between (empty, by a finished job): make it again
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            if is_file_at(fd, staging_dir):  # else removed while we waited for the lock
                yield
                return
        finally:
            os.close(fd)


def _try_lock(path: str) -> int | None:
    """A descriptor holding ``path``'s exclusive lock, or None when a lease holds it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


def _lease(path: str, driver) -> None:
    """Lock the new directory ``path`` (under the staging lock, so nobody else can yet) and
    hand the lock to a lease process."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        lease.hand_over(fd, lease.spark_driver() if driver is _SPARK_DRIVER else driver)
    except BaseException:
        shutil.rmtree(path, ignore_errors=True)
        raise
    finally:
        os.close(fd)


def _remove_if_empty(staging_dir: str) -> None:
    try:
        fd = os.open(staging_dir, os.O_RDONLY | os.O_DIRECTORY)
    except (FileNotFoundError, NotADirectoryError):
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        if is_file_at(fd, staging_dir):
            os.rmdir(staging_dir)
    except OSError:
        pass  # another job is staging there
    finally:
        os.close(fd)


def stage(batches, job_dir: str, columns: tuple[str, ...], max_body_bytes: int) -> Staged:
    """Check and stage one task's rows (runs in the executor)."""
    from pyspark import TaskContext
    ctx = TaskContext.get()
    pid = ctx.partitionId() if ctx is not None else 0
    attempt = ctx.attemptNumber() if ctx is not None else 0
    os.makedirs(job_dir, exist_ok=True)
    path = os.path.join(job_dir, f"part-{pid:05d}-{attempt}.arrow")
    tmp = path + ".tmp"
    schema = pa.schema([(n, STAGED_TYPES[n]) for n in columns])
    rows = 0
    try:
        with pa.OSFile(tmp, "wb") as sink, pa.ipc.new_file(sink, schema) as out:
            for batch in batches:
                batch = pa.RecordBatch.from_arrays(
                    [batch.column(n).cast(STAGED_TYPES[n]) for n in columns], schema=schema)
                check_rows(batch, pid, rows, max_body_bytes)
                batch = fold_field_properties(batch, pid, rows)
                out.write_batch(batch)
                rows += batch.num_rows
        os.replace(tmp, path)
    except BaseException:
        _unlink(tmp)
        raise
    return Staged(path, rows, pid)


def check_rows(batch: pa.RecordBatch, pid: int, first_row: int, max_body_bytes: int) -> None:
    """Raise BadRowError for the first row of ``batch`` a column check refuses."""
    def fail(i: int, reason: str):
        raise BadRowError(f"row {first_row + i} of partition {pid}: {reason}; nothing was "
                          f"written")

    names = batch.schema.names
    for col in ("topic", "body") + (("queue_id",) if "queue_id" in names else ()):
        nulls = batch.column(col).is_null()
        if pc.any(nulls).as_py():
            fail(_first(nulls), f"{col} is null")
    topics = batch.column("topic")
    for topic in pc.unique(topics).to_pylist():
        try:
            check_topic(topic)
        except ValueError as exc:
            fail(_first(pc.equal(topics, topic)), str(exc))
    lens = pc.binary_length(batch.column("body"))
    big = pc.greater(lens, max_body_bytes)
    if pc.any(big).as_py():
        i = _first(big)
        fail(i, body_too_large(lens[i].as_py(), max_body_bytes))
    if "queue_id" in names:
        qids = batch.column("queue_id")
        for q in (pc.min(qids).as_py(), pc.max(qids).as_py()):
            try:
                check_queue_id(q)
            except ValueError as exc:
                fail(_first(pc.equal(qids, q)), str(exc))


_FIELD_PROPERTIES = (("tags", "TAGS"), ("keys", "KEYS"))  # columns that are properties too


def _spelled(col: str, column, value) -> tuple:
    """A column's values and its property's values, spelled alike: keys joined by spaces, and
    a KEYS value as a read takes it (split on spaces, the empty tokens dropped)."""
    if col == "tags":
        return column, value
    tokens = pc.utf8_trim(pc.replace_substring_regex(value, pattern=" +", replacement=" "),
                          characters=" ")
    return pc.binary_join(column, " "), tokens


def fold_field_properties(batch: pa.RecordBatch, pid: int, first_row: int) -> pa.RecordBatch:
    """``batch`` with the ``tags`` and ``keys`` values its rows' properties also hold (and
    agree on) dropped; BadRowError for the first row where they disagree."""
    names = batch.schema.names
    if "properties" not in names:
        return batch
    props = batch.column("properties")
    for col, prop in _FIELD_PROPERTIES:
        if col not in names:
            continue
        column = batch.column(col)
        value = pc.map_lookup(props, pa.scalar(prop), "first")
        given = column.is_valid() if col == "tags" else pc.greater(pc.list_value_length(column), 0)
        both = pc.and_(pc.fill_null(given, False), value.is_valid())
        if not pc.any(both).as_py():
            continue
        same = pc.fill_null(pc.equal(*_spelled(col, column, value)), False)
        clash = pc.and_(both, pc.invert(same))
        if pc.any(clash).as_py():
            i = _first(clash)
            raise BadRowError(
                f"row {first_row + i} of partition {pid}: property {prop!r} is "
                f"{value[i].as_py()!r} in properties but the {col} column holds "
                f"{column[i].as_py()!r}; a row read from mqstore has them agree: change or drop "
                f"one of them; nothing was written")
        batch = batch.set_column(names.index(col), col, pc.if_else(
            both, pa.nulls(len(column), column.type), column))
    return batch


def _first(mask) -> int:
    return pc.index(mask, True).as_py()


def read_staged(messages) -> tuple[pa.Table | None, list[tuple[int, int]]]:
    """The staged rows of a job in partition order, and (partition, rows) per file."""
    staged = sorted((m for m in messages if m is not None), key=lambda m: m.partition_id)
    tables, parts = [], []
    for m in staged:
        with pa.OSFile(m.path, "rb") as source:  # read into memory: the file goes soon
            tables.append(pa.ipc.open_file(source).read_all())
        parts.append((m.partition_id, m.rows))
    if not tables:
        return None, parts
    return pa.concat_tables(tables), parts


def position(parts: list[tuple[int, int]], index: int) -> str:
    """Row ``index`` of a job's rows (in partition order) as "row i of partition p"."""
    for pid, rows in parts:
        if index < rows:
            return f"row {index} of partition {pid}"
        index -= rows
    return f"row {index} past the job's end"


_AT_MESSAGE = re.compile(r"message (\d+): (.*)", re.S)


def refusal(parts, error: str | None, index: int | None, skip: int = 0) -> BadRowError:
    """``put_batch``'s complaint about one message (of a batch starting at job row ``skip``),
    as the position of its row."""
    match = _AT_MESSAGE.fullmatch(error or "")
    if index is None and match:
        index = int(match.group(1))
    if index is not None:
        index += skip
    reason = match.group(2) if match else (error or "refused")
    where = position(parts, index) if index is not None else "the batch"
    return BadRowError(f"{where}: {reason}; nothing was written")


def remove_job(job_dir: str, staging_dir: str) -> None:
    """Remove a job's staged files (all attempts), then each directory above it up to
    ``staging_dir`` once it is empty (a stream's sink directory: its lease ends with it)."""
    shutil.rmtree(job_dir, ignore_errors=True)
    parent = os.path.dirname(os.path.abspath(job_dir))
    root = os.path.abspath(staging_dir)
    while parent != root and parent.startswith(root + os.sep):
        try:
            os.rmdir(parent)
        except OSError:
            return  # another micro-batch or job is staging there, or it is gone already
        parent = os.path.dirname(parent)
    _remove_if_empty(root)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["BadRowError", "Staged", "check_rows", "fold_field_properties", "new_job_dir", "open_job", "open_sink",
           "position", "read_staged", "refusal", "remove_job", "sink_dir", "stage", "sweep",
           "sweep_locked", "write_columns"]

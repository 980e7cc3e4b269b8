"""A partition's messages as Arrow record batches, built in bulk.

Each ``MessageStore.read`` (numpy columns over consume-queue units and record headers, bodies
packed as Arrow's binary layout) and ``record_fields`` (hosts, msg ids, properties, tags,
keys) of the same rows become one ``pyarrow.RecordBatch``: every column wraps its numpy
buffers, no Python object per message. The rows of a range are deterministic: the same
``[start, end)`` of a queue reads the same messages every time (until cleanup removes them).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from mqstore.read.fields import Strings, record_fields
from mqstore.spark.pushdown import Pushed
from mqstore.spark.schema import arrow_schema
from mqstore.spark.stores import open_read_only, queue_end

log = logging.getLogger(__name__)
# Messages per store.read call, and so at most per record batch. Spark's JVM spends less per
# row on fewer, larger batches (a noop write of 1M rows: about 2.0 CPU-s at 8192, 1.5 at
# 16384 to 32768); the reader a little more (its arrays leave the CPU caches sooner).
READ_ROWS = 16384


@dataclass(frozen=True)
class ReadSettings:
    """What every task of one read applies to its rows."""

    config: str | None = None
    expression: str | None = None
    expression_type: str = "TAG"
    verify_checksums: bool = True
    tags: frozenset[str] | None = None  # pushed tags: rows must carry one of them
    tags_present: bool = False  # pushed: rows must carry a tag
    time_range: tuple = (None, None)  # pushed store-time bounds [lo, hi), ms


def read_range(part, settings: ReadSettings):
    """Record batches of the messages of ``part`` (a QueueRange) that ``settings`` keep."""
    store = open_read_only(part.store, settings.config)
    expression, expression_type = settings.expression, settings.expression_type
    if expression is None and settings.tags is not None:
        expression = Pushed(tags=settings.tags).tag_expression()
        expression_type = "TAG"
    # The plan was made in another process; this one's view may still be behind it.
    queue_end(store, part.topic, part.queue_id, at_least=part.end)
    offset = part.start
    while offset < part.end:
        batch = store.read(part.topic, part.queue_id, offset, min(READ_ROWS, part.end - offset),
                           expression=expression, expression_type=expression_type,
                           verify=settings.verify_checksums)
        if batch is None:
            raise RuntimeError(f"store {part.store!r} is not readable now (running flags "
                               f"{store.running_flags:#x})")
        for off, _phys, why in batch.corrupt:
            log.warning("store %s %s/%d: offset %d passed over: %s", part.store, part.topic,
                        part.queue_id, off, why)
        if len(batch):
            rows = to_record_batch(store, part, batch)
            keep = _keep(rows, batch, part.end, settings)
            yield rows if keep is None else rows.filter(keep)
        if batch.next_begin_offset <= offset:
            # The queue holds less than was planned (its end was cut since): nothing more.
            log.warning("store %s %s/%d: read ends at %d of %d (%s)", part.store, part.topic,
                        part.queue_id, offset, part.end, batch.status.name)
            return
        offset = batch.next_begin_offset


def _keep(rows: pa.RecordBatch, batch, end: int, settings: ReadSettings):
    """The rows to keep (None: all): inside the range, the pushed times and tags."""
    keep = batch.queue_offsets < end
    lo, hi = settings.time_range
    if lo is not None:
        keep &= batch.store_timestamps >= lo
    if hi is not None:
        keep &= batch.store_timestamps < hi
    if settings.tags_present:
        keep &= rows.column("tags").is_valid().to_numpy(zero_copy_only=False)
    if settings.tags is not None:
        keep &= pc.is_in(rows.column("tags"), value_set=pa.array(sorted(settings.tags)),
                         skip_nulls=True).to_numpy(zero_copy_only=False)
    return None if keep.all() else pa.array(keep)


def to_record_batch(store, part, batch) -> pa.RecordBatch:
    """One ReadBatch of ``part``'s queue as a record batch of the message schema."""
    n = len(batch)
    fields = record_fields(store.internals.commit_log, batch)
    schema = arrow_schema()
    keys_type, props_type = schema.field("keys").type, schema.field("properties").type
    props = fields.properties
    columns = [
        _constant(part.topic, n),
        pa.array(np.full(n, part.queue_id, dtype=np.int32)),
        pa.array(batch.queue_offsets),
        pa.array(batch.phys_offsets),
        strings_array(fields.msg_ids),
        strings_array(fields.tags),
        pa.ListArray.from_arrays(pa.array(fields.keys.offsets), strings_array(fields.keys.items),
                                 type=keys_type),
        pa.MapArray.from_arrays(pa.array(props.offsets), strings_array(props.names),
                                strings_array(props.values), type=props_type),
        pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(batch.body_offsets),
                                               pa.py_buffer(batch.bodies)]),
        _timestamps(batch.born_timestamps),
        _timestamps(batch.store_timestamps),
        strings_array(fields.born_hosts),
        strings_array(fields.store_hosts),
        pa.array(batch.flags.astype(np.int32, copy=False)),
        pa.array(batch.sys_flags.astype(np.int32, copy=False)),
        pa.array(batch.reconsume_times.astype(np.int32, copy=False)),
        pa.array(batch.sizes.astype(np.int32, copy=False)),
        _constant(part.store, n),
    ]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def strings_array(s: Strings) -> pa.Array:
    """A ``record_fields`` string column as an Arrow string array (its buffers, no copy)."""
    validity = None
    if s.valid is not None:
        validity = pa.py_buffer(np.packbits(s.valid, bitorder="little"))
    return pa.Array.from_buffers(pa.string(), s.count,
                                 [validity, pa.py_buffer(s.offsets), pa.py_buffer(s.data)])


def _constant(text: str, n: int) -> pa.Array:
    raw = np.frombuffer(text.encode("utf-8"), dtype=np.uint8)
    offsets = (np.arange(n + 1, dtype=np.int64) * len(raw)).astype(np.int32)
    return pa.Array.from_buffers(pa.string(), n, [None, pa.py_buffer(offsets),
                                                  pa.py_buffer(np.tile(raw, n))])


def _timestamps(ms: np.ndarray) -> pa.Array:
    return pa.array(ms.astype(np.int64, copy=False) * 1000, type=pa.timestamp("us", tz="UTC"))


__all__ = ["READ_ROWS", "ReadSettings", "read_range", "strings_array", "to_record_batch"]

"""A job's staged rows appended to the store: one ``put_batch`` of columns, all or nothing.

The whole job is one ``MessageBatch`` appended under the store's writer lock: ``put_batch``
checks every message before it writes any, so a refused row leaves the store as it was.
Columns shared by every row (one topic, one tag, no keys) are handed over as single values,
which keeps ``put_batch`` on its path without Python work per message.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from mqstore.message import MessageBatch
from mqstore.spark.staging import refusal


def _shared_or_list(column: pa.ChunkedArray):
    """One value when every row holds the same non-null value, else the list of values."""
    if len(column) and column.null_count == 0 and pc.count_distinct(column).as_py() == 1:
        return column[0].as_py()
    return column.to_pylist()


def message_batch(table: pa.Table, marker: dict[str, str] | None = None) -> MessageBatch:
    """The rows of ``table`` (staged columns) as a MessageBatch; ``marker`` (properties) is
    added to every message."""
    names = table.schema.names
    properties = marker
    if "properties" in names:
        extra = marker or {}
        properties = [({**dict(p), **extra} if p is not None else (dict(extra) or None))
                      for p in table.column("properties").to_pylist()]
    keys = table.column("keys").to_pylist() if "keys" in names else None
    if keys is not None and not any(keys):
        keys = None  # no row has keys: the batch shares its tail
    return MessageBatch(
        topic=_shared_or_list(table.column("topic")),
        bodies=table.column("body").to_pylist(),
        queue_ids=(table.column("queue_id").to_numpy() if "queue_id" in names else None),
        tags=_shared_or_list(table.column("tags")) if "tags" in names else None,
        keys=keys, properties=properties)


def append_rows(store, table: pa.Table, parts, marker: dict[str, str] | None = None,
                skip: int = 0):
    """Append ``table``'s rows from row ``skip`` on; BadRowError (naming the row's position
    in the job) when refused."""
    try:
        result = store.put_batch(message_batch(table.slice(skip), marker))
    except (ValueError, TypeError) as exc:
        raise refusal(parts, str(exc), None, skip) from None
    if not result.status.stored:
        if result.error_index is None and not (result.error or "").startswith("message "):
            raise RuntimeError(f"store {store.root!r} refused the append "
                               f"({result.status.name}: {result.error}); nothing was written")
        raise refusal(parts, result.error, result.error_index, skip)
    return result


__all__ = ["append_rows", "message_batch"]

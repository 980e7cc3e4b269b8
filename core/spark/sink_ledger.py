"""Exactly-once streaming appends: which of a sink's batch ids the store already holds.

NOTE [ Streaming sink ledger ]
Spark replays a micro-batch (same batch id, same rows) when it cannot tell whether its commit
finished. A commit must then append nothing twice, even when the previous attempt died
anywhere: before, during or after its append, or before it could record the batch id.

* Every message a streaming write appends carries the property MARKER = "<sink>/<batch id>"
  (the sink is named by the query's checkpoint location, or the ``sinkId`` option). That
  record is written by the same append as the message, so it cannot be lost apart from it.
* The ledger file ``<store>/spark-sinks/<sink>.json`` says the last batch id committed and
  every queue's end when it was written. It is written before the sink's first append and
  after each commit, always under the store's writer lock, atomically (write, fsync, rename).
* A commit of batch B: B <= the ledger's batch id: done before, append nothing. Otherwise
  count the messages marked "<sink>/B" past the ledger's queue ends (only what was appended
  since the last commit is looked at): a crash between the append and the ledger finds all
  of them, one inside ``put_batch`` finds a prefix (records are appended in row order and
  recovery keeps a prefix of the log). Append the rows after them, then write the ledger.

A deleted ledger costs time, not correctness: the count then reads the whole topics.
"""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.compute as pc

from mqstore.read.fields import record_fields
from mqstore.spark.appends import append_rows
from mqstore.spark.arrow_rows import strings_array

MARKER = "MQSTORE_SINK_BATCH"
LEDGER_DIR = "spark-sinks"
SCAN_ROWS = 8192


def _path(store, sink_id: str) -> str:
    return os.path.join(store.root, LEDGER_DIR, f"{sink_id}.json")


def load(store, sink_id: str) -> dict | None:
    try:
        with open(_path(store, sink_id), encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError:
        return None


def save(store, sink_id: str, batch_id: int) -> dict:
    """Record ``batch_id`` with every queue's current end (the caller holds the lock)."""
    store.wait_dispatched(timeout=60)
    return save_entry(store, sink_id, {
        "batch_id": batch_id,
        "queue_offsets": {t: {str(q): store.max_offset(t, q) for q in store.queue_ids(t)}
                          for t in store.topics()}})


def save_entry(store, sink_id: str, entry: dict) -> dict:
    path = _path(store, sink_id)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(entry, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
    return entry


def marked(store, topics, since: dict, value: str) -> int:
    """How many messages of ``topics`` past the ``since`` queue ends carry MARKER = value."""
    count = 0
    for topic in topics:
        for q in store.queue_ids(topic):
            offset = since.get(topic, {}).get(str(q), store.min_offset(topic, q))
            end = store.max_offset(topic, q)
            while offset < end:
                batch = store.read(topic, q, offset, SCAN_ROWS)
                if len(batch):
                    props = record_fields(store.internals.commit_log, batch).properties
                    hit = pc.and_(pc.equal(strings_array(props.names), MARKER),
                                  pc.equal(strings_array(props.values), value))
                    count += pc.sum(hit).as_py() or 0
                if batch.next_begin_offset <= offset:
                    break
                offset = batch.next_begin_offset
    return count


def commit_batch(store, sink_id: str, batch_id: int, table: pa.Table | None, parts) -> int:
    """Append batch ``batch_id``'s rows unless the store holds them; returns rows appended."""
    ledger = load(store, sink_id)
    if ledger is None:  # before the sink's first append: nothing of it lies past these ends
        ledger = save(store, sink_id, -1)
    if batch_id <= ledger["batch_id"]:
        return 0
    appended = 0
    if table is not None and table.num_rows:
        store.wait_dispatched(timeout=60)  # the count reads consume queues: all of the log
        value = f"{sink_id}/{batch_id}"
        topics = pc.unique(table.column("topic")).to_pylist()
        done = marked(store, topics, ledger["queue_offsets"], value)
        if done < table.num_rows:
            append_rows(store, table, parts, {MARKER: value}, skip=done)
            appended = table.num_rows - done
    save(store, sink_id, batch_id)
    return appended


__all__ = ["LEDGER_DIR", "MARKER", "commit_batch", "load", "marked", "save", "save_entry"]

"""``mqstore bench``: put_batch, dispatch and get throughput against a bare mmap copy.

The measurement of ``benchmarks/bench_put_get.py`` (which has the full discussion), made
small enough to run from the command line: N messages as columnar ``MessageBatch``es into a
fresh store; the dispatch of all N, timed from the first put (dispatch runs beside the puts)
until the consume queues and index cover the last (the benchmark script times only the
backlog left when the puts end); a sweep of 32-message ``get``s, then
the very records the store wrote copied one by one into a fresh file-backed mmap by a bare
Python loop: the floor cost of getting those bytes into a mapped file from Python. The ratio
``x base`` (MB/s over the baseline's) is what compares across machines; absolute rates move
with the machine's load.
"""

from __future__ import annotations

import gc
import mmap
import os
import tempfile
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from mqstore.config import StoreConfig
from mqstore.message import GetStatus, MessageBatch, PutStatus
from mqstore.store import MessageStore

TOPICS = ("BenchTopicA", "BenchTopicB")
QUEUES = 4
Progress = Callable[[str, int, int], None]  # (phase, done, total)


@dataclass
class Phase:
    name: str
    messages: int
    seconds: float
    bytes: int
    x_base: float | None = None

    @property
    def msg_per_s(self) -> float:
        return self.messages / self.seconds if self.seconds > 0 else float("inf")

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6 if self.seconds > 0 else float("inf")

    def to_dict(self) -> dict:
        return {"phase": self.name, "messages": self.messages, "seconds": self.seconds,
                "bytes": self.bytes, "msg_per_s": self.msg_per_s, "mb_per_s": self.mb_per_s,
                "x_base": self.x_base}


def _batches(count: int, body_bytes: int, batch: int) -> list[MessageBatch]:
    body = bytes(i % 251 for i in range(body_bytes))
    out = []
    for lo in range(0, count, batch):
        idx = np.arange(lo, min(count, lo + batch))
        out.append(MessageBatch(topic=[TOPICS[i % 2] for i in idx.tolist()],
                                bodies=[body] * len(idx), queue_ids=(idx // 2) % QUEUES,
                                tags="TagA"))
    return out


def run_bench(config: StoreConfig, count: int, body_bytes: int, batch: int,
              progress: Progress = lambda phase, done, total: None) -> list[Phase]:
    batches = _batches(count, body_bytes, batch)
    with tempfile.TemporaryDirectory(prefix="mqstore-bench-") as tmp:
        root = os.path.join(tmp, "store")
        with MessageStore.open(root, config=config) as store:
            phases, spans = _write(store, batches, count, progress)
            phases.append(_get(store, count, phases[0].bytes, progress))
        records = _read_records(os.path.join(root, "commitlog"),
                                store.internals.commit_log.segment_bytes, spans)
        base = _baseline(records, tmp, store.internals.commit_log.segment_bytes, progress)
    for phase in phases:
        phase.x_base = phase.mb_per_s / base.mb_per_s if base.mb_per_s else None
    base.x_base = 1.0
    return [*phases, base]


def _write(store, batches, count, progress) -> tuple[list[Phase], list]:
    spans, written, done = [], 0, 0
    gc.collect()
    t0 = time.perf_counter()
    for b in batches:
        r = store.put_batch(b)
        if r.status is not PutStatus.PUT_OK:
            raise RuntimeError(f"put_batch: {r.status.name} {r.error}")
        spans.append((r.phys_offsets, r.sizes))
        written += r.wrote_bytes
        done += len(b)
        progress("put_batch", done, count)
    t1 = time.perf_counter()
    store.wait_dispatched(timeout=600)
    t2 = time.perf_counter()
    # Dispatch starts on the first batch put, so all N took from t0 to the last one covered.
    return [Phase("put_batch", count, t1 - t0, written),
            Phase("dispatch", count, t2 - t0, written)], spans


def _get(store, count: int, nbytes: int, progress) -> Phase:
    found = 0
    gc.collect()
    t0 = time.perf_counter()
    for topic in TOPICS:
        for q in range(QUEUES):
            offset = 0
            while True:
                r = store.get("bench", topic, q, offset, 32)
                if r.status is not GetStatus.FOUND:
                    break
                found += len(r.messages)
                offset = r.next_begin_offset
            progress("get", found, count)
    elapsed = time.perf_counter() - t0
    if found != count:
        raise RuntimeError(f"get read {found} messages, {count} were written")
    return Phase("get", found, elapsed, nbytes)


def _read_records(directory: str, segment_bytes: int, spans) -> list[bytes]:
    """The records the store wrote, byte for byte, read back from its segment files."""
    records = []
    files = {}
    try:
        for phys, sizes in spans:
            for off, n in zip(phys.tolist(), sizes.tolist()):
                start = off - off % segment_bytes
                f = files.get(start)
                if f is None:
                    f = files[start] = open(os.path.join(directory, f"{start:020d}"), "rb")
                records.append(os.pread(f.fileno(), n, off - start))
    finally:
        for f in files.values():
            f.close()
    return records


def _baseline(records: list[bytes], tmp: str, segment_bytes: int, progress) -> Phase:
    total = sum(map(len, records))
    size = max(segment_bytes, -(-total // segment_bytes) * segment_bytes)
    fd = os.open(os.path.join(tmp, "baseline"), os.O_RDWR | os.O_CREAT, 0o644)
    try:
        os.ftruncate(fd, size)
        with mmap.mmap(fd, size) as mm:
            gc.collect()
            pos = 0
            t0 = time.perf_counter()
            for rec in records:
                n = len(rec)
                mm[pos:pos + n] = rec
                pos += n
            elapsed = time.perf_counter() - t0
    finally:
        os.close(fd)
    progress("baseline", len(records), len(records))
    return Phase("baseline", len(records), elapsed, total)

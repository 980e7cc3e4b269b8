"""Dispatch: turn new commit-log records into consume-queue units, index entries, ...

NOTE [ Dispatch loop ]
The loop owns one position, ``dispatched``: every record below it has been handed to every
dispatcher. Each pass reads records in ``[dispatched, confirm_offset())`` (the flushed end under
sync flush, the written end otherwise), at most ``batch_bytes`` at a time, builds one
``DispatchBatch`` of columns, calls each dispatcher, then ``after_dispatch``, then advances.
Dispatchers must be idempotent: recovery re-dispatches from a safe point. The loop object has no
thread of its own; ``run_until`` drives it inline (recovery) and ``DispatchThread`` drives it in
the background, so a worker process can run it unchanged.
"""

from __future__ import annotations

import logging
import threading
import weakref
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from mqstore.errors import CorruptRecordError
from mqstore.format.properties import PROPERTY_DELAY, PROPERTY_TAGS, find_property
from mqstore.format.quarantine import find_record
from mqstore.format.record import SCAN_BAD, SCAN_BLANK, scan_record
from mqstore.format.record_columns import heads, walk

log = logging.getLogger("mqstore.dispatch")

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"


@dataclass(frozen=True)
class DispatchBatch:
    """Records ``[begin, end)`` of the commit log, one column per field, in log order."""

    begin: int
    end: int
    phys_offsets: np.ndarray  # int64
    sizes: np.ndarray  # int32
    queue_ids: np.ndarray  # int32
    queue_offsets: np.ndarray  # int64
    tags_codes: np.ndarray  # int64
    store_timestamps: np.ndarray  # int64
    sysflags: np.ndarray  # int32
    topics: Sequence[str]
    properties: Sequence[bytes]  # encoded properties strings

    def __len__(self) -> int:
        return len(self.phys_offsets)

    @classmethod
    def concat(cls, begin: int, end: int, parts: list[dict]) -> "DispatchBatch":
        def col(name, dtype):
            return np.concatenate([p[name] for p in parts]).astype(dtype, copy=False)
        return cls(
            begin, end, col("phys_offset", np.int64), col("size", np.int32),
            col("queue_id", np.int32), col("queue_offset", np.int64), col("tags_code", np.int64),
            col("store_timestamp", np.int64), col("sysflag", np.int32),
            [t for p in parts for t in p["topics"]], [x for p in parts for x in p["properties"]],
        )


class TagsCoder:
    """Tags code of a record: the string hash of TAGS (cached), or a delay topic's due time."""

    def __init__(self, string_hash: Callable[[str], int], delay_levels_ms: Sequence[int]) -> None:
        self._hash = string_hash
        self._cache: dict[bytes, int] = {}
        self._delays = list(delay_levels_ms)

    def code(self, topic: str, props: bytes, store_timestamp: int) -> int:
        if topic == SCHEDULE_TOPIC:
            delay = find_property(props, PROPERTY_DELAY.encode())
            if delay is not None:
                try:
                    level = min(int(delay), len(self._delays))
                except ValueError:
                    level = 0
                if level > 0:
                    return store_timestamp + self._delays[level - 1]
        tags = find_property(props, PROPERTY_TAGS.encode())
        if not tags:
            return 0
        code = self._cache.get(tags)
        if code is None:
            if len(self._cache) > 65536:
                self._cache.clear()
            code = self._cache[tags] = self._hash(tags.decode("utf-8", errors="replace"))
        return code


class DispatchLoop:
    def __init__(self, commit_log, dispatchers: Sequence, tags_coder: TagsCoder,
                 confirm_offset: Callable[[], int], start_offset: int, *,
                 batch_bytes: int = 4 << 20, after_dispatch: Callable | None = None) -> None:
        self.commit_log = commit_log
        self.dispatchers = list(dispatchers)
        self.tags_coder = tags_coder
        self.confirm_offset = confirm_offset
        self.dispatched = start_offset
        self.batch_bytes = batch_bytes
        self.after_dispatch = after_dispatch
        self.error: str | None = None
        # Why the current batch keeps failing (a dispatcher raised, its files cannot grow)
        # and how many attempts in a row; the batch is retried, dispatchers being idempotent.
        self.failing: str | None = None
        self.failures = 0
        self.last_exception: Exception | None = None
        self.progress = threading.Condition()
        self._u8 = None
        self._topic_names: dict[bytes, str] = {}

    def behind_bytes(self) -> int:
        return max(0, self.confirm_offset() - self.dispatched)

    def run_once(self) -> int:
        """Dispatch one batch; returns the number of bytes the position moved."""
        min_offset = self.commit_log.min_offset
        if min_offset > self.dispatched:
            self.dispatched = min_offset
        end = self.confirm_offset()
        begin = self.dispatched
        if begin >= end:
            return 0
        stop = min(end, begin + self.batch_bytes)
        parts = []
        pos = begin
        while pos < stop:
            seg = self.commit_log.segments.find(pos)
            if seg is None:
                break
            limit = min(seg.committed, end - seg.start)
            at = pos - seg.start
            positions, wend = walk(seg.mm, at, limit, stop - seg.start)
            if positions:
                rel = np.array(positions, dtype=np.int64)
                cols, n = heads(self._bytes_of(seg), rel)
                wrong = np.flatnonzero(cols["phys_offset"] != rel[:n] + seg.start)
                if len(wrong):
                    n = int(wrong[0])
                    cols = {k: v[:n] for k, v in cols.items()}
                if n < len(positions):
                    wend = positions[n]
                if n:
                    parts.append(self._columns(seg, cols))
            pos = seg.start + wend
            if wend >= stop - seg.start or wend >= limit:
                break
            kind, size, _head = scan_record(seg.mm, wend, seg.committed, False, expected_phys=pos)
            if kind == SCAN_BLANK:
                pos = seg.end
                continue
            if kind == SCAN_BAD:
                # Damage below the visible end (recovery mends what it saw at open; this
                # appeared since): step over it to the next intact record, as recovery will.
                nxt = find_record(seg.mm, wend + 1, limit, seg.start, seg.size)
                if nxt is not None or seg.end <= end:
                    resume = seg.start + nxt if nxt is not None else seg.end
                    log.error("dispatch passes over damaged commit-log bytes [%d, %d): %s",
                              pos, resume, size)
                    pos = resume
                    continue
                self._failed(pos, CorruptRecordError(
                    f"commit-log offset {pos}: {size}; no intact record follows yet"))
                return 0
            if wend + size <= limit:  # valid, visible, yet not walkable: never wait on it
                self.error = f"dispatch cannot read the record at commit-log offset {pos}"
                log.error(self.error)
            break
        if parts:
            batch = DispatchBatch.concat(begin, pos, parts)
            try:
                for dispatcher in self.dispatchers:
                    dispatcher.dispatch(batch)
                if self.after_dispatch is not None:
                    self.after_dispatch(batch)
            except Exception as exc:
                self._failed(begin, exc)
                return 0
        if self.failing is not None:
            log.warning("dispatch at commit-log offset %d goes on after %d failed attempts",
                        begin, self.failures)
            self.failing, self.failures = None, 0
        moved = pos - begin
        if moved:
            with self.progress:
                self.dispatched = pos
                self.progress.notify_all()
        return moved

    def _failed(self, begin: int, exc: Exception) -> None:
        self.last_exception = exc
        self.failures += 1
        self.failing = (f"dispatch of the records at commit-log offset {begin} failed "
                        f"{self.failures} time(s): {type(exc).__name__}: {exc}")
        if self.failures == 1 or self.failures % 100 == 0:
            log.error("%s; retrying", self.failing, exc_info=self.failures == 1)

    def retry_pause_s(self) -> float:
        """Pause before retrying a failed batch: 10 ms, doubling to 1 s."""
        return min(1.0, 0.01 * 2 ** min(self.failures, 7))

    def _bytes_of(self, seg) -> np.ndarray:
        cached = self._u8
        if cached is None or cached[0] is not seg:
            cached = self._u8 = (seg, np.frombuffer(seg.mm, dtype=np.uint8))
        return cached[1]

    def _columns(self, seg, cols: dict) -> dict:
        mm = seg.mm
        topic_names = self._topic_names
        topics, props, tags = [], [], []
        code = self.tags_coder.code
        for t_at, t_len, p_at, p_len, ts in zip(
                cols["topic_at"].tolist(), cols["topic_len"].tolist(), cols["props_at"].tolist(),
                cols["props_len"].tolist(), cols["store_timestamp"].tolist()):
            raw_topic = mm[t_at:t_at + t_len]
            topic = topic_names.get(raw_topic)
            if topic is None:
                topic = topic_names[raw_topic] = raw_topic.decode("utf-8", errors="replace")
            raw_props = mm[p_at:p_at + p_len]
            topics.append(topic)
            props.append(raw_props)
            tags.append(code(topic, raw_props, ts))
        cols["topics"] = topics
        cols["properties"] = props
        cols["tags_code"] = np.array(tags, dtype=np.int64)
        return cols

    def run_until(self, offset: int) -> None:
        """Dispatch inline up to ``offset``; a failing dispatcher's exception is raised."""
        while self.dispatched < offset and self.run_once():
            pass
        if self.dispatched < offset and self.last_exception is not None \
                and self.failing is not None:
            raise self.last_exception

    def wait(self, offset: int, timeout: float) -> bool:
        with self.progress:
            return self.progress.wait_for(lambda: self.dispatched >= offset or self.error,
                                          timeout) and self.dispatched >= offset


class DispatchThread:
    """Runs a DispatchLoop every ``interval_ms`` until stopped; a put may wake it early."""

    def __init__(self, loop: DispatchLoop, interval_ms: int) -> None:
        # Held weakly: the loop's dispatchers hold the store, and a running thread must not
        # keep a store its program dropped from being collected (and closed).
        self._loop = weakref.ref(loop)
        self.interval_s = interval_ms / 1000.0
        self.wake = threading.Event()
        self._stop = threading.Event()
        self.exception: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="mqstore-dispatch", daemon=True)

    def start(self) -> None:
        self._thread.start()

    @property
    def loop(self) -> DispatchLoop | None:
        return self._loop()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                loop = self._loop()
                if loop is None:
                    return
                if loop.run_once():
                    continue
                pause = loop.retry_pause_s() if loop.failing is not None else self.interval_s
                del loop
                self.wake.wait(pause)
                self.wake.clear()
        except BaseException as exc:  # surfaced by the store on the next call that needs it
            self.exception = exc
            loop = self._loop()
            if loop is not None:
                loop.error = f"dispatch loop died: {exc!r}"
                with loop.progress:
                    loop.progress.notify_all()
            log.exception("dispatch loop died")

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        self.wake.set()
        self._thread.join(timeout)

    def is_alive(self) -> bool:
        return self._thread.is_alive()

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
import struct
import threading
import weakref
from functools import lru_cache
from typing import Callable, Sequence

import numpy as np

from mqstore.errors import CorruptRecordError
from mqstore.format.properties import PROPERTY_DELAY, PROPERTY_TAGS, find_property
from mqstore.format.property_keys import SEGMENT_SEP, last_values
from mqstore.format.quarantine import find_record
from mqstore.format.record import (
    MAGIC_V1, MAGIC_V2, POS_BORN_HOST, POS_PHYS_OFFSET, POS_QUEUE_ID, POS_QUEUE_OFFSET,
    POS_SYSFLAG, SCAN_BAD, SCAN_BLANK, SYSFLAG_BORNHOST_V6, scan_record, unpack_record,
)
from mqstore.format.record_columns import MIN_RECORD_BYTES, heads, walk
from mqstore.plugin_api.batch import DispatchBatch  # noqa: F401 - built here, defined for plugins
from mqstore.storage.queue_progress import DispatchMark

log = logging.getLogger(__name__)

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
_TAGS = PROPERTY_TAGS.encode()
_SIZE_MAGIC = struct.Struct(">ii")
# walk_runs: records checked by the first array pass (a producer's batch is usually one run),
# by the first one after a run broke (then growing while the sizes stay equal), the run below
# which sizes count as mixed, and the records then walked one by one before looking again.
_RUN_FIRST = 1024
_RUN_AGAIN = 64
_RUN_MOST = 1 << 16
_RUN_SHORT = 8
_MIXED_STRETCH_RECORDS = 128
_FEW_RECORDS = 96  # batches this small read each record's tags on its own (arrays cost more)


def walk_runs(buf, u8: np.ndarray, begin: int, limit: int, soft_stop: int
              ) -> tuple[np.ndarray, int]:
    """``record_columns.walk`` (same positions, same stop) as an int64 array.

    Following TOTALSIZE is sequential, but a producer's batch is mostly records of one size
    back to back: from a record of size s, the next ones start every s bytes for as long as
    their size fields say s, so one array pass over ``(size, magic)`` at that stride checks a
    whole run. A run is tried only where the next record has the same size; elsewhere (sizes
    that keep changing) stretches are walked record by record, as ``walk`` does.
    """
    limit = min(limit, len(buf))
    runs: list[np.ndarray] = []
    pos, chunk = begin, _RUN_FIRST
    while pos + 8 <= limit and pos < soft_stop:
        total, magic = _SIZE_MAGIC.unpack_from(buf, pos)
        if (magic != MAGIC_V1 and magic != MAGIC_V2) or total < MIN_RECORD_BYTES \
                or pos + total > limit:
            break
        following = pos + total
        if following + 8 <= limit and following < soft_stop \
                and _SIZE_MAGIC.unpack_from(buf, following)[0] == total:
            # records of this size that would end inside limit and start before soft_stop
            m = min(chunk, (limit - pos) // total, -(-(soft_stop - pos) // total))
            fields = u8[pos:pos + m * total].reshape(m, total)[:, :8].copy().view(">i4")
            ok = (fields[:, 0] == total) & (
                (fields[:, 1] == MAGIC_V1) | (fields[:, 1] == MAGIC_V2))
            bad = np.flatnonzero(~ok)
            run = int(bad[0]) if len(bad) else m  # >= 1: the first record was checked above
            runs.append(pos + total * np.arange(run, dtype=np.int64))
            pos += run * total
            if run == m:
                chunk = min(chunk * 4, _RUN_MOST)
                continue
            chunk = _RUN_AGAIN
            if run >= _RUN_SHORT:
                continue
        more, pos = walk(buf, pos, limit, min(soft_stop, pos + _MIXED_STRETCH_RECORDS * total))
        runs.append(np.array(more, dtype=np.int64))
    out = runs[0] if len(runs) == 1 else (
        np.concatenate(runs) if runs else np.empty(0, dtype=np.int64))
    return out, pos


def _slices(mm, u8: np.ndarray, at: np.ndarray, length: np.ndarray) -> list[bytes]:
    """``mm[at:at + length]`` of every record: when all are the first one's bytes (one topic,
    one property block), found with one array compare, the list repeats that one object;
    else the slices are taken by C loops (map), not by a Python loop per record."""
    first, size = int(at[0]), int(length[0])
    raw = mm[first:first + size]
    if len(at) == 1:
        return [raw]
    if (length == size).all() and (
            u8[at[:, None] + np.arange(size)] == np.frombuffer(raw, dtype=np.uint8)).all():
        return [raw] * len(at)
    return list(map(mm.__getitem__, map(slice, at.tolist(), (at + length).tolist())))


def _column(rows: np.ndarray, at: int, dtype: str) -> np.ndarray:
    width = np.dtype(dtype).itemsize
    return np.ascontiguousarray(rows[:, at:at + width]).view(dtype).ravel()


def heads_alike(buf, u8: np.ndarray, positions: np.ndarray) -> tuple[dict, int] | None:
    """``record_columns.heads`` for records laid back to back with one layout (the usual
    batch: one size, host families, body, topic and properties lengths), or None.

    The records are rows of one 2-D view of the segment; they share the first record's
    layout when the bytes that decide it (size, magic, sysflag, the three length fields) are
    the same in every row, and then every record is valid exactly when the first is, which
    ``unpack_record`` (accepting what ``heads`` accepts) checks; each column is then one
    strided copy.
    """
    n, start = len(positions), int(positions[0])
    try:
        lay = unpack_record(buf, start)
    except ValueError:
        return None
    size, sysflag, body_len = lay.fields[0], lay.fields[7], lay.fields[16]
    # The gaps say nothing of the last record's size: the row compare below checks it, on
    # rows that must then lie inside the buffer.
    if n > 1 and (start + n * size > len(u8) or not (np.diff(positions) == size).all()):
        return None
    rows = u8[start:start + n * size].reshape(n, size)
    ts_at = POS_BORN_HOST + (20 if sysflag & SYSFLAG_BORNHOST_V6 else 8)
    body_len_at = lay.body_at - start - 4
    topic_at, props_at = lay.topic_at - start, lay.props_at - start
    if n > 1:
        decided = _decided(body_len_at, body_len, topic_at, props_at)
        if not (rows[1:, decided] == rows[0, decided]).all():
            return None
    return {
        "size": np.full(n, size, dtype=np.int64),
        "queue_id": _column(rows, POS_QUEUE_ID, ">i4"),
        "queue_offset": _column(rows, POS_QUEUE_OFFSET, ">i8"),
        "phys_offset": _column(rows, POS_PHYS_OFFSET, ">i8"),
        "sysflag": np.full(n, sysflag, dtype=np.int32),
        "store_timestamp": _column(rows, ts_at, ">i8"),
        "topic_at": positions + topic_at,
        "topic_len": np.full(n, lay.topic_len, dtype=np.int64),
        "props_at": positions + props_at,
        "props_len": np.full(n, lay.props_len, dtype=np.int64),
    }, n


@lru_cache(maxsize=64)
def _decided(body_len_at: int, body_len: int, topic_at: int, props_at: int) -> np.ndarray:
    """Where the bytes that decide a record's layout lie (``heads_alike``); batches repeat
    one layout, so each is built once."""
    return np.r_[0:8, POS_SYSFLAG:POS_SYSFLAG + 4, body_len_at:body_len_at + 4,
                 body_len_at + 4 + body_len:topic_at, props_at - 2:props_at]


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
        tags = find_property(props, _TAGS)
        return self._tags_code(tags) if tags else 0

    def _tags_code(self, tags: bytes) -> int:
        code = self._cache.get(tags)
        if code is None:
            if len(self._cache) > 65536:
                self._cache.clear()
            code = self._cache[tags] = self._hash(tags.decode("utf-8", errors="replace"))
        return code

    def codes(self, topics: Sequence[str], props: list[bytes], store_timestamps: np.ndarray
              ) -> np.ndarray:
        """``code`` of every record, with array passes over all their properties at once."""
        n = len(props)
        if n and props.count(props[0]) == n:  # one property block for all (no keys)
            tags = find_property(props[0], _TAGS)
            out = np.full(n, self._tags_code(tags) if tags else 0, dtype=np.int64)
        elif n <= _FEW_RECORDS:  # array passes cost more than they save on a few records
            found = [find_property(p, _TAGS) for p in props]
            out = np.array([self._tags_code(t) if t else 0 for t in found], dtype=np.int64)
        else:
            out = np.zeros(n, dtype=np.int64)
            lengths = np.fromiter(map(len, props), dtype=np.int64, count=n)
            ends = np.cumsum(lengths)
            joined = b"".join(props)
            data = np.frombuffer(joined, dtype=np.uint8)
            rows, begin, end = last_values(data, ends - lengths, ends,
                                           np.flatnonzero(data == SEGMENT_SEP), _TAGS)
            if len(rows):
                values = list(map(joined.__getitem__, map(slice, begin.tolist(), end.tolist())))
                codes = list(map(self._cache.get, values))
                if None in codes:  # tags not seen before: hashed once each
                    codes = [self._tags_code(v) if c is None else c
                             for v, c in zip(values, codes)]
                out[rows] = codes
        if SCHEDULE_TOPIC in topics:  # due times instead of tags codes: record by record
            for i in [i for i, t in enumerate(topics) if t == SCHEDULE_TOPIC]:
                out[i] = self.code(SCHEDULE_TOPIC, props[i], int(store_timestamps[i]))
        return out


_STOP, _FAILED = -1, -2  # DispatchLoop._step_over: end the batch here / the attempt failed


class DispatchLoop:
    def __init__(self, commit_log, dispatchers, tags_coder: TagsCoder,
                 confirm_offset: Callable[[], int], start_offset: int, *,
                 batch_bytes: int = 4 << 20, after_dispatch: Callable | None = None) -> None:
        self.commit_log = commit_log
        self.dispatchers = dispatchers  # a dispatch.dispatchers.Dispatchers
        self.tags_coder = tags_coder
        self.confirm_offset = confirm_offset
        self.dispatched = start_offset
        # The last record handed to every dispatcher (None: none yet), for ``mqstore.queued``.
        self.last_mark: DispatchMark | None = None
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
        parts, pos = self._gather(begin, end, min(end, begin + self.batch_bytes))
        if pos < 0:
            return 0
        mark = self.last_mark
        if parts:
            batch = DispatchBatch.concat(begin, pos, parts)
            if not self._hand_over(batch, begin):
                return 0
            mark = DispatchMark(int(batch.phys_offsets[-1]), int(batch.sizes[-1]),
                                int(batch.store_timestamps[-1]))
        if self.failing is not None:
            log.warning("dispatch at commit-log offset %d goes on after %d failed attempts",
                        begin, self.failures)
            self.failing, self.failures = None, 0
        moved = pos - begin
        if moved:
            with self.progress:
                self.last_mark = mark
                self.dispatched = pos
                self.progress.notify_all()
        return moved

    def _gather(self, begin: int, end: int, stop: int) -> tuple[list, int]:
        """The columns of the records from ``begin`` (about up to ``stop``; none past the
        visible ``end``), one part per run of records, and where they end; that end is -1
        when damage with no intact record after it stops dispatch (a failed attempt)."""
        parts: list = []
        pos = begin
        while pos < stop:
            seg = self.commit_log.segments.find(pos)
            if seg is None:
                break
            limit = min(seg.committed, end - seg.start)
            wend = self._walk_segment(seg, pos - seg.start, limit, stop - seg.start, parts)
            pos = seg.start + wend
            if wend >= stop - seg.start or wend >= limit:
                break
            pos = self._step_over(seg, pos, wend, limit, end)
            if pos < 0:
                return parts, (-1 if pos == _FAILED else seg.start + wend)
        return parts, pos

    def _walk_segment(self, seg, at: int, limit: int, stop: int, parts: list) -> int:
        """Add the columns of the records of ``seg`` from ``at`` that walk cleanly (below
        ``limit``, about up to ``stop``) to ``parts``; returns where they end."""
        u8 = self._bytes_of(seg)
        rel, wend = walk_runs(seg.mm, u8, at, limit, stop)
        if len(rel):
            cols, n = heads_alike(seg.mm, u8, rel) or heads(u8, rel)
            wrong = np.flatnonzero(cols["phys_offset"] != rel[:n] + seg.start)
            if len(wrong):
                n = int(wrong[0])
                cols = {k: v[:n] for k, v in cols.items()}
            if n < len(rel):
                wend = int(rel[n])
            if n:
                parts.append(self._columns(seg, cols))
        return wend

    def _step_over(self, seg, pos: int, wend: int, limit: int, end: int) -> int:
        """The walk of ``seg`` stopped at ``pos`` (``wend`` in it) before ``limit``: where the
        batch goes on (the next segment after a blank; the next intact record after damage),
        ``_STOP`` to end the batch there, ``_FAILED`` when damage with no intact record
        after it yet fails the attempt."""
        kind, size, _head = scan_record(seg.mm, wend, seg.committed, False, expected_phys=pos)
        if kind == SCAN_BLANK:
            return seg.end
        if kind == SCAN_BAD:
            # Damage below the visible end (recovery mends what it saw at open; this
            # appeared since): step over it to the next intact record, as recovery will.
            nxt = find_record(seg.mm, wend + 1, limit, seg.start, seg.size)
            if nxt is not None or seg.end <= end:
                resume = seg.start + nxt if nxt is not None else seg.end
                log.error("dispatch passes over damaged commit-log bytes [%d, %d): %s",
                          pos, resume, size)
                return resume
            self._failed(pos, CorruptRecordError(
                f"commit-log offset {pos}: {size}; no intact record follows yet"))
            return _FAILED
        if wend + size <= limit:  # valid, visible, yet not walkable: never wait on it
            self.error = f"dispatch cannot read the record at commit-log offset {pos}"
            log.error(self.error)
        return _STOP

    def _hand_over(self, batch: DispatchBatch, begin: int) -> bool:
        """Every dispatcher, then ``after_dispatch``; False when one raised (a failed
        attempt: the batch is retried)."""
        try:
            self.dispatchers.dispatch(batch)
            if self.after_dispatch is not None:
                self.after_dispatch(batch)
        except Exception as exc:
            self._failed(begin, exc)
            return False
        return True

    def _failed(self, begin: int, exc: Exception) -> None:
        self.last_exception = exc
        self.failures += 1
        self.failing = (f"dispatch of the records at commit-log offset {begin} failed "
                        f"{self.failures} time(s): {type(exc).__name__}: {exc}")
        if self.failures == 1 or self.failures % 100 == 0:
            # One line: the failure is retried and reported to the store (a full disk, damage
            # not yet followed by an intact record); the traceback only when debugging.
            log.error("%s; retrying", self.failing)
            if self.failures == 1:
                log.debug("dispatch failure at commit-log offset %d", begin, exc_info=exc)

    def retry_pause_s(self) -> float:
        """Pause before retrying a failed batch: 10 ms, doubling to 1 s."""
        return min(1.0, 0.01 * 2 ** min(self.failures, 7))

    def _bytes_of(self, seg) -> np.ndarray:
        cached = self._u8
        if cached is None or cached[0] is not seg:
            cached = self._u8 = (seg, np.frombuffer(seg.mm, dtype=np.uint8))
        return cached[1]

    def _columns(self, seg, cols: dict) -> dict:
        mm, u8 = seg.mm, self._bytes_of(seg)
        topics = _slices(mm, u8, cols["topic_at"], cols["topic_len"])
        topics = ([self._topic_name(topics[0])] * len(topics) if topics.count(topics[0]) == len(
            topics) else list(map(self._topic_name, topics)))
        props = _slices(mm, u8, cols["props_at"], cols["props_len"])
        cols["topics"] = topics
        cols["properties"] = props
        cols["tags_code"] = self.tags_coder.codes(topics, props, cols["store_timestamp"])
        return cols

    def _topic_name(self, raw: bytes) -> str:
        topic = self._topic_names.get(raw)
        if topic is None:
            topic = self._topic_names[raw] = raw.decode("utf-8", errors="replace")
        return topic

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

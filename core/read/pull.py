"""Serving pulls: RocketMQ's getMessage status and batch rules (spec 10.6), on numpy windows.

One call reads at most one consume-queue file and at most ``max(max_filter_bytes,
max_msgs*20)`` bytes of units. Tag codes of the whole window are matched at once; only the
candidates are read from the commit log and checked exactly. Nothing is served unchecked
(``format.verify``): a unit whose record is damaged, belongs elsewhere, or was lost is passed
over and reported in ``GetResult.corrupt``, as the next offset moves past it. Before a unit
is passed over, the record of its offset is looked for in the commit log between the records of
the nearest intact units around it (``rescue``): when found it is served, and the damaged unit
is still reported in ``GetResult.corrupt``.
"""

from __future__ import annotations

import logging
from typing import Callable, NamedTuple

import numpy as np

from mqstore.read import served_rows
from mqstore.read.segment_runs import RUN_FROM, ColumnRuns
from mqstore.errors import CorruptRecordError
from mqstore.plugin_api.filtering import MATCH_ALL
from mqstore.format.cq_ext import bitmap_matches
from mqstore.format.cq_unit import CQ_UNIT_SIZE, EXT_ADDRESS_MAX, FILLER_SIZE
from mqstore.format.verify import verify_queue_record
from mqstore.message import GetResult, GetStatus, StoredMessage
from mqstore.read.unit_rescue import rescue, warn_once

log = logging.getLogger(__name__)
MAX_PULL_BYTES = 128 * 1024 * 1024
_MIN_RECORD = served_rows.MIN_RECORD


class PullLimits:
    __slots__ = ("window_bytes", "mem_bytes", "mem_count", "disk_bytes", "disk_count",
                 "in_memory_bytes", "correct", "batch")

    def __init__(self, cfg, physical_memory_bytes: int, slave_no_check) -> None:
        """``slave_no_check``: whether the store keeps consumers' offsets now (a slave with
        ``get.offset_check_in_slave`` false), a bool or a callable asked at each pull (the
        role changes at run time: ``mqstore.roles``)."""
        self.window_bytes = cfg.max_filter_bytes
        self.mem_bytes = cfg.max_transfer_bytes_in_memory
        self.mem_count = cfg.max_transfer_count_in_memory
        self.disk_bytes = cfg.max_transfer_bytes_on_disk
        self.disk_count = cfg.max_transfer_count_on_disk
        self.in_memory_bytes = physical_memory_bytes * cfg.access_in_memory_max_ratio // 100
        # A slave that does not check offsets keeps the consumer's offset unchanged.
        if callable(slave_no_check):
            self.correct = lambda old, new: old if slave_no_check() else new
        else:
            self.correct = (lambda old, new: old) if slave_no_check else (lambda old, new: new)
        self.batch = self._batch()

    def _batch(self) -> tuple:
        """isTheBatchFull's figures for a pull without a byte cap of its own, read at once."""
        return (self.in_memory_bytes, min(self.mem_bytes, MAX_PULL_BYTES), self.mem_count,
                min(self.disk_bytes, MAX_PULL_BYTES), self.disk_count)

    def bulk_limits(self) -> "PullLimits":
        """The limits of a bulk read: only its own count and bytes. getMessage's transfer
        limits (32 messages from memory, 8 from disk) size a network response; a read in the
        reader's own process has no response to size."""
        bulk = object.__new__(PullLimits)
        for name in self.__slots__:
            setattr(bulk, name, getattr(self, name))
        bulk.mem_bytes = bulk.disk_bytes = MAX_PULL_BYTES
        bulk.mem_count = bulk.disk_count = 1 << 62
        bulk.batch = bulk._batch()
        return bulk


def _window_mask(units, flt, ext_loader, bloom):
    """Which units of a window may match: tag codes (extension addresses resolved first), and
    for a registered SQL92 subscription its bloom bits. None: every unit may."""
    codes = units["tags_code"]
    is_ext = codes <= EXT_ADDRESS_MAX
    if not is_ext.any():
        return flt.match_units(codes)
    ext = ext_loader() if ext_loader is not None else None
    if ext is None:  # addresses without their extension: only the exact check can decide
        mask = flt.match_units(np.where(is_ext, 0, codes))
        return None if mask is None else np.asarray(mask, dtype=bool) | is_ext
    present, real, times, bitmaps = ext.resolve(codes[is_ext])
    codes = codes.astype(np.int64)
    codes[is_ext] = real
    mask = flt.match_units(codes)
    mask = np.ones(len(codes), dtype=bool) if mask is None else np.asarray(mask, dtype=bool)
    ext_ok = mask[is_ext]
    if bloom is not None:
        positions, registered_at = bloom
        ext_ok &= bitmap_matches(bitmaps, positions) | (times <= registered_at)
    ext_ok |= ~present  # an unreadable extension unit is left to the exact check
    mask[is_ext] = ext_ok
    return mask


def _first_full(i: int, c: int, n: int, total: int, sizes, in_mem, max_msgs: int,
                max_pull: int, limits: PullLimits) -> int:
    """First unit in ``[i, c)`` at which a batch of ``n`` messages / ``total`` bytes counts
    as full (RocketMQ's isTheBatchFull), or -1."""
    if n + 1 > max_msgs:
        return i
    sz = total + sizes[i:c]
    mem = in_mem[i:c]
    full = (sz > max_pull) | np.where(mem, (sz > limits.mem_bytes) | (n >= limits.mem_count),
                                      (sz > limits.disk_bytes) | (n >= limits.disk_count))
    hit = np.flatnonzero(full)
    return i + int(hit[0]) if len(hit) else -1


class PullRequest(NamedTuple):
    offset: int
    max_msgs: int
    flt: object  # contracts.Filter
    max_total_bytes: int | None = None
    ext_loader: Callable | None = None  # the queue's extension, loaded on first use
    bitmap: tuple | None = None  # (bloom positions, registered at) of a registered subscription
    verify_crc: bool = True  # bodies are checked against their CRC before they are served


def _out_of_range(offset: int, min_off: int, max_off: int, correct) -> GetResult | None:
    """RocketMQ's answers for an offset outside ``[min, max)`` (or an empty queue)."""
    if max_off == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, correct(offset, 0), min_off, max_off)
    if offset < min_off:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, correct(offset, min_off), min_off, max_off)
    if offset == max_off:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, correct(offset, offset), min_off, max_off)
    if offset > max_off:
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, correct(offset, max_off), min_off, max_off)
    return None


def get_messages(commit_log, cq, req: PullRequest, limits: PullLimits) -> GetResult:
    """RocketMQ's getMessage: the messages as objects."""
    scan = scan_queue(commit_log, cq, req, limits)
    if isinstance(scan, GetResult):
        return scan
    result = scan.finish()
    result.messages = served_rows.messages(scan.parts, scan.topic)
    return result


def scan_queue(commit_log, cq, req: PullRequest, limits: PullLimits):
    """Walk the queue from ``req.offset`` by getMessage's rules: the finished ``_Scan`` (its
    ``parts`` hold the rows served), or a GetResult when nothing could be read."""
    offset = req.offset
    # The queue's bounds before the log's end: a unit is dispatched only after its record is
    # written, so every unit below max_offset points below the log's end read after.
    min_off, max_off = (cq.min_offset, cq.max_offset) if cq is not None else (0, 0)
    early = _out_of_range(offset, min_off, max_off, limits.correct)
    if early is not None:
        return early
    scan = _Scan(commit_log, cq, req, limits, min_off, max_off)
    seg = cq.segments.find(offset * CQ_UNIT_SIZE)
    first = offset * CQ_UNIT_SIZE - seg.start if seg is not None else 0
    if seg is None or first >= seg.wrote:
        return _found_null(scan.result, cq, offset, limits.correct)
    begin_unit = first // CQ_UNIT_SIZE
    window_units = -(-max(limits.window_bytes, req.max_msgs * CQ_UNIT_SIZE) // CQ_UNIT_SIZE)
    count = min(seg.wrote // CQ_UNIT_SIZE - begin_unit, scan.result.max_offset - offset,
                window_units)
    all_units = cq.units_of(seg)[begin_unit:begin_unit + count]
    # Units are converted in growing chunks: a plain pull stops after max_msgs, long before
    # the window; a filtered one may need the whole window.
    chunk = max(req.max_msgs + 1, 64) if req.flt is MATCH_ALL else count
    c0 = 0
    while c0 < count:
        units = all_units[c0:c0 + chunk]
        if not scan.take(units, c0):
            break
        c0, chunk = c0 + len(units), chunk * 4  # a filtered scan widens fast
    scan.done()
    return scan


def _found_null(result: GetResult, cq, offset: int, correct) -> GetResult:
    """The offset is in range but its unit is not written (or its file is gone): the consumer
    is sent on to the next consume-queue file."""
    result.status = GetStatus.OFFSET_FOUND_NULL
    nxt = (offset * CQ_UNIT_SIZE // cq.file_bytes + 1) * cq.file_bytes // CQ_UNIT_SIZE
    result.next_begin_offset = correct(offset, nxt)
    return result


class _Scan(ColumnRuns):
    """One pull's walk over its window: the rows served so far (``parts``), where the next
    pull begins, and the commit-log segment last read (consecutive units mostly share it).

    A chunk of units is cut at commit-log segment ends (``pull_runs``); a run is served
    column-wise (``_take_columns``) when every unit in it is an ordinary reference into one
    readable segment and every candidate record checks out; anything else (fillers, removed
    records, the unit of a damaged record) is walked unit by unit, which reports each problem.
    Both follow the same rules, so they serve the same rows.
    """

    __slots__ = ("result", "parts", "slow", "codes", "n", "flt", "req", "limits", "max_msgs",
                 "max_pull", "max_py", "mem_limit", "topic", "queue_id", "find_segment",
                 "seg_bytes", "log_seg", "log_start", "log_end", "total", "nxt",
                 "max_phys_pulling", "next_phys_file_start", "base", "positions", "gap_sizes",
                 "gap_in_mem", "gap_hint", "commit_log", "cq")

    def __init__(self, commit_log, cq, req: PullRequest, limits: PullLimits, min_off: int,
                 max_off: int) -> None:
        self.result = GetResult(GetStatus.NO_MATCHED_MESSAGE, req.offset, min_off, max_off)
        self.max_py = commit_log.max_offset
        self.topic, self.queue_id = cq.topic.encode(), cq.queue_id
        mtb = req.max_total_bytes
        self.max_pull = MAX_PULL_BYTES if mtb is None else min(max(mtb, 100), MAX_PULL_BYTES)
        self.parts: list = []
        self.slow: served_rows.Walked | None = None  # the rows the unit-by-unit walk adds to
        self.codes: list = []
        self.n = 0
        self.req, self.flt, self.max_msgs, self.limits = req, req.flt, req.max_msgs, limits
        self.mem_limit = limits.in_memory_bytes
        self.find_segment = commit_log.segments.find
        self.seg_bytes = commit_log.segment_bytes
        self.log_seg = None
        self.log_start = self.log_end = 0
        self.total = self.max_phys_pulling = 0
        self.next_phys_file_start = self.bad_row = -1
        self.nxt = req.offset
        self.commit_log, self.cq = commit_log, cq

    def done(self) -> None:
        result = self.result
        result.next_begin_offset = self.nxt
        result.suggest_pulling_from_slave = self.max_py - self.max_phys_pulling > self.mem_limit

    def finish(self) -> GetResult:
        return self.result

    def take(self, units, c_start: int) -> bool:
        """Serve one chunk of units (``c_start`` units into the window): its runs inside one
        commit-log segment column-wise, the units between them by the walk; False once the
        batch is full, which ends the pull."""
        base = self.req.offset + c_start
        mask = _window_mask(units, self.flt, self.req.ext_loader, self.req.bitmap)
        pos, sizes, pieces = self._pieces(units)
        pieces.reverse()
        while pieces:
            i, j, columns = pieces.pop()
            if i == j:
                continue
            self.base = base + i
            whole = i == 0 and j == len(units)
            piece = units if whole else units[i:j]
            piece_mask = mask if whole or mask is None else mask[i:j]
            served = self._take_columns(piece, pos[i:j], sizes[i:j], piece_mask) if (
                columns) else None
            if served is None and columns and self.bad_row >= 0:
                # Only the unit of the record that fails is walked (which says why); the
                # rows around it stay column-wise.
                bad = i + self.bad_row
                pieces += [(bad + 1, j, j - bad - 1 >= RUN_FROM), (bad, bad + 1, False),
                           (i, bad, bad - i >= RUN_FROM)]
                continue
            if served is None:
                served = self._walk(piece, piece_mask)
            if not served:
                return False
        return True

    def _walk(self, units, mask) -> bool:
        """Serve units one by one (``mask``: those that may match, None for all); False once
        the batch is full."""
        self.slow = None
        self.codes = units["tags_code"].tolist()
        self.positions = positions = units["phys_offset"].tolist()
        sizes = units["size"].tolist()
        visit = self.visit
        if mask is None:
            if self.flt is MATCH_ALL:
                return self._walk_plain(positions, sizes)
            for c in range(len(positions)):
                if visit(c, positions[c], sizes[c]):
                    return False
            return True
        # Only candidates are visited one by one; a run of rejected units is consumed at
        # once, after checking (vectorized) whether the batch would have filled inside it.
        self._prepare_gaps(units)
        skip = self.skip
        i = 0
        for c in np.flatnonzero(mask).tolist():
            if c > i and skip(i, c):
                return False
            if visit(c, positions[c], sizes[c]):
                return False
            i = c + 1
        return not (len(positions) > i and skip(i, len(positions)))

    # -- unit by unit ---------------------------------------------------------------------
    def _prepare_gaps(self, units) -> None:
        limits = self.limits
        self.gap_sizes = sizes = units["size"].astype(np.int64)
        self.gap_in_mem = (self.max_py - units["phys_offset"]) <= self.mem_limit
        # While the batch plus the chunk's biggest unit stays below every byte and count
        # limit, no rejected unit can fill it and the vectorized check is skipped.
        self.gap_hint = (int(sizes.max()),
                         min(limits.mem_bytes, limits.disk_bytes, self.max_pull),
                         min(limits.mem_count, limits.disk_count))

    def skip(self, i: int, c: int) -> bool:
        """Pass over the rejected units ``[i, c)`` of the chunk; True when the batch counts
        as full inside them (the next pull then begins at the unit that filled it)."""
        n = self.n
        if n:
            biggest, small_bytes, small_count = self.gap_hint
            if n + 1 > self.max_msgs or n >= small_count or self.total + biggest > small_bytes:
                stop = _first_full(i, c, n, self.total, self.gap_sizes, self.gap_in_mem,
                                   self.max_msgs, self.max_pull, self.limits)
                if stop >= 0:
                    if stop > i:
                        self.max_phys_pulling = self.positions[stop - 1]
                        self.nxt = self.base + stop
                    return True
        positions = self.positions
        self.max_phys_pulling = positions[c - 1]
        self.nxt = self.base + c
        if not n and max(positions[i:c]) >= self.next_phys_file_start:
            self.result.status = GetStatus.NO_MATCHED_MESSAGE
        return False

    def _walk_plain(self, positions: list, sizes: list) -> bool:
        """``visit`` for every unit of a chunk pulled with no filter, its usual case inlined
        (an intact record in the segment last read, with room for it in the batch): this
        loop runs once per message of a plain ``get``. Any other unit goes through ``visit``,
        which says what is wrong with it."""
        topic, queue_id, base = self.topic, self.queue_id, self.base
        max_msgs, max_pull, max_py, mem_limit = self.max_msgs, self.max_pull, self.max_py, \
            self.mem_limit
        limits, codes = self.limits, self.codes
        crc_range = self.commit_log.crc_range
        mem_bytes, mem_count = limits.mem_bytes, limits.mem_count
        disk_bytes, disk_count = limits.disk_bytes, limits.disk_count
        walked = None
        n, total = self.n, self.total
        for c in range(len(positions)):
            pos, size = positions[c], sizes[c]
            log_seg = self.log_seg
            if (size >= _MIN_RECORD and size != FILLER_SIZE and pos >= 0
                    and pos >= self.next_phys_file_start and log_seg is not None
                    and self.log_start <= pos and pos + size <= self.log_end):
                if n:
                    with_it = total + size
                    if n + 1 > max_msgs or with_it > max_pull or (
                            with_it > mem_bytes or n >= mem_count if max_py - pos <= mem_limit
                            else with_it > disk_bytes or n >= disk_count):
                        break
                at = pos - self.log_start
                try:
                    raw = log_seg.mm[at:at + size]
                    lay = verify_queue_record(raw, pos, size, topic, queue_id, base + c,
                                              crc_range)
                except ValueError:  # damaged, or closed by cleanup: the walk says which
                    lay = None
                if lay is not None:
                    if walked is None:
                        walked = self.slow
                        if walked is None:
                            walked = self.slow = served_rows.Walked()
                            self.parts.append(walked)
                    walked.append(StoredMessage(raw, lay))
                    walked.codes.append(codes[c])
                    n += 1
                    total += size
                    self.max_phys_pulling = pos
                    self.nxt = base + c + 1
                    continue
            self.n, self.total = n, total
            full = self.visit(c, pos, size)
            n, total = self.n, self.total
            if full:
                if walked is not None:
                    self.result.status = GetStatus.FOUND
                return False
        else:
            c = len(positions)
        # Full before unit c, or at the chunk's end: what was served in this loop is FOUND
        # (the pull's first message may have been served here, not by ``visit``).
        self.n, self.total = n, total
        if walked is not None:
            self.result.status = GetStatus.FOUND
        return c == len(positions)

    def visit(self, c: int, pos: int, size: int) -> bool:
        """Serve or pass over the candidate unit ``c`` of the chunk; True when the batch is
        full before it (it is then left for the next pull)."""
        if size == FILLER_SIZE or pos < 0 or size <= 0:
            # A placeholder for an offset whose message was lost, or a damaged unit.
            if size != FILLER_SIZE:
                got = self._rescue(self.base + c, pos, f"damaged unit (size {size})")
                if got is not None:
                    return self._serve_rescued(c, got)
            self.max_phys_pulling = max(self.max_phys_pulling, pos)
            self.nxt = self.base + c + 1
            _pass_over(self.result, self.n, self.nxt - 1, pos,
                       "no message is stored at this offset"
                       if size == FILLER_SIZE else f"damaged unit (size {size})")
            return False
        n = self.n
        if n:  # the first message is always accepted; later ones only while the batch has room
            total, limits = self.total + size, self.limits
            if n + 1 > self.max_msgs or total > self.max_pull or (
                    total > limits.mem_bytes or n >= limits.mem_count
                    if self.max_py - pos <= self.mem_limit
                    else total > limits.disk_bytes or n >= limits.disk_count):
                return True
        old_phys = self.max_phys_pulling
        self.max_phys_pulling = pos
        self.nxt = nxt = self.base + c + 1
        if pos < self.next_phys_file_start:
            return False
        # The record, from the segment last read (inline: this runs once per message).
        log_seg = self.log_seg
        if log_seg is None or not self.log_start <= pos < self.log_end:
            log_seg = self._segment_of(pos)
        raw = None
        if log_seg is not None and pos + size <= self.log_end:
            at = pos - self.log_start
            try:
                raw = log_seg.mm[at:at + size]
            except ValueError:  # cleanup closed the segment since it was looked up
                raw = None
        if raw is None and (pos + size > self.max_py or (
                log_seg is not None and pos + size > log_seg.start + self.seg_bytes)):
            # Past the end of the log (read after the queue's bounds) or across a segment's
            # end, where no record lies: the unit is damaged, not its segment removed.
            why = f"damaged unit (commit-log bytes [{pos}, {pos + size}) past the end of " + (
                f"the log, {self.max_py})" if pos + size > self.max_py else "their segment)")
            got = self._rescue(nxt - 1, pos, why)
            if got is not None:
                self.max_phys_pulling, self.nxt = old_phys, nxt - 1
                return self._serve_rescued(c, got)
            self.max_phys_pulling = old_phys
            _pass_over(self.result, n, nxt - 1, pos, why)
            return False
        if raw is None:
            if not n:
                self.result.status = GetStatus.MESSAGE_WAS_REMOVING
            self.next_phys_file_start = pos + self.seg_bytes - pos % self.seg_bytes
            return False
        try:
            lay = verify_queue_record(raw, pos, size, self.topic, self.queue_id, nxt - 1,
                                      self.commit_log.crc_range)
        except CorruptRecordError as exc:
            got = self._rescue(nxt - 1, pos, str(exc))
            if got is None:
                _pass_over(self.result, n, nxt - 1, pos, str(exc))
                return False
            self.max_phys_pulling, self.nxt = old_phys, nxt - 1
            return self._serve_rescued(c, got)
        return self._serve(c, StoredMessage(raw, lay), size)

    def _rescue(self, offset: int, pos: int, why: str):
        """The record of queue ``offset`` found in the commit log for its damaged unit
        (``rescue``), reported in ``corrupt`` with ``why``; None when it is not found."""
        cq = self.cq
        if cq is None:
            return None
        got = rescue(self.commit_log, cq, self.topic, offset)
        if got is None:
            return None
        found = got[2]
        note = (f"{why}; served the record of queue offset {offset} found in the commit log "
                f"at offset {found}")
        self.result.corrupt.append((offset, pos, note))
        warn_once(cq, offset, pos, why)
        return got

    def _serve_rescued(self, c: int, got) -> bool:
        """Serve the record ``rescue`` found for unit ``c``; True when the batch is full
        before it (as ``visit``)."""
        raw, lay, found = got
        size = len(raw)
        n = self.n
        if n:
            total, limits = self.total + size, self.limits
            if n + 1 > self.max_msgs or total > self.max_pull or (
                    total > limits.mem_bytes or n >= limits.mem_count
                    if self.max_py - found <= self.mem_limit
                    else total > limits.disk_bytes or n >= limits.disk_count):
                self.result.corrupt.pop()  # reported again by the pull that serves it
                return True
        self.max_phys_pulling = max(self.max_phys_pulling, found)
        self.nxt = self.base + c + 1
        return self._serve(c, StoredMessage(raw, lay), size)

    def _serve(self, c: int, msg: StoredMessage, size: int) -> bool:
        n = self.n
        if not self.flt.match_message(msg):
            if not n:
                self.result.status = GetStatus.NO_MATCHED_MESSAGE
            self.result.filtered_count += 1
            return False
        slow = self.slow
        if slow is None:
            slow = self.slow = served_rows.Walked()
            self.parts.append(slow)
        slow.append(msg)
        slow.codes.append(self.codes[c])
        self.n = n + 1
        self.total += size
        self.result.status = GetStatus.FOUND
        return False

    def _segment_of(self, pos: int):
        """The commit-log segment holding ``pos``, remembered with its readable end (read
        once per segment per pull); None when it is gone."""
        self.log_seg = log_seg = self.find_segment(pos)
        if log_seg is not None:
            self.log_start, self.log_end = log_seg.start, log_seg.start + log_seg.committed
        return log_seg


def _pass_over(result: GetResult, served: int, queue_offset: int, phys_offset: int,
               why: str) -> None:
    if not served:
        result.status = GetStatus.NO_MATCHED_MESSAGE
    result.corrupt.append((queue_offset, phys_offset, why))
    log.warning("pull passes over queue offset %d: %s", queue_offset, why)

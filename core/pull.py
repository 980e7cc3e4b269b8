"""Serving pulls: RocketMQ's getMessage status and batch rules (spec 10.6), on numpy windows.

One call reads at most one consume-queue file and at most ``max(max_filter_bytes,
max_msgs*20)`` bytes of units. Tag codes of the whole window are matched at once; only the
candidates are read from the commit log and checked exactly. Nothing is served unchecked
(``format.verify``): a unit whose record is damaged, belongs elsewhere, or was lost is passed
over and reported in ``GetResult.corrupt``, as the next offset moves past it.
"""

from __future__ import annotations

import logging

import numpy as np

from mqstore.errors import CorruptRecordError
from mqstore.filtering import MATCH_ALL
from mqstore.format.cq_ext import bitmap_matches
from mqstore.format.cq_unit import CQ_UNIT_SIZE, EXT_ADDRESS_MAX, FILLER_SIZE
from mqstore.format.verify import verify_queue_record
from mqstore.message import GetResult, GetStatus, StoredMessage

log = logging.getLogger("mqstore.pull")
MAX_PULL_BYTES = 128 * 1024 * 1024


class PullLimits:
    __slots__ = ("window_bytes", "mem_bytes", "mem_count", "disk_bytes", "disk_count",
                 "in_memory_bytes", "correct")

    def __init__(self, cfg, physical_memory_bytes: int, slave_no_check: bool) -> None:
        self.window_bytes = cfg.max_filter_bytes
        self.mem_bytes = cfg.max_transfer_bytes_in_memory
        self.mem_count = cfg.max_transfer_count_in_memory
        self.disk_bytes = cfg.max_transfer_bytes_on_disk
        self.disk_count = cfg.max_transfer_count_on_disk
        self.in_memory_bytes = physical_memory_bytes * cfg.access_in_memory_max_ratio // 100
        # A slave that does not check offsets keeps the consumer's offset unchanged.
        self.correct = (lambda old, new: old) if slave_no_check else (lambda old, new: new)


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


def get_messages(store, cq, offset: int, max_msgs: int, flt, limits: PullLimits,
                 max_total_bytes: int | None = None, ext_loader=None, bloom=None) -> GetResult:
    correct = limits.correct
    min_off = cq.min_offset if cq is not None else 0
    max_off = cq.max_offset if cq is not None else 0
    if max_off == 0:
        return GetResult(GetStatus.NO_MESSAGE_IN_QUEUE, correct(offset, 0), min_off, max_off)
    if offset < min_off:
        return GetResult(GetStatus.OFFSET_TOO_SMALL, correct(offset, min_off), min_off, max_off)
    if offset == max_off:
        return GetResult(GetStatus.OFFSET_OVERFLOW_ONE, correct(offset, offset), min_off, max_off)
    if offset > max_off:
        return GetResult(GetStatus.OFFSET_OVERFLOW_BADLY, correct(offset, max_off), min_off, max_off)

    commit_log = store.commit_log
    max_py = commit_log.max_offset
    topic, queue_id = cq.topic.encode(), cq.queue_id
    max_pull = MAX_PULL_BYTES if max_total_bytes is None else min(max(max_total_bytes, 100), MAX_PULL_BYTES)
    window_units = -(-max(limits.window_bytes, max_msgs * CQ_UNIT_SIZE) // CQ_UNIT_SIZE)
    result = GetResult(GetStatus.NO_MATCHED_MESSAGE, offset, min_off, max_off)

    seg = cq.segments.find(offset * CQ_UNIT_SIZE)
    first = offset * CQ_UNIT_SIZE - seg.start if seg is not None else 0
    if seg is None or first >= seg.wrote:
        result.status = GetStatus.OFFSET_FOUND_NULL
        nxt = (offset * CQ_UNIT_SIZE // cq.file_bytes + 1) * cq.file_bytes // CQ_UNIT_SIZE
        result.next_begin_offset = correct(offset, nxt)
        return result

    begin_unit = first // CQ_UNIT_SIZE
    count = min(seg.wrote // CQ_UNIT_SIZE - begin_unit, max_off - offset, window_units)
    all_units = cq.units_of(seg)[begin_unit:begin_unit + count]
    # Units are converted in growing chunks: a plain pull stops after max_msgs, long before
    # the window; a filtered one may need the whole window.
    chunk = max(max_msgs + 1, 64) if flt is MATCH_ALL else count

    mem_limit = limits.in_memory_bytes
    find_segment = commit_log.segments.find
    log_seg = None
    log_start = log_end = 0
    messages = result.messages
    total = 0
    next_phys_file_start = -1
    max_phys_pulling = 0
    seg_bytes = commit_log.segment_bytes
    nxt = offset
    done = False
    c0 = 0
    while c0 < count:
        units = all_units[c0:c0 + chunk]
        c_start, c0, chunk = c0, c0 + len(units), chunk * 4  # a filtered scan widens fast
        positions = units["phys_offset"].tolist()
        sizes = units["size"].tolist()
        width = len(positions)
        mask = _window_mask(units, flt, ext_loader, bloom)
        if mask is None:
            candidates = range(width)
        else:
            # Only candidates are visited one by one; a run of rejected units is consumed at
            # once, after checking (vectorized) whether the batch would have filled inside it.
            candidates = np.flatnonzero(mask).tolist()
            gap_sizes = units["size"].astype(np.int64)
            gap_in_mem = (max_py - units["phys_offset"]) <= mem_limit
            biggest = int(gap_sizes.max())  # below every byte limit: no gap unit can fill it
            small_bytes = min(limits.mem_bytes, limits.disk_bytes, max_pull)
            small_count = min(limits.mem_count, limits.disk_count)
        i = 0
        for c in (*candidates, width):
            if c > i:
                n = len(messages)
                if n and (n + 1 > max_msgs or n >= small_count or total + biggest > small_bytes):
                    stop = _first_full(i, c, n, total, gap_sizes, gap_in_mem,
                                       max_msgs, max_pull, limits)
                    if stop >= 0:
                        if stop > i:
                            max_phys_pulling = positions[stop - 1]
                            nxt = offset + c_start + stop
                        done = True
                        break
                max_phys_pulling = positions[c - 1]
                nxt = offset + c_start + c
                if not messages and max(positions[i:c]) >= next_phys_file_start:
                    result.status = GetStatus.NO_MATCHED_MESSAGE
            if c == width:
                break
            i = c + 1
            pos = positions[c]
            size = sizes[c]
            if size == FILLER_SIZE or pos < 0 or size <= 0:
                # A placeholder for an offset whose message was lost, or a damaged unit.
                max_phys_pulling = max(max_phys_pulling, pos)
                nxt = offset + c_start + c + 1
                _pass_over(result, nxt - 1, pos, "no message is stored at this offset"
                           if size == FILLER_SIZE else f"damaged unit (size {size})")
                continue
            if messages:  # the first message is always accepted
                n = len(messages)
                if n + 1 > max_msgs or total + size > max_pull:
                    done = True
                    break
                if max_py - pos <= mem_limit:
                    if total + size > limits.mem_bytes or n >= limits.mem_count:
                        done = True
                        break
                elif total + size > limits.disk_bytes or n >= limits.disk_count:
                    done = True
                    break
            max_phys_pulling = pos
            nxt = offset + c_start + c + 1
            if pos < next_phys_file_start:
                continue
            if log_seg is None or not log_start <= pos < log_end:
                log_seg = find_segment(pos)
                if log_seg is not None:  # one read of the readable end per segment per call
                    log_start, log_end = log_seg.start, log_seg.start + log_seg.committed
            at = pos - log_start if log_seg is not None else 0
            if log_seg is None or pos + size > log_end:
                if not messages:
                    result.status = GetStatus.MESSAGE_WAS_REMOVING
                next_phys_file_start = pos + seg_bytes - pos % seg_bytes
                continue
            raw = log_seg.mm[at:at + size]
            try:
                lay = verify_queue_record(raw, pos, size, topic, queue_id, nxt - 1)
            except CorruptRecordError as exc:
                _pass_over(result, nxt - 1, pos, str(exc))
                continue
            msg = StoredMessage(raw, lay)
            if not flt.match_message(msg):
                if not messages:
                    result.status = GetStatus.NO_MATCHED_MESSAGE
                result.filtered_count += 1
                continue
            messages.append(msg)
            total += size
            result.status = GetStatus.FOUND
        if done:
            break
    result.next_begin_offset = nxt
    result.suggest_pulling_from_slave = max_py - max_phys_pulling > mem_limit
    return result


def _pass_over(result: GetResult, queue_offset: int, phys_offset: int, why: str) -> None:
    if not result.messages:
        result.status = GetStatus.NO_MATCHED_MESSAGE
    result.corrupt.append((queue_offset, phys_offset, why))
    log.warning("pull passes over queue offset %d: %s", queue_offset, why)

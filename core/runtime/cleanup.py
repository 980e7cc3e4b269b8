"""Cleanup: deleting old commit-log segments and the derived files that follow them.

One job, three steps, each done by the owner of the files it touches:

1. The store process decides (the ``cleanup.policy`` plugin, every ``cleanup.interval_ms``, on
   the store clock) and deletes expired commit-log segments: it owns the commit log. Before a
   segment goes, the consume queues it reads stop offering the units that point into it.
2. The dispatch loop's process (the dispatch worker, or the store process with
   ``dispatch.worker: thread``) owns the consume queues and the dispatchers' files: it drops
   the files wholly below the new minimum (``drop_derived``), then runs ``after_cleanup``.
3. It acknowledges on the cleanup channel; ``delete_expired_segments`` returns after that.

A segment's age is that of its newest record, measured on the store clock. Store times never
go backwards in log order, so the first record of the next segment is as new or newer: a
segment is expired once that record is older than the reserved time (a bound that never
deletes early, and needs no file times).
"""

from __future__ import annotations

import math
import os

from mqstore.plugin_api.cleanup import DiskUsage, watermark_passed  # noqa: F401 - re-exported
from mqstore.read.time_search import store_time_at


def disk_used_ratio(path: str) -> DiskUsage:
    """RocketMQ's ``getDiskPartitionSpaceUsedPercent``: used / (used + available to users),
    rounded up to a whole percent."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = st.f_bavail * st.f_frsize
    if used + usable <= 0:
        return DiskUsage(-1.0, 0, 0)
    return DiskUsage(math.ceil(100 * used / (used + usable)) / 100, used + usable, usable)


def expired_count(commit_log, now_ms: int, reserved_ms: int, max_segments: int,
                  keep_from_phys: int = -1) -> int:
    """How many of the oldest segments (never the newest) may go: all of the first
    ``max_segments`` with ``reserved_ms`` 0, else those whose records are all older than
    ``reserved_ms``, stopping at the first that must stay (no segment is skipped); none that
    holds bytes at or above ``keep_from_phys`` (when >= 0)."""
    segs = commit_log.segments.segments
    count = 0
    for seg, after in list(zip(segs, segs[1:]))[:max_segments]:
        if 0 <= keep_from_phys < after.start:
            break
        if reserved_ms:
            newer = store_time_at(commit_log, after.start)
            if newer < 0 or newer + reserved_ms > now_ms:
                break
        count += 1
    return count


def drop_derived(view, dispatchers, hooks, min_phys: int) -> list[str]:
    """Step 2: consume-queue files and dispatchers' files below ``min_phys``, then the
    ``after_cleanup`` hook; returns the deleted paths."""
    removed: list[str] = []
    for cq in list(view.consume_queues.values()):
        removed += cq.delete_files_below(min_phys)
    removed += dispatchers.drop_below(min_phys)
    hooks.after_cleanup(min_phys)
    return removed

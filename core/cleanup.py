"""When commit-log segments go: RocketMQ's CleanCommitLogService decision (spec 10.10).

Pure policy: the flush worker calls ``decide`` every ``cleanup.interval_ms`` and the store
process carries the decision out (``MessageStore.delete_expired_segments``), because the store
owns the maps and the consume queues that must follow the new minimum offset.
"""

from __future__ import annotations

import math
import os
from typing import NamedTuple

from mqstore.config import parse_hours


class Decision(NamedTuple):
    delete: bool  # run a deletion pass now
    at_once: bool  # delete the oldest segments whatever their age
    disk_full: bool | None  # set (True) or clear (False) DISK_FULL; None leaves it as it is


def disk_used_ratio(path: str) -> float:
    """RocketMQ's ``getDiskPartitionSpaceUsedPercent``: used / (used + available to users),
    rounded up to a whole percent."""
    st = os.statvfs(path)
    used = (st.f_blocks - st.f_bfree) * st.f_frsize
    usable = st.f_bavail * st.f_frsize
    if used + usable <= 0:
        return -1.0
    return math.ceil(100 * used / (used + usable)) / 100


def decide(cfg, local_hour: int, used: float) -> Decision:
    """``cfg`` is the ``cleanup`` config section; ``used`` a fraction from disk_used_ratio."""
    time_up = local_hour in parse_hours(cfg.delete_when)
    immediately = False
    disk_full: bool | None = None
    if used > cfg.disk_warning_ratio / 100:
        disk_full = immediately = space = True
    elif used > cfg.disk_forcibly_ratio / 100:
        immediately = space = True  # DISK_FULL stays until use is back under this ratio
    else:
        disk_full = False
        space = used < 0 or used > cfg.disk_max_used_ratio / 100
    return Decision(time_up or space, cfg.clean_forcibly and immediately, disk_full)

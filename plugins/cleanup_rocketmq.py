"""RocketMQ's cleanup rule (``cleanup.policy: rocketmq``), CleanCommitLogService (spec 10.10).

Segments go at the delete hours (``cleanup.delete_when``) once their newest record is older than
``cleanup.file_reserved_hours``, or at any hour while the disk is over
``cleanup.disk_max_used_ratio``. Over ``disk_forcibly_ratio`` (and with ``clean_forcibly``) the
oldest go whatever their age; over ``disk_warning_ratio`` puts are refused (DISK_FULL) until use
is back under ``disk_forcibly_ratio``. A ratio given as a byte amount is a free-space watermark
(``mqstore.plugin_api.watermark_passed``).
"""

from __future__ import annotations

import time

from mqstore.plugin_api import CleanupDecision, hookimpl, parse_hours
from mqstore.plugin_api import watermark_passed as _over

HOUR_MS = 3_600_000


class RocketMQCleanup:
    def __init__(self, config) -> None:
        self.cfg = config.cleanup
        self.hours = parse_hours(self.cfg.delete_when)
        self.reserved_ms = int(self.cfg.file_reserved_hours * HOUR_MS)

    def over_forcibly(self, disk_used: float) -> bool:
        """Over the forced-clean watermark (the oldest segments go whatever their age)."""
        return _over(self.cfg.disk_forcibly_ratio, disk_used)

    def decide(self, now_ms: int, disk_used: float) -> CleanupDecision:
        cfg = self.cfg
        time_up = time.localtime(now_ms / 1000).tm_hour in self.hours
        immediately = False
        disk_full: bool | None = None
        if _over(cfg.disk_warning_ratio, disk_used):
            disk_full = immediately = space = True
        elif self.over_forcibly(disk_used):
            immediately = space = True  # DISK_FULL stays until use is back under this ratio
        else:
            disk_full = False
            space = disk_used < 0 or _over(cfg.disk_max_used_ratio, disk_used)
        at_once = cfg.clean_forcibly and immediately
        return CleanupDecision(time_up or space, 0 if at_once else self.reserved_ms, disk_full)


@hookimpl(trylast=True)
def register_cleanup_policies(registry):
    registry.add("rocketmq", RocketMQCleanup)

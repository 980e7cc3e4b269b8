"""What a cleanup policy decides with: the disk's use, and the watermark and hour settings.

``CleanupPolicy.decide`` gets the used fraction of the store's disk as a ``DiskUsage``: a float
(RocketMQ's whole percent, as a fraction; -1 when unknown) that also carries the byte counts it
came from, so a byte watermark (``"20GiB"`` free) is compared in bytes.
"""

from __future__ import annotations

from mqstore.config import parse_bytes, parse_hours

__all__ = ["DiskUsage", "watermark_passed", "parse_hours"]


class DiskUsage(float):
    """The used fraction of a disk, as a float, with the byte counts it came from (so a
    policy can turn byte watermarks into fractions of this disk)."""

    __slots__ = ("total_bytes", "free_bytes")

    total_bytes: int
    free_bytes: int

    def __new__(cls, ratio: float, total_bytes: int, free_bytes: int) -> "DiskUsage":
        usage = float.__new__(cls, ratio)
        usage.total_bytes = total_bytes
        usage.free_bytes = free_bytes
        return usage


def watermark_passed(value: int | str, disk_used: float) -> bool:
    """Whether the disk is past a ``cleanup.disk_*_ratio`` setting: a percent of the disk in
    use (``disk_used`` above it), or a byte amount of free space (``"20GiB"``: less than that
    is free, counted in bytes, not in RocketMQ's whole percents). A byte amount is never
    passed on a disk whose size is unknown (a plain float carries no byte counts)."""
    if isinstance(value, int):
        return disk_used > value / 100
    if not isinstance(disk_used, DiskUsage) or disk_used.total_bytes <= 0:
        return False
    return disk_used.free_bytes < parse_bytes(value)

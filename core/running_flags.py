"""The store's running flags (spec 9) and the open/closed state every part of a store shares."""

from __future__ import annotations

from mqstore.config import describe_watermark

NOT_READABLE = 1
NOT_WRITEABLE = 2
WRITE_LOGICS_QUEUE_ERROR = 4
WRITE_INDEX_FILE_ERROR = 8
DISK_FULL = 16
UNWRITABLE = NOT_WRITEABLE | WRITE_LOGICS_QUEUE_ERROR | WRITE_INDEX_FILE_ERROR | DISK_FULL


class StoreState:
    """Whether the store is open, and its running flags; read by every call."""

    __slots__ = ("root", "read_only", "closed", "running_flags")

    def __init__(self, root: str, read_only: bool) -> None:
        self.root = root
        self.read_only = read_only
        self.closed = True
        self.running_flags = NOT_WRITEABLE if read_only else 0

    def unwritable_reason(self, disk_warning_ratio: int | str) -> str:
        flags = self.running_flags
        reasons = []
        if flags & DISK_FULL:
            reasons.append(f"disk full: the disk of {self.root} is "
                           f"{describe_watermark(disk_warning_ratio)} "
                           f"(cleanup.disk_warning_ratio); puts resume once cleanup frees "
                           f"space")
        if flags & NOT_WRITEABLE:
            reasons.append("a commit-log flush failed: the store takes no more puts until it "
                           "is reopened")
        if flags & (WRITE_LOGICS_QUEUE_ERROR | WRITE_INDEX_FILE_ERROR):
            reasons.append("consume queues or index files could not be written")
        return "; ".join(reasons) + f" (running flags {flags:#x})"

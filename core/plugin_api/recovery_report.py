"""What an open found and changed: returned by recovery, carried by every plugin's view.

A data-loss report is a returned value, not only a log line: what was cut, quarantined or
rebuilt, and from where the walk and the re-dispatch ran.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Quarantined:
    offset: int  # commit-log offset of the damaged region
    length: int
    reason: str  # why its first record failed
    saved_to: str | None = None  # a copy of the original bytes (writable opens)


@dataclass
class RecoveryReport:
    abnormal: bool = False
    scan_from: int = 0  # commit-log offset validation started at
    commit_log_end: int = 0  # end of the last valid record: where writes continue
    truncated_bytes: int = 0  # non-zero bytes past the end that were cut
    stop_reason: str | None = None  # why the walk stopped before the last byte, if it did
    records_checked: int = 0
    redispatch_from: int = 0
    redispatch_bytes: int = 0  # commit-log bytes dispatched again while opening
    redispatch_seconds: float = 0.0
    consume_queue_units_dropped: dict[str, int] = field(default_factory=dict)
    deleted_files: list[str] = field(default_factory=list)
    quarantined: list[Quarantined] = field(default_factory=list)
    recreated_segments: list[str] = field(default_factory=list)
    queues_rebuilt: dict[str, str] = field(default_factory=dict)  # queue -> why
    # Queue offsets whose messages are gone, [first, last] runs by queue: filler units hold
    # them so that later messages keep theirs and new ones go on above (``offset_floor``).
    queue_offsets_lost: dict[str, list[tuple[int, int]]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    # The commit-log end a trusted clean-shutdown marker vouched for (``storage.clean_marker``):
    # nothing was walked, and every dispatcher active at the last close, whose files are as
    # it left them, had dispatched everything below it. -1: no marker was trusted.
    trusted_end: int = -1

    @property
    def clean(self) -> bool:
        return not (self.truncated_bytes or self.consume_queue_units_dropped
                    or self.quarantined or self.recreated_segments or self.queues_rebuilt
                    or self.queue_offsets_lost)


__all__ = ["Quarantined", "RecoveryReport"]

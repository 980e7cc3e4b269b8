"""The default commit-log writer: copies records straight into the mapped segment."""

from __future__ import annotations

from mqstore.hookspecs import hookimpl


class MmapWriter:
    """Appends are visible to readers (and dispatch) as soon as the copy returns."""

    def __init__(self, commit_log, config) -> None:
        self.commit_log = commit_log

    def write(self, segment, data) -> int:
        return segment.write(data)


@hookimpl(trylast=True)
def register_writers(registry):
    registry.add("mmap", MmapWriter)

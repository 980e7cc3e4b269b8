"""The default commit-log writer: copies records straight into the mapped segment."""

from __future__ import annotations

from mqstore.plugin_api import hookimpl, WriterContext


class MmapWriter:
    """A plain writer (``contracts.Writer``): appends are visible to readers (and dispatch)
    as soon as the copy returns."""

    def __init__(self, ctx: WriterContext) -> None:
        pass

    def write(self, segment, data) -> int:
        return segment.write(data)

    write_blank = write

    def before_roll(self) -> None:
        pass

    def close(self) -> None:
        pass


@hookimpl(trylast=True)
def register_writers(registry):
    registry.add("mmap", MmapWriter)

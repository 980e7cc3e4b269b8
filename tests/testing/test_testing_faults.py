"""The fault writer's parent side (mqstore.testing.faults.FaultWriter) collects every line the
writer printed, whatever it had read ahead when the writer ended."""

from __future__ import annotations

import fcntl
import signal
import struct
import termios

import pytest

from mqstore.testing import wait_for
from mqstore.testing.faults import FaultWriter, small_store_overrides

COUNT = 3000  # about 75 KB of "ack" lines: more than a pipe holds, so the writer waits on it


def _pipe_holds(writer: FaultWriter) -> int:
    """Bytes waiting in the writer's stdout pipe."""
    raw = fcntl.ioctl(writer.proc.stdout.fileno(), termios.FIONREAD, b"\0\0\0\0")
    return struct.unpack("i", raw)[0]


@pytest.mark.parametrize("end", ["finish", "kill"])
def test_lines_read_ahead_before_the_end_are_not_lost(tmp_path, end):
    writer = FaultWriter(str(tmp_path / "store"), small_store_overrides(), seed=3, count=COUNT,
                         then="close").start()
    try:
        # The pipe is full before the first line is read, so the first read takes a whole
        # buffer of lines ahead of the one asked for.
        wait_for(lambda: _pipe_holds(writer) >= 32 * 1024, what="a pipe full of lines")
        assert writer.read_until(acks=1)
        assert len(writer.acks) == 1
    finally:
        code = writer.finish() if end == "finish" else writer.kill(signal.SIGKILL, group=False)
    if end == "finish":
        assert code == 0 and writer.done
        assert len(writer.acks) == COUNT
    assert [a.index for a in writer.acks] == list(range(len(writer.acks)))
    assert len(writer.acks) > 1000  # the full pipe's lines, at least

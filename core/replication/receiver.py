"""A slave's commit log as the master's frames extend it.

The frames of one connection arrive in order; each must start where the last one ended, and
the first must start where this log ends (RocketMQ's rule: a frame's offset equals the slave's
max offset, unless the slave is empty, when the master chooses). Records are appended whole
and checked (``format.replica_run``): the part of a record a frame cuts off waits here for
the next frame, so the log always ends on a record boundary, which is what the slave reports
and what its recovery finds after a kill. A blank record closes the segment locally at once
(its header says how far it spans); the rest of its span arrives as filler, copied only where
the master holds something else than the zeros a fresh segment has.

Anything that breaks the rules raises ``ReplicaDiverged`` before a byte of the offending
frame is written; the connection is then dropped. Used by one thread (the slave's client).
"""

from __future__ import annotations

from mqstore.format.replica_run import check_run


class ReplicaDiverged(Exception):
    """The master's bytes do not continue this log; the message says where and why."""


class Receiver:
    def __init__(self, commit_log, appender, max_record_bytes: int) -> None:
        """``appender``: the slave store's Appender (``append_copy``, ``close_copy``,
        ``fill_copy``)."""
        self.commit_log = commit_log
        self.appender = appender
        self.max_record_bytes = max_record_bytes
        self.master_offset = 0  # the furthest offset the master was seen to hold
        self._pending = b""  # the start of a record cut off by the last frame
        self._stream: int | None = None  # where the next frame must start (None: any)
        self._filler_to = 0  # a blank's span: bytes up to here are filler

    @property
    def end(self) -> int:
        """Where this log ends: every byte below is a whole record (or blank) appended."""
        return self.commit_log.segments.write_end

    def begin(self) -> int:
        """A new connection: partial bytes of the last one are forgotten; returns the offset
        to report first (this log's end; 0 when it is empty)."""
        self._pending = b""
        self._filler_to = 0
        end = self.end
        self._stream = end if end else None
        return end

    def acknowledged(self) -> int:
        """The offset to report now: the log's end, but while a blank's filler is still
        arriving, only as far as the master has sent (never more than it holds)."""
        if self._filler_to and self._stream is not None:
            return self._stream
        return self.end

    def accept_all(self, frames) -> None:
        """Frames as they came off the wire (``ha_frame.Frame``s): runs of them that continue
        one another within a segment are checked and appended as one (the checks cost per
        call more than per byte); each is held to the rules as ``accept`` holds one."""
        seg_bytes = self.commit_log.segment_bytes
        run: list[bytes] = []
        start = nxt = -1
        for offset, body in frames:
            if run and body and offset == nxt and offset % seg_bytes:
                run.append(body)
                nxt += len(body)
                continue
            if run:
                self.accept(start, run[0] if len(run) == 1 else b"".join(run))
                run = []
            if not body:
                self.accept(offset, body)
                continue
            run, start, nxt = [body], offset, offset + len(body)
        if run:
            self.accept(start, run[0] if len(run) == 1 else b"".join(run))

    def accept(self, phys_offset: int, body: bytes) -> None:
        """One frame (``body`` empty: a heartbeat)."""
        seg_bytes = self.commit_log.segment_bytes
        if self._stream is None:
            if body and phys_offset % seg_bytes:
                raise ReplicaDiverged(
                    f"the master's first bytes for this empty store are at commit-log offset "
                    f"{phys_offset}, not at a segment start: its segments are not "
                    f"{seg_bytes} bytes (configure the slave's commit_log.segment_bytes as "
                    f"the master's)")
        elif phys_offset != self._stream:
            raise ReplicaDiverged(
                f"the master sent commit-log bytes at offset {phys_offset}, but this store's "
                f"log continues at {self._stream}: a frame must start where the slave's log "
                f"ends; the logs diverge")
        self.master_offset = max(self.master_offset, phys_offset + len(body))
        if not body:
            return
        if phys_offset % seg_bytes + len(body) > seg_bytes:
            raise ReplicaDiverged(
                f"the master's frame at commit-log offset {phys_offset} ({len(body)} bytes) "
                f"crosses the end of a {seg_bytes}-byte segment: its segments are not "
                f"{seg_bytes} bytes (configure the slave's commit_log.segment_bytes as the "
                f"master's)")
        self._stream = phys_offset + len(body)
        data = memoryview(body)
        if self._filler_to:
            data = self._filler(phys_offset, data)
            if not data:
                return
        at = self._stream - len(self._pending) - len(data)  # where the unappended bytes begin
        buf = self._pending + data if self._pending else data
        run = check_run(buf, at, seg_bytes, self.max_record_bytes)
        if run.problem is not None:
            self._pending = b""
            raise ReplicaDiverged(
                f"{run.problem}: the master's log does not continue this store's log there "
                f"(the logs diverge, or the master's bytes are damaged); nothing of it was "
                f"written")
        if run.whole:
            self.appender.append_copy(at, buf[:run.whole], run.last_store_ts)
        rest = buf[run.whole:]
        if run.blank:
            blank_at = at + run.whole
            seg_end = self.appender.close_copy(blank_at)
            self._pending = b""
            self._filler_to = seg_end
            filler = rest[8:]
            if filler:
                self._filler(blank_at + 8, filler)
            if self._stream >= seg_end:
                self._filler_to = 0
            return
        self._pending = bytes(rest)

    def _filler(self, phys_offset: int, data: memoryview) -> memoryview:
        """Take the filler of a blank's span from ``data`` (at ``phys_offset``); returns what
        follows it."""
        take = min(len(data), self._filler_to - phys_offset)
        filler = data[:take]
        if filler != bytes(take):
            self.appender.fill_copy(phys_offset, filler)
        if phys_offset + take >= self._filler_to:
            self._filler_to = 0
        return data[take:]


__all__ = ["Receiver", "ReplicaDiverged"]

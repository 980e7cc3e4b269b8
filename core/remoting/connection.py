"""One client connection: frames in, commands to the broker, responses and broker requests out.

NOTE [ Remoting connection bounds ]
What one peer controls, and the answer it gets:

  frame size     a frame longer than ``server.remoting_max_frame_bytes`` is answered
                 SYSTEM_ERROR naming both sizes once its header arrived, and its body is
                 read past without being held (a header longer than MAX_HEADER_BYTES, or bytes
                 that are no frame, close the connection after a SYSTEM_ERROR saying why);
  in flight      at most ``server.remoting_max_in_flight`` requests of a connection are being
                 processed at once (held pulls apart); past that the connection is not read
                 until one is answered, so a flood waits in the peer's socket, not here;
  unread output  a peer that does not read its responses: once ``WRITE_HIGH_BYTES`` wait in
                 its socket buffer no more of its requests are taken (not even those already
                 read: small requests with large answers would fill memory) and it is not
                 read, and when it stays so for ``server.remoting_client_idle_ms`` it is
                 closed;
  idle           a connection that sent nothing for ``server.remoting_client_idle_ms`` and has
                 nothing in flight or held is closed (RocketMQ's 120 s idle channel close);
  connections    past ``server.remoting_max_connections``, or fewer when the descriptor limit
                 leaves less room (NOTE [ Listener descriptors ]), a new connection is closed
                 at once, before a byte of it is read (``listener``).

Requests are answered as they finish, in any order (a held pull after the sends that came
behind it); oneway requests get no answer; responses to the broker's own requests (none
expected: NOTIFY_CONSUMER_IDS_CHANGED is oneway) are dropped.
"""

from __future__ import annotations

import asyncio
import logging
import time

from mqstore.format import remoting_frame as rf

log = logging.getLogger(__name__)
WRITE_HIGH_BYTES = 4 << 20  # unread responses a peer may leave in its socket buffer
MAX_HEADER_BYTES = 64 << 10  # the header of an oversized frame we still read to answer it


class Connection(asyncio.Protocol):
    """Only the event loop's thread calls it."""

    def __init__(self, server) -> None:
        self.server = server
        self.transport: asyncio.Transport | None = None
        self.peer = "?"
        self.peer_host: str | None = None
        self._buf = bytearray()
        self._skip = 0  # bytes of an oversized frame still to read past
        self.in_flight = 0  # requests being processed (held pulls apart)
        self.held = 0  # pulls held for this connection
        self.last_read = time.monotonic()
        self.write_paused_at: float | None = None
        self._read_paused = False
        self.closed = False

    # -- asyncio.Protocol -----------------------------------------------------------------
    def connection_made(self, transport) -> None:
        self.transport = transport
        peer = transport.get_extra_info("peername")
        if isinstance(peer, tuple):
            host, port = peer[0], peer[1]
            self.peer_host = host
            self.peer = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        transport.set_write_buffer_limits(high=WRITE_HIGH_BYTES)
        self.server.admit(self)

    def connection_lost(self, exc) -> None:
        self.closed = True
        self.server.lost(self)

    def pause_writing(self) -> None:
        self.write_paused_at = time.monotonic()
        self._update_reading()

    def resume_writing(self) -> None:
        self.write_paused_at = None
        self._update_reading()
        if self._buf:
            self._take_frames()

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        if self._skip:
            n = min(self._skip, len(data))
            self._skip -= n
            data = data[n:]
            if not data:
                return
        self._buf += data
        self._take_frames()

    def _take_frames(self) -> None:
        """Hand the complete frames read so far to the server, until a bound says wait
        (answers unread by the peer, too many requests in flight): a chunk of small
        requests whose answers are large must not all be answered into a full socket."""
        buf = self._buf
        at, end = 0, len(buf)
        limit = self.server.max_frame_bytes
        try:
            while end - at >= 4 and not self.closed and not self._must_wait():
                length = int.from_bytes(buf[at:at + 4], "big", signed=True)
                if length < 4:
                    raise rf.FrameError(f"frame length {length} is below 4")
                if length > limit:
                    done = self._oversized(buf, at, end, length, limit)
                    if done is None:
                        break  # its header is not all here yet
                    at = done
                    continue
                if end - at - 4 < length:
                    break
                cmd = rf.decode(memoryview(buf)[at + 4:at + 4 + length])
                at += 4 + length
                self.server.dispatch(self, cmd)
        except rf.FrameError as exc:
            self._fail(str(exc))
            return
        if at:
            del buf[:at]

    def _must_wait(self) -> bool:
        return (self.write_paused_at is not None
                or self.in_flight >= self.server.max_in_flight)

    # -- frames that break a bound ------------------------------------------------------------
    def _oversized(self, buf, at: int, end: int, length: int, limit: int) -> int | None:
        """Answer a frame over the limit from its header, and read past its body; where the
        next frame starts, or None when its header has not arrived yet."""
        if end - at < 8:
            return None
        mark = int.from_bytes(buf[at + 4:at + 8], "big")
        header_len = mark & 0xFFFFFF
        if header_len > MAX_HEADER_BYTES or header_len > length - 4:
            raise rf.FrameError(f"frame of {length} bytes exceeds the limit of {limit} bytes "
                                f"(server.remoting_max_frame_bytes)")
        if end - at < 8 + header_len:
            return None
        head = bytes(buf[at + 4:at + 8 + header_len])
        cmd = rf.decode(head)
        remark = (f"frame of {length} bytes exceeds the limit of {limit} bytes "
                  f"(server.remoting_max_frame_bytes); nothing of it was processed")
        log.warning("%s: %s (request code %d)", self.peer, remark, cmd.code)
        if not cmd.is_oneway and not cmd.is_response:
            self.send(cmd.response(1, remark))
        frame_end = at + 4 + length
        if frame_end <= end:
            return frame_end
        self._skip = frame_end - end
        return end

    def _fail(self, why: str) -> None:
        """Bytes that are no frame: say so (JSON, opaque 0) and close."""
        log.warning("%s sent what is not a remoting frame: %s; closing", self.peer, why)
        self.send(rf.Command(1, flag=rf.RESPONSE_FLAG, remark=f"not a remoting frame: {why}"))
        self.close()

    # -- output ---------------------------------------------------------------------------
    def send(self, cmd: rf.Command) -> None:
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return
        head, body = rf.encode_parts(cmd)
        if body and len(body) > 65536:
            transport.writelines((head, body))
        else:
            transport.write(head + body if body else head)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()

    def abort(self) -> None:
        """Close now, dropping what the peer has not read (a close waits for it)."""
        if self.transport is not None:
            self.transport.abort()

    # -- flow -----------------------------------------------------------------------------
    def started(self) -> None:
        self.in_flight += 1
        self._update_reading()

    def finished(self) -> None:
        self.in_flight -= 1
        self._update_reading()
        if self._buf and not self.closed:
            self._take_frames()

    def _update_reading(self) -> None:
        transport = self.transport
        if transport is None or self.closed or transport.is_closing():
            return
        pause = self._must_wait()
        if pause and not self._read_paused:
            self._read_paused = True
            transport.pause_reading()
        elif not pause and self._read_paused:
            self._read_paused = False
            transport.resume_reading()

    def idle_for(self, now: float) -> float:
        """How long the connection has done nothing a client that is alive does."""
        if self.write_paused_at is not None:
            return now - self.write_paused_at
        if self.in_flight or self.held:
            return 0.0
        return now - self.last_read


__all__ = ["Connection", "WRITE_HIGH_BYTES", "MAX_HEADER_BYTES"]

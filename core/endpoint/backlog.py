"""Bytes receives popped and have not yet got through their streams: bounded per connection and
for the whole endpoint, so a client that never reads cannot make the server hold messages.

NOTE [ Unwritten bytes ]
A receive's messages sit in the server from the pop until the stream is done: first as wire
messages waiting their turn, then inside gRPC, which keeps what it accepted until the peer's
flow-control window takes it. A client that stops reading keeps all of that, for as long as
its stream stays open (the idle timeout does not apply to an active RPC). So:

  * every message a receive hands out is charged (its serialized size) to the connection and
    to the endpoint from the pop until the stream is done (gRPC's done callback: the client
    read the end, or the call died), whatever part of it was written already;
  * a receive starts only while its connection holds less than
    ``server.grpc_max_unwritten_bytes_per_connection`` and the endpoint less than
    ``server.grpc_max_unwritten_bytes``, else TOO_MANY_REQUESTS (the proxy's "polling full");
  * its pop takes no more bytes of records than the room left under both (``room``: the
    store's ``pop(max_bytes=...)``), at least one message;
  * a write that waits longer than ``server.grpc_write_stall_ms`` means the peer stopped
    reading: its connection is closed (``connections.close``: gRPC's Python server cannot
    cancel one stream), which ends the call and frees what gRPC held; the messages not yet
    read are not acknowledged and come back at their invisible time.

The charges are therefore an upper bound of the memory those messages take (one copy each:
a receive converts and drops each popped record in turn, and a response leaves our hands as
gRPC takes its copy), and receives are served one at a time on the event loop, so what every
connection together holds is the endpoint's bound plus one message (a pop always takes one).
The process gives big buffers back to the system when freed (``limits.return_big_buffers``), so
its RSS follows: twenty receives of 32 x 1 MiB nobody reads, under a 64 MiB bound, add 63 to 67 MiB
(``tests/endpoint/test_endpoint_bounds.py``; 73 MiB with glibc's default, which keeps freed
buffers in its heap).
"""

from __future__ import annotations

from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError

class Backlog:
    """The charges. Only the event loop's thread calls it."""

    def __init__(self, per_connection: int, total: int) -> None:
        self.per_connection = per_connection
        self.total = total
        self._held: dict[str, int] = {}
        self.held = 0

    def of(self, peer: str) -> int:
        return self._held.get(peer, 0)

    def admit(self, peer: str) -> None:
        """TOO_MANY_REQUESTS unless a receive of ``peer`` may pop now."""
        mine = self._held.get(peer, 0)
        if mine >= self.per_connection:
            raise EndpointError(Code.TOO_MANY_REQUESTS, (
                f"this connection's receives hold {mine} bytes its streams have not finished "
                f"sending, the most server.grpc_max_unwritten_bytes_per_connection "
                f"({self.per_connection}) allows: read them first"))
        if self.held >= self.total:
            raise EndpointError(Code.TOO_MANY_REQUESTS, (
                f"receives hold {self.held} bytes their streams have not finished sending, "
                f"the most server.grpc_max_unwritten_bytes ({self.total}) allows; try again "
                f"later"))

    def room(self, peer: str) -> int:
        """Bytes a receive of ``peer`` may still hand out under both bounds (a receive hands
        out at least one message whatever this says: ``Receiver``)."""
        return min(self.per_connection - self._held.get(peer, 0), self.total - self.held)

    def charge(self, peer: str, size: int) -> None:
        self._held[peer] = self._held.get(peer, 0) + size
        self.held += size

    def release(self, peer: str, size: int) -> None:
        left = self._held.get(peer, 0) - size
        if left > 0:
            self._held[peer] = left
        else:
            self._held.pop(peer, None)
        self.held -= size


__all__ = ["Backlog"]

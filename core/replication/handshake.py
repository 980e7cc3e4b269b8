"""mqstore's HA handshake over a connection (``format.ha_hello`` draws the bytes): the master's
side, after a connection's first 4 bytes were the magic, and the slave's, before its first
offset report. Both run by a deadline (``time.monotonic``) and bound what the peer can make
them hold (one message body of at most ``ha_hello.BODY_MAX_BYTES``).

Either side that cannot go on raises ``HandshakeRefused`` naming why (a refusing master first
answers a result saying so); bytes that are not the protocol raise ``HelloError``.

Both sides also say what they are (NOTE [ Node fields ] in ``format.ha_hello``): the slave in
its proof (its role, log end and epochs; or that it is a master probing a peer), the master in
its result (role, log end, confirm offset, epochs, client endpoint). The master's ``Peers``
judges what a peer said (a slave with a newer epoch than the master's: this master was
replaced, and is fenced) and answers a probe without taking a slave slot.
"""

from __future__ import annotations

import os
import time
from typing import Callable, NamedTuple, Protocol

from mqstore.format import ha_hello as hello
from mqstore.format.ha_hello import HelloError
from mqstore.replication.access import HAAccess
from mqstore.replication.channel import Channel


class HandshakeRefused(Exception):
    """The handshake cannot succeed: the message says why, for the log; ``peer``: what the
    other side said of itself, if it did."""

    def __init__(self, message: str, peer: hello.NodeInfo | None = None) -> None:
        super().__init__(message)
        self.peer = peer


class Peers(Protocol):
    """What a master's side of the handshake asks of the master."""

    def fields(self) -> bytes:
        """This master's node fields, for its result."""

    def judge(self, peer: hello.NodeInfo | None, address: str) -> str | None:
        """Why a peer that said ``peer`` of itself is refused, or None."""

    def status(self) -> tuple[object, bytes]:
        """What a status frame says now: a key that changes when it must be sent again,
        and its fields."""


class Admission(NamedTuple):
    how: str  # how the peer proved itself, for the log
    peer: hello.NodeInfo | None  # what it said of itself (None: no fields, an older slave)

    @property
    def probe(self) -> bool:
        return self.peer is not None and self.peer.probe


class StreamReader:
    """Reads exact byte counts from a channel by a deadline; keeps what came after."""

    def __init__(self, channel: Channel, deadline: float, first: bytes = b"") -> None:
        self.channel = channel
        self.deadline = deadline
        self._buf = bytearray(first)

    def read_exact(self, n: int) -> bytes:
        out = self.peek(n)
        del self._buf[:n]
        return out

    def peek(self, n: int) -> bytes:
        """The next ``n`` bytes, left to read again."""
        while len(self._buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0 or not self.channel.wait_readable(left):
                raise TimeoutError(f"{len(self._buf)} of {n} bytes arrived in time")
            data = self.channel.recv(65536)
            if data is None:
                raise ConnectionError(f"the peer closed the connection after {len(self._buf)} "
                                      f"of {n} bytes")
            self._buf += data
        return bytes(self._buf[:n])

    def message(self) -> tuple[hello.Header, bytes]:
        """The next handshake message: its header and all of its bytes."""
        head = self.read_exact(hello.HEADER_BYTES)
        header = hello.parse_header(head)
        return header, head + self.read_exact(header.length)

    def rest(self) -> bytes:
        """What arrived after the handshake (the start of the classic protocol)."""
        out = bytes(self._buf)
        self._buf.clear()
        return out


def _body(message: bytes) -> bytes:
    return message[hello.HEADER_BYTES:]


def _expect(header: hello.Header, kind: int) -> None:
    if header.kind != kind:
        raise HelloError(f"handshake {hello.KIND_NAMES[header.kind]} where a "
                         f"{hello.KIND_NAMES[kind]} belongs")


# -- the master's side -----------------------------------------------------------------------
def master_handshake(reader: StreamReader, access: HAAccess, promote: Callable[[], bool],
                     peers: Peers | None = None, address: str = "") -> Admission:
    """Answer a slave's handshake; ``promote()`` takes a slave slot (False: none free) once
    the slave has proven itself and ``peers`` did not refuse it (a probe takes none). Returns
    how it proved itself and what it said of itself."""
    header, opened = reader.message()
    _expect(header, hello.OPEN)
    version = min(hello.VERSION, header.version)
    channel = reader.channel
    if not access.handshake:
        why = ("this master takes no handshake: it has neither server.ha_secret_file nor "
               "server.ha_tls_* (configure the slave as the master, or list it in "
               "server.ha_allow and remove its secret and TLS)")
        channel.sendall(hello.encode_result(version, hello.REFUSED, why, None, b""))
        raise HandshakeRefused(why)
    auth = hello.AUTH_HMAC if access.secret is not None else hello.AUTH_NONE
    challenge = hello.encode_challenge(version, auth, os.urandom(hello.NONCE_BYTES))
    channel.sendall(challenge)
    header, proved = reader.message()
    _expect(header, hello.PROOF)
    proof = hello.decode_proof(_body(proved))
    transcript = opened + challenge + proved
    if auth == hello.AUTH_HMAC:
        expected = hello.mac(access.secret, hello.SLAVE_LABEL,
                             opened + challenge + proved[:-hello.MAC_BYTES])
        if not hello.macs_equal(proof.mac, expected):
            why = ("the slave's proof does not match this master's shared secret "
                   "(server.ha_secret_file differs, or the peer does not know it)")
            channel.sendall(hello.encode_result(version, hello.REFUSED, why, None, b""))
            raise HandshakeRefused(why)
    peer = hello.decode_fields(hello.proof_fields(_body(proved)))
    why = peers.judge(peer, address) if peers is not None else None
    fields = peers.fields() if peers is not None and peer is not None else b""
    if why is not None:
        channel.sendall(hello.encode_result(version, hello.REFUSED, why, None, b"", fields))
        raise HandshakeRefused(why, peer)
    if (peer is None or not peer.probe) and not promote():
        why = "every slave slot of this master is taken"
        channel.sendall(hello.encode_result(version, hello.BUSY, why, None, b""))
        raise HandshakeRefused(why)
    channel.sendall(hello.encode_result(version, hello.ACCEPTED, "", access.secret, transcript,
                                        fields))
    how = "handshake, " + ("shared secret" if auth == hello.AUTH_HMAC else "TLS client "
                           "certificate") + (" over TLS" if channel.tls and access.secret else "")
    return Admission(how, peer)


# -- the slave's side ------------------------------------------------------------------------
def slave_handshake(reader: StreamReader, secret: bytes | None,
                    node: hello.NodeInfo | None = None) -> hello.NodeInfo | None:
    """Open the handshake, prove this slave (saying ``node`` of itself: NOTE [ Node
    fields ]), and check the master's proof: HandshakeRefused when the master refuses, asks
    for another proof, or cannot prove it knows the secret. Returns what the master said of
    itself (None: nothing, an mqstore master that sends no fields)."""
    channel = reader.channel
    opened = hello.encode_open()
    channel.sendall(opened)
    try:
        header, challenge = reader.message()
    except (TimeoutError, ConnectionError, HelloError) as exc:
        raise HandshakeRefused(
            f"the master did not answer mqstore's handshake ({exc}): a slave with "
            f"server.ha_secret_file or server.ha_tls_* speaks it, and a RocketMQ master, or an "
            f"mqstore master without them, does not") from None
    if header.kind == hello.RESULT:
        _refused(hello.decode_result(_body(challenge)))
    _expect(header, hello.CHALLENGE)
    if header.version > hello.VERSION:
        raise HelloError(f"the master answered in handshake version {header.version}, after "
                         f"this slave's {hello.VERSION}")
    asked = hello.decode_challenge(_body(challenge))
    if secret is not None and asked.auth != hello.AUTH_HMAC:
        raise HandshakeRefused(
            "the master asks for no shared secret, but this slave has server.ha_secret_file: "
            "a master that does not know the secret cannot prove it is the one to follow "
            "(configure the same secret on both)")
    if secret is None and asked.auth == hello.AUTH_HMAC:
        raise HandshakeRefused("the master requires the shared secret: set "
                               "server.ha_secret_file to the master's")
    fields = hello.encode_fields(node) if node is not None else b""
    proved = hello.encode_proof(header.version, os.urandom(hello.NONCE_BYTES), secret,
                                opened + challenge, fields)
    channel.sendall(proved)
    header, answered = reader.message()
    _expect(header, hello.RESULT)
    result = hello.decode_result(_body(answered))
    master = hello.decode_fields(hello.result_fields(_body(answered)))
    if result.status != hello.ACCEPTED:
        _refused(result, master)
    if secret is not None:
        expected = hello.mac(secret, hello.MASTER_LABEL,
                             opened + challenge + proved + answered[:-hello.MAC_BYTES])
        if not hello.macs_equal(result.mac, expected):
            raise HandshakeRefused(
                "the master's proof does not match this slave's shared secret: it is not a "
                "master that knows server.ha_secret_file; not following it")
    return master


def _refused(result: hello.Result, peer: hello.NodeInfo | None = None) -> None:
    status = hello.STATUS_NAMES.get(result.status, f"status {result.status}")
    raise HandshakeRefused(f"the master refused this slave ({status}): {result.reason}", peer)


__all__ = ["HandshakeRefused", "Peers", "Admission", "StreamReader", "master_handshake",
           "slave_handshake"]

"""mqstore's HA handshake over a connection (``format.ha_hello`` draws the bytes): the master's
side, after a connection's first 4 bytes were the magic, and the slave's, before its first
offset report. Both run by a deadline (``time.monotonic``) and bound what the peer can make
them hold (one message body of at most ``ha_hello.BODY_MAX_BYTES``).

Either side that cannot go on raises ``HandshakeRefused`` naming why (a refusing master first
answers a result saying so); bytes that are not the protocol raise ``HelloError``.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from mqstore.format import ha_hello as hello
from mqstore.format.ha_hello import HelloError
from mqstore.replication.access import HAAccess
from mqstore.replication.channel import Channel


class HandshakeRefused(Exception):
    """The handshake cannot succeed: the message says why, for the log."""


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
def master_handshake(reader: StreamReader, access: HAAccess, promote: Callable[[], bool]) -> str:
    """Answer a slave's handshake; ``promote()`` takes a slave slot (False: none free) once
    the slave has proven itself. Returns how it proved itself, for the log."""
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
    if not promote():
        why = "every slave slot of this master is taken"
        channel.sendall(hello.encode_result(version, hello.BUSY, why, None, b""))
        raise HandshakeRefused(why)
    channel.sendall(hello.encode_result(version, hello.ACCEPTED, "", access.secret, transcript))
    return "handshake, " + ("shared secret" if auth == hello.AUTH_HMAC else "TLS client "
                            "certificate") + (" over TLS" if channel.tls and access.secret else "")


# -- the slave's side ------------------------------------------------------------------------
def slave_handshake(reader: StreamReader, secret: bytes | None) -> None:
    """Open the handshake, prove this slave, and check the master's proof: HandshakeRefused
    when the master refuses, asks for another proof, or cannot prove it knows the secret."""
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
    proved = hello.encode_proof(header.version, os.urandom(hello.NONCE_BYTES), secret,
                                opened + challenge)
    channel.sendall(proved)
    header, answered = reader.message()
    _expect(header, hello.RESULT)
    result = hello.decode_result(_body(answered))
    if result.status != hello.ACCEPTED:
        _refused(result)
    if secret is not None:
        expected = hello.mac(secret, hello.MASTER_LABEL,
                             opened + challenge + proved + answered[:-hello.MAC_BYTES])
        if not hello.macs_equal(result.mac, expected):
            raise HandshakeRefused(
                "the master's proof does not match this slave's shared secret: it is not a "
                "master that knows server.ha_secret_file; not following it")


def _refused(result: hello.Result) -> None:
    status = hello.STATUS_NAMES.get(result.status, f"status {result.status}")
    raise HandshakeRefused(f"the master refused this slave ({status}): {result.reason}")


__all__ = ["HandshakeRefused", "StreamReader", "master_handshake", "slave_handshake"]

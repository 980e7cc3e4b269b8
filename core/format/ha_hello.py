"""mqstore's HA handshake: what an mqstore slave and master exchange, when both are mqstore and
configured for it, before RocketMQ's offset reports and frames (``format.ha_frame``) begin.

Every message is a header and a body (big-endian):

    +-----------------------+-----------+-------------+------------------+-------------------+
    | magic  E1 4D 51 48    | kind (1)  | version (1) | length  u16 (2)  | length bytes body |
    +-----------------------+-----------+-------------+------------------+-------------------+
      header = 8 bytes; kind 1 open, 2 challenge, 3 proof, 4 result

The magic's first byte has its high bit set: read as a RocketMQ offset report (a long), the
header is negative, which no commit log's end is. So a master tells a handshake from a classic
slave's first report by its first 4 bytes, and a RocketMQ master that is sent an open reads
one negative long: it never takes it for an acknowledgement. The slave sends nothing else
before the master has answered as only an mqstore master can.

    slave                                          master
    open       header only (version: the highest the slave speaks)
                                                   challenge  auth (1), 3 zero bytes, nonce (32)
    proof      nonce (32) ... mac (32)
                                                   result     status (1), 0 (1), reason
                                                              length u16 (2), reason UTF-8,
                                                              ... mac (32)

- The challenge's version is the one both then speak (at most the open's); ``auth`` is
  what the master requires: 0 no secret (the TLS client certificate proves the slave),
  1 HMAC-SHA256 with the shared secret.
- The proof's mac: ``HMAC-SHA256(secret, SLAVE_LABEL + open + challenge + proof less its
  mac)``; the result's: ``HMAC-SHA256(secret, MASTER_LABEL + open + challenge + proof +
  result less its mac)``. Each side's mac covers the other's fresh nonce, so neither can be
  replayed, and both cover every byte exchanged. With auth 0 the macs are 32 zero bytes.
- Status 0 accepts: the slave's offset reports follow. A refusal's reason is for the log.
- Room to grow: a later field goes between a body's fields and its mac (which stays the last
  32 bytes), and a reader takes the fields it knows and ignores the rest; ``version`` rises
  only when a field's meaning changes. An open's body is empty in version 1.

NOTE [ Node fields ]
What a node says of itself goes in that room, in the proof (the slave, or a master probing a
peer) and in the result (the master), as fields: tag (1), length u16 (2), value. A reader
skips tags it does not know; a peer that sends none (an older mqstore) is taken as before.

    tag 1 node      role (1: 0 slave, 1 master, 2 fenced master), flags (1: bit 0 probe, a
                    master asking a peer about itself, not following it), log end u64 (8),
                    confirm offset i64 (8: the end of what it answered PUT_OK; -1 unknown)
    tag 2 epochs    its epoch entries (``format.epoch_file``), at most the last 64: epoch
                    u32 (4), start offset u64 (8) each
    tag 3 endpoint  its client (gRPC) endpoint "host:port" in UTF-8, at most 255 bytes; an
                    empty host: the host the peer dialled for replication

A slave that sent fields takes status frames from then on (``format.ha_frame``): frames at
offset -1 whose bytes are the master's node and endpoint fields, sent when they change.

Nothing here does I/O; ``replication.handshake`` runs the exchange.
"""

from __future__ import annotations

import hashlib
import hmac
import struct
from typing import NamedTuple

from mqstore.format.epoch_file import EpochEntry, EpochFileError, check_entries
from mqstore.format.ha_frame import FrameError

MAGIC = b"\xe1MQH"
HEADER = struct.Struct(">4sBBH")
HEADER_BYTES = HEADER.size  # 8
VERSION = 1
OPEN, CHALLENGE, PROOF, RESULT = 1, 2, 3, 4
KIND_NAMES = {OPEN: "open", CHALLENGE: "challenge", PROOF: "proof", RESULT: "result"}
AUTH_NONE, AUTH_HMAC = 0, 1
ACCEPTED, REFUSED, BUSY, UNSUPPORTED = 0, 1, 2, 3
STATUS_NAMES = {ACCEPTED: "accepted", REFUSED: "refused", BUSY: "busy",
                UNSUPPORTED: "unsupported"}
NONCE_BYTES = MAC_BYTES = 32
SLAVE_LABEL = b"mqstore-ha slave proof"
MASTER_LABEL = b"mqstore-ha master proof"
REASON_MAX_BYTES = 1024
BODY_MAX_BYTES = 4096  # what a reader holds of one message; the u16 length allows 65535
_CHALLENGE = struct.Struct(">B3x32s")
_RESULT_HEAD = struct.Struct(">BxH")
NO_MAC = bytes(MAC_BYTES)


class HelloError(FrameError):
    """Bytes that are not mqstore's HA handshake: the connection is dropped."""


class Header(NamedTuple):
    kind: int
    version: int
    length: int


class Challenge(NamedTuple):
    auth: int
    nonce: bytes


class Proof(NamedTuple):
    nonce: bytes
    mac: bytes


class Result(NamedTuple):
    status: int
    reason: str
    mac: bytes


def _message(kind: int, version: int, body: bytes) -> bytes:
    if not 1 <= version <= 255 or len(body) > 0xFFFF:
        raise ValueError(f"handshake {KIND_NAMES[kind]}: version {version} must be 1..255 and "
                         f"the body at most 65535 bytes (got {len(body)})")
    return HEADER.pack(MAGIC, kind, version, len(body)) + body


def is_hello(first: bytes) -> bool:
    """Whether a connection's first 4 bytes open a handshake (else: a classic report)."""
    return first[:4] == MAGIC


def parse_header(data: bytes, max_body: int = BODY_MAX_BYTES) -> Header:
    magic, kind, version, length = HEADER.unpack(data)
    if magic != MAGIC:
        raise HelloError(f"bytes {data.hex()} are not an mqstore HA handshake message (it "
                         f"starts with {MAGIC.hex()}): the peer does not speak the handshake")
    if kind not in KIND_NAMES or version == 0 or length > max_body:
        raise HelloError(f"handshake header (kind {kind}, version {version}, length {length}) "
                         f"breaks the protocol: kinds are 1..4, versions >= 1, a body at most "
                         f"{max_body} bytes")
    return Header(kind, version, length)


def mac(secret: bytes | None, label: bytes, transcript: bytes) -> bytes:
    """HMAC-SHA256 of ``label + transcript`` under ``secret``; 32 zeros without a secret."""
    if secret is None:
        return NO_MAC
    return hmac.new(secret, label + transcript, hashlib.sha256).digest()


def macs_equal(a: bytes, b: bytes) -> bool:
    return hmac.compare_digest(a, b)


# -- the messages ---------------------------------------------------------------------------
def encode_open(version: int = VERSION) -> bytes:
    return _message(OPEN, version, b"")


def encode_challenge(version: int, auth: int, nonce: bytes) -> bytes:
    _check_nonce(nonce)
    return _message(CHALLENGE, version, _CHALLENGE.pack(auth, nonce))


def decode_challenge(body: bytes) -> Challenge:
    if len(body) < _CHALLENGE.size:
        raise HelloError(f"handshake challenge of {len(body)} bytes: it holds at least "
                         f"{_CHALLENGE.size}")
    auth, nonce = _CHALLENGE.unpack_from(body)
    if auth not in (AUTH_NONE, AUTH_HMAC):
        raise HelloError(f"handshake challenge asks for auth {auth}: this slave knows 0 (a "
                         f"TLS client certificate) and 1 (HMAC-SHA256 with the shared secret)")
    return Challenge(auth, nonce)


def encode_proof(version: int, nonce: bytes, secret: bytes | None, transcript: bytes,
                 fields: bytes = b"") -> bytes:
    """The slave's proof; ``transcript``: the open and the challenge, as sent; ``fields``:
    NOTE [ Node fields ] (``encode_fields``)."""
    _check_nonce(nonce)
    head = HEADER.pack(MAGIC, PROOF, version, NONCE_BYTES + len(fields) + MAC_BYTES) + nonce
    head += fields
    return head + mac(secret, SLAVE_LABEL, transcript + head)


def decode_proof(body: bytes) -> Proof:
    if len(body) < NONCE_BYTES + MAC_BYTES:
        raise HelloError(f"handshake proof of {len(body)} bytes: it holds at least "
                         f"{NONCE_BYTES + MAC_BYTES}")
    return Proof(body[:NONCE_BYTES], body[-MAC_BYTES:])


def encode_result(version: int, status: int, reason: str, secret: bytes | None,
                  transcript: bytes, fields: bytes = b"") -> bytes:
    """The master's answer; ``transcript``: open, challenge and proof as exchanged (the mac is
    zeros without a secret, or for a refusal); ``fields``: NOTE [ Node fields ]."""
    text = reason.encode()[:REASON_MAX_BYTES]
    body = _RESULT_HEAD.pack(status, len(text)) + text + fields
    head = HEADER.pack(MAGIC, RESULT, version, len(body) + MAC_BYTES) + body
    key = secret if status == ACCEPTED else None
    return head + mac(key, MASTER_LABEL, transcript + head)


def decode_result(body: bytes) -> Result:
    fixed = _RESULT_HEAD.size + MAC_BYTES
    if len(body) < fixed:
        raise HelloError(f"handshake result of {len(body)} bytes: it holds at least {fixed}")
    status, n = _RESULT_HEAD.unpack_from(body)
    if _RESULT_HEAD.size + n + MAC_BYTES > len(body):
        raise HelloError(f"handshake result: a reason of {n} bytes does not fit its "
                         f"{len(body)}-byte body")
    reason = bytes(body[_RESULT_HEAD.size:_RESULT_HEAD.size + n]).decode(errors="replace")
    return Result(status, reason, body[-MAC_BYTES:])


def proof_fields(body: bytes) -> bytes:
    """The fields of a proof's body (NOTE [ Node fields ]): between the nonce and the mac."""
    return bytes(body[NONCE_BYTES:-MAC_BYTES])


def result_fields(body: bytes) -> bytes:
    """The fields of a result's body: between the reason and the mac."""
    (_status, n) = _RESULT_HEAD.unpack_from(body)
    return bytes(body[_RESULT_HEAD.size + n:-MAC_BYTES])


# -- node fields (NOTE [ Node fields ]) -----------------------------------------------------
FIELD_NODE, FIELD_EPOCHS, FIELD_ENDPOINT = 1, 2, 3
ROLE_SLAVE, ROLE_MASTER, ROLE_FENCED = 0, 1, 2
ROLE_NAMES = {ROLE_SLAVE: "slave", ROLE_MASTER: "master", ROLE_FENCED: "fenced master"}
FLAG_PROBE = 1
MAX_EPOCHS = 64
ENDPOINT_MAX_BYTES = 255
_FIELD = struct.Struct(">BH")
_NODE = struct.Struct(">BBQq")
_EPOCH = struct.Struct(">IQ")


class NodeInfo(NamedTuple):
    """What a node says of itself in its fields."""

    role: int
    end: int
    confirmed: int = -1
    epochs: tuple[EpochEntry, ...] = ()
    endpoint: str = ""
    probe: bool = False

    @property
    def last_epoch(self) -> int:
        return self.epochs[-1].epoch if self.epochs else 0


def encode_fields(info: NodeInfo, *, node: bool = True, epochs: bool = True,
                  endpoint: bool = True) -> bytes:
    out = b""
    if node:
        value = _NODE.pack(info.role, FLAG_PROBE if info.probe else 0, info.end, info.confirmed)
        out += _FIELD.pack(FIELD_NODE, len(value)) + value
    if epochs:
        value = b"".join(_EPOCH.pack(e.epoch, e.start) for e in info.epochs[-MAX_EPOCHS:])
        out += _FIELD.pack(FIELD_EPOCHS, len(value)) + value
    if endpoint:
        value = info.endpoint.encode()
        if len(value) > ENDPOINT_MAX_BYTES:
            raise ValueError(f"endpoint {info.endpoint!r} is longer than "
                             f"{ENDPOINT_MAX_BYTES} bytes in UTF-8")
        out += _FIELD.pack(FIELD_ENDPOINT, len(value)) + value
    return out


def decode_fields(data: bytes, known: NodeInfo | None = None) -> NodeInfo | None:
    """The node fields of ``data`` over ``known`` (the fields last heard); None when there are
    none (a peer that sends no fields). HelloError for fields that break their layout."""
    if not data:
        return known
    info = known or NodeInfo(ROLE_SLAVE, 0)
    seen = False
    at = 0
    while at < len(data):
        if len(data) - at < _FIELD.size:
            raise HelloError(f"node fields: {len(data) - at} byte(s) left where a field's "
                             f"3-byte tag and length belong")
        tag, n = _FIELD.unpack_from(data, at)
        value = bytes(data[at + _FIELD.size:at + _FIELD.size + n])
        if len(value) != n:
            raise HelloError(f"node field {tag} says {n} bytes; {len(value)} follow")
        at += _FIELD.size + n
        info, known_tag = _field(info, tag, value)
        seen = seen or known_tag
    return info if seen or known is not None else None


def _field(info: NodeInfo, tag: int, value: bytes) -> tuple[NodeInfo, bool]:
    if tag == FIELD_NODE:
        if len(value) < _NODE.size:
            raise HelloError(f"node field of {len(value)} bytes: it holds {_NODE.size}")
        role, flags, end, confirmed = _NODE.unpack_from(value)
        if role not in ROLE_NAMES or end > (1 << 63) - 1:
            raise HelloError(f"node field: role {role} or log end {end} out of range")
        return info._replace(role=role, probe=bool(flags & FLAG_PROBE), end=end,
                             confirmed=confirmed), True
    if tag == FIELD_EPOCHS:
        if len(value) % _EPOCH.size or len(value) > MAX_EPOCHS * _EPOCH.size:
            raise HelloError(f"epochs field of {len(value)} bytes: it holds up to "
                             f"{MAX_EPOCHS} entries of {_EPOCH.size}")
        try:
            epochs = check_entries(EpochEntry(*_EPOCH.unpack_from(value, i))
                                   for i in range(0, len(value), _EPOCH.size))
        except EpochFileError as exc:
            raise HelloError(f"epochs field: {exc}") from None
        return info._replace(epochs=tuple(epochs)), True
    if tag == FIELD_ENDPOINT:
        try:
            return info._replace(endpoint=value.decode()), True
        except UnicodeDecodeError:
            raise HelloError("endpoint field is not UTF-8") from None
    return info, False  # a later tag: skipped


def _check_nonce(nonce: bytes) -> None:
    if len(nonce) != NONCE_BYTES:
        raise ValueError(f"a handshake nonce is {NONCE_BYTES} bytes, not {len(nonce)}")


__all__ = ["MAGIC", "HEADER", "HEADER_BYTES", "VERSION", "OPEN", "CHALLENGE", "PROOF",
           "RESULT", "KIND_NAMES", "AUTH_NONE", "AUTH_HMAC", "ACCEPTED", "REFUSED", "BUSY",
           "UNSUPPORTED", "STATUS_NAMES", "NONCE_BYTES", "MAC_BYTES", "SLAVE_LABEL",
           "MASTER_LABEL", "BODY_MAX_BYTES", "REASON_MAX_BYTES", "NO_MAC", "HelloError",
           "Header", "Challenge", "Proof", "Result", "is_hello", "parse_header", "mac",
           "macs_equal", "encode_open", "encode_challenge", "decode_challenge", "encode_proof",
           "decode_proof", "encode_result", "decode_result", "proof_fields", "result_fields",
           "FIELD_NODE", "FIELD_EPOCHS", "FIELD_ENDPOINT", "ROLE_SLAVE", "ROLE_MASTER",
           "ROLE_FENCED", "ROLE_NAMES", "FLAG_PROBE", "MAX_EPOCHS", "NodeInfo",
           "encode_fields", "decode_fields"]

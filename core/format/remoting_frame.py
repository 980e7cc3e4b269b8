"""RocketMQ's remoting frames (``RemotingCommand``), as RocketMQ 4.9.8 speaks them.

One frame on the wire (big-endian)::

    +--------------+---------------------------+-------------------+----------------+
    | length (4)   | serialize type (1)        | header            | body           |
    |              | header length  (3)        | header length B   |                |
    +--------------+---------------------------+-------------------+----------------+
      length = 4 + header length + body length; at most ``MAX_FRAME_BYTES`` (16 MiB)

The header is JSON (type 0; fastjson's output, standard JSON for headers) or RocketMQ's own
binary form (type 1, ``RocketMQSerializable``)::

    code int16 | language byte | version int16 | opaque int32 | flag int32
    | remark length int32 + UTF-8 (0: none)
    | ext length int32 | (key length int16 + key, value length int32 + value)...

``flag`` bit 0 marks a response, bit 1 a oneway request (no response). Responses copy the
request's ``opaque``. The header fields of a request travel as strings in ``extFields``
(the C++ client sends some as JSON numbers and booleans; they are read as strings, as the
broker's Java parsers read them). Nothing here does I/O.
"""

from __future__ import annotations

import json
import struct

MAX_FRAME_BYTES = 16 << 20  # NettyDecoder's FRAME_MAX_LENGTH
JSON, ROCKETMQ = 0, 1  # serialize types
RESPONSE_FLAG, ONEWAY_FLAG = 1, 2
LANGUAGES = ("JAVA", "CPP", "DOTNET", "PYTHON", "DELPHI", "ERLANG", "RUBY", "OTHER", "HTTP",
             "GO", "PHP", "OMS", "RUST")
LANGUAGE_CODES = {name: i for i, name in enumerate(LANGUAGES)}
BROKER_VERSION = 409  # MQVersion.Version.V4_9_8.ordinal(): what a 4.9.8 broker answers with

_LENGTH = struct.Struct(">i")
_PREFIX = struct.Struct(">ii")
_BIN_FIXED = struct.Struct(">hbhii")  # code, language, version, opaque, flag
_INT = struct.Struct(">i")
_SHORT = struct.Struct(">h")
_TYPE_NAMES = {JSON: "JSON", ROCKETMQ: "ROCKETMQ"}


class FrameError(ValueError):
    """Bytes that are not a remoting frame: the connection is closed after saying why."""


class Command:
    """One ``RemotingCommand``: header fields, ``ext`` (extFields, str -> str) and ``body``."""

    __slots__ = ("code", "language", "version", "opaque", "flag", "remark", "ext", "body",
                 "serialize_type", "encoded_header")

    def __init__(self, code: int, *, opaque: int = 0, flag: int = 0, remark: str | None = None,
                 ext: dict[str, str] | None = None, body: bytes | None = None,
                 language: str = "JAVA", version: int = BROKER_VERSION,
                 serialize_type: int = JSON) -> None:
        self.code, self.opaque, self.flag, self.remark = code, opaque, flag, remark
        self.ext = ext if ext is not None else {}
        self.body = body
        self.language, self.version, self.serialize_type = language, version, serialize_type
        # the header's bytes when a caller built them from a template (``JsonTemplate``):
        # exactly what encoding the fields above gives
        self.encoded_header: bytes | None = None

    @property
    def is_response(self) -> bool:
        return bool(self.flag & RESPONSE_FLAG)

    @property
    def is_oneway(self) -> bool:
        return bool(self.flag & ONEWAY_FLAG)

    def response(self, code: int, remark: str | None = None, ext: dict | None = None,
                 body: bytes | None = None) -> "Command":
        """The response to this request: its opaque and serialize type, the broker's
        language and version."""
        return Command(code, opaque=self.opaque, flag=RESPONSE_FLAG, remark=remark, ext=ext,
                       body=body, serialize_type=self.serialize_type)

    def __repr__(self) -> str:
        kind = "response" if self.is_response else ("oneway" if self.is_oneway else "request")
        return (f"Command({kind} code={self.code} opaque={self.opaque} remark={self.remark!r} "
                f"ext={self.ext!r} body={len(self.body or b'')} bytes)")


# -- frames ------------------------------------------------------------------------------
def frame_length(prefix: bytes, max_bytes: int = MAX_FRAME_BYTES) -> int:
    """The length field of a frame (what follows the 4 bytes of ``prefix``), checked."""
    (length,) = _LENGTH.unpack(prefix)
    if length < 4 or length > max_bytes:
        raise FrameError(f"frame length {length} must be 4..{max_bytes} bytes (the header "
                         f"length field and header, then the body)")
    return length


def decode(payload) -> Command:
    """A command from a frame's bytes after the length field."""
    if len(payload) < 4:
        raise FrameError(f"frame of {len(payload)} bytes has no header length field")
    (mark,) = _INT.unpack_from(payload, 0)
    kind, header_len = (mark >> 24) & 0xFF, mark & 0xFFFFFF
    if 4 + header_len > len(payload):
        raise FrameError(f"header length {header_len} runs past the frame's {len(payload)} "
                         f"bytes")
    header = bytes(payload[4:4 + header_len])
    if kind == JSON:
        cmd = _decode_json(header)
    elif kind == ROCKETMQ:
        cmd = _decode_binary(header)
    else:
        raise FrameError(f"serialize type {kind} is neither JSON (0) nor ROCKETMQ (1)")
    body = payload[4 + header_len:]
    cmd.body = bytes(body) if len(body) else None
    return cmd


def _header(cmd: Command) -> bytes:
    header = cmd.encoded_header
    if header is not None:
        return header
    return _encode_binary(cmd) if cmd.serialize_type == ROCKETMQ else _encode_json(cmd)


def encode(cmd: Command) -> bytes:
    """The whole frame of ``cmd``, length field first."""
    header = _header(cmd)
    body = cmd.body or b""
    return _PREFIX.pack(4 + len(header) + len(body),
                        (cmd.serialize_type << 24) | len(header)) + header + body


def encode_parts(cmd: Command) -> tuple[bytes, bytes]:
    """``encode`` as the frame's head (length, header) and its body, so a large body is
    written as it is, not copied behind the header."""
    header = _header(cmd)
    body = cmd.body or b""
    head = _PREFIX.pack(4 + len(header) + len(body), (cmd.serialize_type << 24) | len(header))
    return head + header, body


# -- JSON headers ------------------------------------------------------------------------
def _text(value) -> str:
    """An extFields value as the broker's parsers see it."""
    if isinstance(value, str):
        return value
    if value is True or value is False:
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (int, float)):
        return str(value)
    raise FrameError(f"extFields value {value!r} is not a string, number or boolean")


_INT32_MIN, _INT32_MAX = -(1 << 31), (1 << 31) - 1


def _int_field(doc: dict, name: str, default: int | None) -> int:
    value = doc.get(name, default)
    if type(value) is not int or not _INT32_MIN <= value <= _INT32_MAX:
        raise FrameError(f"header field {name!r} is {value!r}: it must be an integer "
                         f"{_INT32_MIN}..{_INT32_MAX}")
    return value


_raw_decode = json.JSONDecoder().raw_decode


_JSON_SPACE = " \t\n\r"  # the whitespace JSON allows around a value (json's WHITESPACE)


def _parse_json(header: bytes):
    """``json.loads(header)``, without its encoding sniffing and copies for the usual header
    (UTF-8 text that is one JSON value, nothing before it, at most JSON's whitespace after
    it: the C++ client ends its headers with a newline); any other goes through
    ``json.loads`` itself, so both give the same value or the same error."""
    try:
        text = header.decode()
        doc, end = _raw_decode(text)
        if end == len(text) or not text[end:].strip(_JSON_SPACE):
            return doc
    except (ValueError, RecursionError):
        pass
    return json.loads(header)


def _decode_json(header: bytes) -> Command:
    try:
        doc = _parse_json(header)
    except (ValueError, RecursionError) as exc:
        raise FrameError(f"JSON header does not parse: {exc}") from None
    if not isinstance(doc, dict):
        raise FrameError(f"JSON header is a {type(doc).__name__}, not an object")
    ext = doc.get("extFields")
    if ext is None:
        ext = {}
    elif not isinstance(ext, dict):
        raise FrameError(f"extFields is a {type(ext).__name__}, not an object")
    else:
        # the C++ client's numbers and booleans, made text in place (the order is kept;
        # only values change, so iterating meanwhile is safe)
        for key, value in ext.items():
            if type(value) is not str:
                ext[key] = _text(value)
    language = doc.get("language", "JAVA")
    if isinstance(language, int) and 0 <= language < len(LANGUAGES):
        language = LANGUAGES[language]
    if not isinstance(language, str):
        raise FrameError(f"header field 'language' is {language!r}, not a name")
    remark = doc.get("remark")
    if remark is not None and not isinstance(remark, str):
        raise FrameError(f"header field 'remark' is {remark!r}, not a string")
    get = doc.get
    code, opaque, flag, version = get("code"), get("opaque", 0), get("flag", 0), get("version", 0)
    if not (type(code) is int and type(opaque) is int and type(flag) is int
            and type(version) is int and _INT32_MIN <= code <= _INT32_MAX
            and _INT32_MIN <= opaque <= _INT32_MAX and _INT32_MIN <= flag <= _INT32_MAX
            and _INT32_MIN <= version <= _INT32_MAX):  # the checks again, for their errors
        code, opaque = _int_field(doc, "code", None), _int_field(doc, "opaque", 0)
        flag, version = _int_field(doc, "flag", 0), _int_field(doc, "version", 0)
    return Command(code, opaque=opaque, flag=flag, version=version, remark=remark, ext=ext,
                   language=language, serialize_type=JSON)


_dumps = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), check_circular=False).encode


def _encode_json(cmd: Command) -> bytes:
    # fastjson's order (sorted keys); remark and extFields left out when null, as it does.
    parts = [f'{{"code":{cmd.code}']
    if cmd.ext is not None:
        parts.append(f',"extFields":{_dumps(cmd.ext)}')
    parts.append(f',"flag":{cmd.flag},"language":"{cmd.language}","opaque":{cmd.opaque}')
    if cmd.remark is not None:
        parts.append(f',"remark":{_dumps(cmd.remark)}')
    parts.append(f',"serializeTypeCurrentRPC":"JSON","version":{cmd.version}}}')
    return "".join(parts).encode()


class JsonTemplate:
    """The JSON header of one shape of response, encoded once. ``render(opaque, values)``
    gives the bytes ``_encode_json`` gives for the same command with ``opaque`` and the
    ext fields named in ``holes`` (in that order) set to ``values``, provided no value needs
    JSON escaping (the caller's contract: ASCII letters, digits, commas and the like).

    Built by encoding a probe through ``_encode_json`` and cutting it at the holes, so the
    template cannot drift from the general encoder."""

    __slots__ = ("_pieces",)

    def __init__(self, code: int, ext: dict[str, str], holes: tuple[str, ...],
                 flag: int = RESPONSE_FLAG) -> None:
        marks = {name: f"@@hole{i}@@" for i, name in enumerate(holes)}
        probe = Command(code, flag=flag, ext={k: marks.get(k, v) for k, v in ext.items()})
        probe.opaque = "@@opaque@@"  # type: ignore[assignment] - written as it is
        text = _encode_json(probe).decode()
        cuts = [marks[h] for h in holes] + ["@@opaque@@"]  # opaque follows extFields
        if any(text.count(mark) != 1 for mark in cuts) or not all(
                text.index(x) < text.index(y) for x, y in zip(cuts, cuts[1:])):
            raise ValueError(f"cannot template the header {text!r} at {holes}")
        pieces, rest = [], text
        for mark in cuts:
            head, rest = rest.split(mark)
            pieces.append(head)
        pieces.append(rest)
        self._pieces = tuple(pieces)

    def render(self, opaque: int, values: tuple[str, ...]) -> bytes:
        p = self._pieces
        out = [p[0]]
        for piece, value in zip(p[1:], values):
            out.append(value)
            out.append(piece)
        out.append(str(opaque))
        out.append(p[-1])
        return "".join(out).encode()


# -- binary headers ----------------------------------------------------------------------
def _decode_binary(header: bytes) -> Command:
    try:
        code, lang, version, opaque, flag = _BIN_FIXED.unpack_from(header, 0)
        at = _BIN_FIXED.size
        (n,) = _INT.unpack_from(header, at)
        at += 4
        if n < 0 or at + n > len(header):
            raise FrameError(f"binary header: remark length {n} runs past the header")
        remark = header[at:at + n].decode() if n else None
        at += n
        (n,) = _INT.unpack_from(header, at)
        at += 4
        end = at + n
        if n < 0 or end > len(header):
            raise FrameError(f"binary header: extFields length {n} runs past the header")
        ext = {}
        while at < end:
            (kn,) = _SHORT.unpack_from(header, at)
            key = header[at + 2:at + 2 + kn].decode()
            at += 2 + kn
            (vn,) = _INT.unpack_from(header, at)
            if kn < 0 or vn < 0 or at + 4 + vn > end:
                raise FrameError("binary header: an extFields entry runs past its table")
            ext[key] = header[at + 4:at + 4 + vn].decode()
            at += 4 + vn
    except struct.error:
        raise FrameError("binary header is cut short") from None
    except UnicodeDecodeError as exc:
        raise FrameError(f"binary header holds text that is not UTF-8: {exc}") from None
    language = LANGUAGES[lang] if 0 <= lang < len(LANGUAGES) else "OTHER"
    return Command(code, opaque=opaque, flag=flag, remark=remark, ext=ext, language=language,
                   version=version, serialize_type=ROCKETMQ)


def _encode_binary(cmd: Command) -> bytes:
    out = [_BIN_FIXED.pack(cmd.code, LANGUAGE_CODES.get(cmd.language, 7), cmd.version,
                           cmd.opaque, cmd.flag)]
    remark = cmd.remark.encode() if cmd.remark else b""
    out.append(_INT.pack(len(remark)) + remark)
    table = []
    for key, value in (cmd.ext or {}).items():
        k, v = key.encode(), str(value).encode()
        table.append(_SHORT.pack(len(k)) + k + _INT.pack(len(v)) + v)
    blob = b"".join(table)
    out.append(_INT.pack(len(blob)) + blob)
    return b"".join(out)


def type_name(kind: int) -> str:
    return _TYPE_NAMES.get(kind, str(kind))


__all__ = ["Command", "FrameError", "MAX_FRAME_BYTES", "JSON", "ROCKETMQ", "RESPONSE_FLAG",
           "ONEWAY_FLAG", "BROKER_VERSION", "JsonTemplate", "decode", "encode", "encode_parts",
           "frame_length"]

"""The JSON dialect of RocketMQ's remoting bodies: fastjson's output, which is not always JSON.

fastjson writes a map's keys as they are: an integer key without quotes (``{0:"127.0.0.1:
10911"}``, a route's broker addresses) and an object key as an object (``{{"brokerName":"b",
"queueId":0,"topic":"T"}:{...}}``, the offset tables of topic and consume stats). Python's
``json`` can neither read nor write that, and RocketMQ's C++ client parses a route only in
that form (``{0:...}``). So:

* ``dumps`` writes standard JSON, except that ``int`` keys go unquoted and ``ObjectKey`` keys
  (an object used as a key) are written as objects, as fastjson writes them;
* ``loads`` reads standard JSON and those two extensions, with a small recursive-descent
  parser over ``json``'s own string and number scanners (strings and numbers parse exactly
  as ``json.loads`` parses them); an object key comes back as an ``ObjectKey``.

Both sort nothing: fastjson sorts a bean's fields, so callers build dicts in that order.
"""

from __future__ import annotations

import json
import re
from json.decoder import scanstring

MAX_DEPTH = 64  # nesting a peer's body may have; RocketMQ's bodies nest 4 deep at most


class ObjectKey(tuple):
    """An object used as a map key: its ``(field, value)`` pairs in order (hashable)."""

    __slots__ = ()

    @classmethod
    def of(cls, **fields) -> "ObjectKey":
        return cls(fields.items())

    def as_dict(self) -> dict:
        return dict(self)


_encode_str = json.JSONEncoder(ensure_ascii=False).encode


def dumps(value) -> str:
    """fastjson's text of ``value`` (dicts, lists, tuples, str, int, float, bool, None)."""
    out: list[str] = []
    _write(value, out)
    return "".join(out)


def _write(value, out: list) -> None:
    if isinstance(value, dict):
        out.append("{")
        first = True
        for key, item in value.items():
            if not first:
                out.append(",")
            first = False
            if isinstance(key, ObjectKey):
                _write(key.as_dict(), out)
            elif isinstance(key, bool) or not isinstance(key, (str, int)):
                raise TypeError(f"map key {key!r} must be a str, an int or an ObjectKey")
            elif isinstance(key, int):
                out.append(str(key))
            else:
                out.append(_encode_str(key))
            out.append(":")
            _write(item, out)
        out.append("}")
    elif isinstance(value, (list, tuple)) and not isinstance(value, ObjectKey):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _write(item, out)
        out.append("]")
    elif isinstance(value, ObjectKey):
        _write(value.as_dict(), out)
    elif value is None or isinstance(value, (bool, int, float, str)):
        out.append(_encode_str(value))
    else:
        raise TypeError(f"{type(value).__name__} {value!r} has no JSON form")


_WS = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"(-?(?:0|[1-9]\d*))(\.\d+)?([eE][-+]?\d+)?")
_CONSTANTS = {"true": True, "false": False, "null": None}


class _Parser:
    __slots__ = ("text", "at")

    def __init__(self, text: str) -> None:
        self.text, self.at = text, 0

    def fail(self, what: str) -> ValueError:
        return ValueError(f"fastjson text: {what} at character {self.at}")

    def skip(self) -> str:
        self.at = _WS.match(self.text, self.at).end()
        return self.text[self.at:self.at + 1]

    def value(self, depth: int):
        if depth > MAX_DEPTH:
            raise self.fail(f"nesting deeper than {MAX_DEPTH}")
        c = self.skip()
        if c == "{":
            return self.obj(depth)
        if c == "[":
            return self.array(depth)
        if c == '"':
            s, self.at = scanstring(self.text, self.at + 1)
            return s
        for word, const in _CONSTANTS.items():
            if self.text.startswith(word, self.at):
                self.at += len(word)
                return const
        m = _NUMBER.match(self.text, self.at)
        if m is None or not m.group(0):
            raise self.fail("expected a value")
        self.at = m.end()
        if m.group(2) or m.group(3):
            return float(m.group(0))
        return int(m.group(0))

    def obj(self, depth: int) -> dict:
        self.at += 1
        out: dict = {}
        if self.skip() == "}":
            self.at += 1
            return out
        while True:
            c = self.skip()
            if c == '"':
                key, self.at = scanstring(self.text, self.at + 1)
            elif c == "{":
                key = ObjectKey(self.obj(depth + 1).items())
            else:
                key = self.value(depth + 1)
                if not isinstance(key, int) or isinstance(key, bool):
                    raise self.fail(f"map key {key!r} is not a string, integer or object")
            if self.skip() != ":":
                raise self.fail("expected ':' after a key")
            self.at += 1
            out[key] = self.value(depth + 1)
            c = self.skip()
            self.at += 1
            if c == "}":
                return out
            if c != ",":
                self.at -= 1
                raise self.fail("expected ',' or '}' in an object")

    def array(self, depth: int) -> list:
        self.at += 1
        out: list = []
        if self.skip() == "]":
            self.at += 1
            return out
        while True:
            out.append(self.value(depth + 1))
            c = self.skip()
            self.at += 1
            if c == "]":
                return out
            if c != ",":
                self.at -= 1
                raise self.fail("expected ',' or ']' in an array")


def loads(text: str | bytes):
    """The value of fastjson text (standard JSON included); ValueError saying where not."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        try:
            text = bytes(text).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValueError(f"fastjson text is not UTF-8: {exc}") from None
    parser = _Parser(text)
    try:
        value = parser.value(0)
    except json.JSONDecodeError as exc:
        raise ValueError(f"fastjson text: {exc.msg} at character {exc.pos}") from None
    if parser.skip():
        raise parser.fail("text after the value")
    return value


__all__ = ["ObjectKey", "dumps", "loads", "MAX_DEPTH"]

"""What ``mqstore produce`` reads: message bodies, and the keys and tags a line may carry.

Bodies come from BODY arguments, ``--file`` (a file is one body, taken whole) and ``--lines``
or standard input (a line is one body). Arguments and lines may carry more than the body:

* ``--parse-key SEP``: ``KEYS<SEP>BODY``, split at the first SEP, as
  ``kafka-console-producer --property parse.key=true --property key.separator=SEP`` reads
  them; KEYS is RocketMQ's KEYS property (tokens separated by spaces; empty: no keys).
* ``--json-lines``: one JSON object per line, ``{"body": "...", "tags": "...",
  "keys": ["k1", "k2"], "properties": {"name": "value"}}``, or ``body_base64`` for bytes
  that are not UTF-8 text. ``body`` (or ``body_base64``) is required; a field the command
  does not know is refused by name.

A line that does not parse is refused with its place (``line 7``, ``argument 2``) and why.
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass
from typing import Iterator

import click
from pydantic import BaseModel, ConfigDict, ValidationError, model_validator


class InputError(ValueError):
    """An argument or line that is not what the options say it is."""


@dataclass
class Item:
    """One message to put; None fields take the command's options."""

    where: str  # "argument 2", "line 7" or a file's path: named when it is refused
    body: bytes
    tags: str | None = None
    keys: list[str] | None = None
    properties: dict[str, str] | None = None


class JsonLine(BaseModel):
    """A ``--json-lines`` line."""

    model_config = ConfigDict(extra="forbid", strict=True)
    body: str | None = None
    body_base64: str | None = None
    tags: str | None = None
    keys: list[str] | str | None = None
    properties: dict[str, str] | None = None

    @model_validator(mode="after")
    def _one_body(self) -> "JsonLine":
        if (self.body is None) == (self.body_base64 is None):
            raise ValueError("give exactly one of body and body_base64")
        return self


def read_items(bodies: tuple[str, ...], files: tuple[str, ...], lines: str | None,
               parse_key: str | None, json_lines: bool) -> Iterator[Item]:
    """Every message, in order: BODY arguments, files, then lines."""
    for n, body in enumerate(bodies, 1):
        yield _parse(f"argument {n}", body.encode("utf-8"), parse_key, json_lines)
    for path in files:
        with open(path, "rb") as f:
            yield Item(path, f.read())
    if lines is not None:
        with click.open_file(lines, "rb") as f:
            for n, line in enumerate(f, 1):
                yield _parse(f"line {n}", line.rstrip(b"\r\n"), parse_key, json_lines)


def _parse(where: str, raw: bytes, parse_key: str | None, json_lines: bool) -> Item:
    if json_lines:
        return _json_item(where, raw)
    if parse_key is None:
        return Item(where, raw)
    keys, sep, body = raw.partition(parse_key.encode("utf-8"))
    if not sep:
        raise InputError(f"{where} has no key separator {parse_key!r} (--parse-key: each "
                         f"line is KEYS{parse_key}BODY)")
    return Item(where, body, keys=_text(where, keys, "keys").split())


def _json_item(where: str, raw: bytes) -> Item:
    try:
        line = JsonLine.model_validate_json(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(part) for part in first["loc"])
        raise InputError(f"{where} is not a message as --json-lines takes one: "
                         f"{field + ': ' if field else ''}{first['msg']}") from None
    if line.body_base64 is not None:
        try:
            body = base64.b64decode(line.body_base64, validate=True)
        except binascii.Error as exc:
            raise InputError(f"{where}: body_base64 is not base64 ({exc})") from None
    else:
        body = line.body.encode("utf-8")
    keys = line.keys.split() if isinstance(line.keys, str) else line.keys
    return Item(where, body, tags=line.tags, keys=keys, properties=line.properties)


def _text(where: str, raw: bytes, what: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{where}: its {what} are not UTF-8 ({exc.reason} at byte "
                         f"{exc.start})") from None

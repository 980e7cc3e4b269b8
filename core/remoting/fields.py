"""A request's header fields (``extFields``), read as the broker's Java parsers read them.

Every field travels as a string: ``Integer.parseInt`` and ``Long.parseLong`` take an optional
sign and decimal digits only, ``Boolean.parseBoolean`` is true for "true" in any case and false
for anything else. A field the request header class marks ``@CFNotNull`` that is missing, or a
number that does not parse, refuses the request with SYSTEM_ERROR naming the field, as the
broker's ``decodeCommandCustomHeader`` does.

``SEND_MESSAGE_V2`` and ``SEND_BATCH_MESSAGE`` carry the send header under one-letter names
(``SendMessageRequestHeaderV2``); ``Fields`` reads them by their long names (``V2_KEYS``).
"""

from __future__ import annotations

from mqstore.remoting.codes import RemotingError, Resp

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1

V2_NAMES = {"a": "producerGroup", "b": "topic", "c": "defaultTopic",
            "d": "defaultTopicQueueNums", "e": "queueId", "f": "sysFlag",
            "g": "bornTimestamp", "h": "flag", "i": "properties", "j": "reconsumeTimes",
            "k": "unitMode", "l": "maxReconsumeTimes", "m": "batch", "n": "brokerName"}


V2_KEYS = {long: short for short, long in V2_NAMES.items()}


class Fields:
    """The fields of one request, by their long names; with ``aliases`` (long name -> the
    name on the wire, ``V2_KEYS``) a field is read under its wire name, else its long one,
    without building a renamed copy of the header for each request."""

    __slots__ = ("ext", "aliases")

    def __init__(self, ext: dict[str, str], aliases: dict[str, str] | None = None) -> None:
        self.ext = ext
        self.aliases = aliases

    def _get(self, name: str) -> str | None:
        aliases = self.aliases
        if aliases is not None:
            value = self.ext.get(aliases.get(name, name))
            if value is not None:
                return value
        return self.ext.get(name)

    def text(self, name: str, default: str | None = None, *, required: bool = True) -> str:
        value = self._get(name)
        if value is None:
            if default is not None or not required:
                return default  # type: ignore[return-value]
            raise RemotingError(Resp.SYSTEM_ERROR,
                                f"the custom field <{name}> is null (a required header field)")
        return value

    def _number(self, name: str, lo: int, hi: int, default: int | None, required: bool,
                kind: str) -> int:
        text = self._get(name)
        if text is None:
            if default is not None or not required:
                return default  # type: ignore[return-value]
            raise RemotingError(Resp.SYSTEM_ERROR,
                                f"the custom field <{name}> is null (a required header field)")
        if text.isdigit() and text.isascii():  # the usual case: plain digits
            value = int(text)
        else:
            digits = text[1:] if text[:1] in ("-", "+") else text
            if not (digits.isascii() and digits.isdigit()):
                raise RemotingError(Resp.SYSTEM_ERROR,
                                    f"header field {name} = {text!r} is not a Java {kind}")
            value = int(text)
        if not lo <= value <= hi:
            raise RemotingError(Resp.SYSTEM_ERROR,
                                f"header field {name} = {text!r} is not a Java {kind}")
        return value

    def int32(self, name: str, default: int | None = None, *, required: bool = True) -> int:
        return self._number(name, INT_MIN, INT_MAX, default, required, "int")

    def int64(self, name: str, default: int | None = None, *, required: bool = True) -> int:
        return self._number(name, LONG_MIN, LONG_MAX, default, required, "long")

    def boolean(self, name: str, default: bool = False) -> bool:
        text = self._get(name)
        return default if text is None else text.lower() == "true"


__all__ = ["Fields", "V2_NAMES", "V2_KEYS"]

"""Message properties string: ``name \\x01 value \\x02`` repeated, UTF-8 on disk.

Decoding follows RocketMQ's ``string2messageProperties`` exactly: the text is split on ``\\x02``;
a segment is kept only when it is at least 3 characters long and its first ``\\x01`` has at least
one character before it and one after it. The value is everything after the first ``\\x01`` (so
it may hold more ``\\x01``). Anything else is dropped silently; a last segment without a trailing
``\\x02`` still counts. Later duplicates win, as in a Java ``HashMap``.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

NAME_VALUE_SEPARATOR = "\x01"
PROPERTY_SEPARATOR = "\x02"
TRANSIENT_PREFIX = "__RMQ.TRANSIENT."
MAX_PROPERTIES_BYTES = 32767  # the length field is a signed short

PROPERTY_TAGS = "TAGS"
PROPERTY_KEYS = "KEYS"
PROPERTY_WAIT = "WAIT"
PROPERTY_DELAY = "DELAY"
PROPERTY_UNIQ_KEY = "UNIQ_KEY"
PROPERTY_INNER_NUM = "INNER_NUM"
KEY_SEPARATOR = " "


def check_text(what: str, text: str) -> None:
    """A string bound for the properties block: a separator inside it would end its segment
    early and let the rest read as other properties; a lone surrogate has no UTF-8 form."""
    if NAME_VALUE_SEPARATOR in text or PROPERTY_SEPARATOR in text:
        raise ValueError(f"{what} {text!r} contains a reserved separator (\\x01 or \\x02)")
    if not text.isascii():
        try:
            text.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"{what} {text!r} cannot be stored as UTF-8 ({exc.reason} at index {exc.start})"
            ) from None


def check_property(name: object, value: object) -> None:
    """Reject what RocketMQ's client rejects, plus anything that would corrupt the encoding."""
    if _plain(name) and _plain(value):  # nearly every property: nothing more to check
        return
    if not isinstance(name, str) or not name:
        raise ValueError(f"property name {name!r} must be a non-empty string")
    if not isinstance(value, str) or not value:
        raise ValueError(f"property {name!r} value {value!r} must be a non-empty string")
    check_text("property name", name)
    check_text(f"property {name!r} value", value)


def _plain(text: object) -> bool:
    """True for a non-empty ASCII string without separators: the common case, checked fast."""
    return (type(text) is str and text != "" and text.isascii()
            and NAME_VALUE_SEPARATOR not in text and PROPERTY_SEPARATOR not in text)


def check_tags(tags: object) -> str:
    if _plain(tags):
        return tags  # type: ignore[return-value]
    if not isinstance(tags, str) or not tags:
        raise ValueError(f"tags {tags!r} must be a non-empty string")
    check_text("tags", tags)
    return tags


def check_keys(keys: object) -> Sequence[str]:
    """KEYS tokens of one message: a string (split on spaces) or a collection of strings.

    Tokens are joined with spaces on disk, so a token may hold no space; empty input means no
    keys.
    """
    if type(keys) is list or type(keys) is tuple:
        tokens = keys
    elif isinstance(keys, str):
        tokens = keys.split(KEY_SEPARATOR) if keys else []
    elif isinstance(keys, Collection) and not isinstance(keys, (bytes, bytearray, Mapping)):
        tokens = list(keys)
    else:
        raise ValueError(f"keys {keys!r} must be a string or a collection of strings")
    for key in tokens:
        if not _plain(key) or KEY_SEPARATOR in key:
            _check_key(key)
    return tokens


def _check_key(key: object) -> None:
    if not isinstance(key, str) or not key or KEY_SEPARATOR in key:
        raise ValueError(f"key {key!r} must be a non-empty string without spaces "
                         f"(KEYS tokens are separated by spaces)")
    check_text("key", key)


def encode_properties(properties: Mapping[str, str]) -> str:
    """Encode a checked mapping; transient names are never stored."""
    return "".join(
        f"{name}\x01{value}\x02"
        for name, value in properties.items()
        if not name.startswith(TRANSIENT_PREFIX)
    )


def decode_properties(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for segment in text.split(PROPERTY_SEPARATOR):
        cut = segment.find(NAME_VALUE_SEPARATOR)
        if len(segment) >= 3 and 0 < cut < len(segment) - 1:
            out[segment[:cut]] = segment[cut + 1 :]
    return out


def _forgets_text(change):
    def changed(self, *args, **kwargs):
        self.text = None
        return change(self, *args, **kwargs)
    changed.__name__ = change.__name__
    return changed


class EncodedProperties(dict):
    """Properties that arrived encoded, with that text: ``text == encode_properties(self)``,
    every name and value non-empty ASCII without separators, no transient name, no name
    twice. Made only by ``decode_encoded``. A put stores ``text`` as it is rather than
    checking and encoding each property again; a change (a ``before_append`` hook adding a
    property) sets ``text`` to None, and the put then takes the general way."""

    __slots__ = ("text",)
    text: str | None

    __setitem__ = _forgets_text(dict.__setitem__)
    __delitem__ = _forgets_text(dict.__delitem__)
    __ior__ = _forgets_text(dict.__ior__)
    clear = _forgets_text(dict.clear)
    pop = _forgets_text(dict.pop)
    popitem = _forgets_text(dict.popitem)
    setdefault = _forgets_text(dict.setdefault)
    update = _forgets_text(dict.update)

    def __reduce__(self):
        return dict, (dict(self),)  # a copy elsewhere is a plain dict


def decode_encoded(text: str, name: str, value: str) -> EncodedProperties | None:
    """``decode_properties(text)`` with ``name`` set to ``value`` after the others, as
    ``EncodedProperties`` whose ``text`` is ``text`` followed by that property; None when
    ``text`` is not exactly what ``encode_properties`` gives for what it decodes to (a
    malformed or repeated segment, a transient or non-ASCII name or value, ``name`` there
    already) or ``name``/``value`` are not plain: then decode it the general way."""
    if not (text.isascii() and _plain(name) and _plain(value)):
        return None
    if text and text[-1] != PROPERTY_SEPARATOR:
        return None
    segments = text.split(PROPERTY_SEPARATOR)
    segments.pop()  # after the last separator: "" (or all of an empty text)
    if text.count(NAME_VALUE_SEPARATOR) != len(segments) or TRANSIENT_PREFIX in text:
        return None
    out = EncodedProperties()
    fill = dict.__setitem__
    for segment in segments:
        cut = segment.find(NAME_VALUE_SEPARATOR)
        if not 0 < cut < len(segment) - 1:
            return None
        fill(out, segment[:cut], segment[cut + 1:])
    if len(out) != len(segments) or name in out:
        return None
    fill(out, name, value)
    out.text = f"{text}{name}{NAME_VALUE_SEPARATOR}{value}{PROPERTY_SEPARATOR}"
    return out


def find_property(raw: bytes, name: bytes) -> bytes | None:
    """Value of ``name`` in encoded properties without decoding the rest (dispatch hot path).

    Gives the same answer as ``decode_properties(raw.decode()).get(name)``: the last segment
    whose key is exactly ``name`` and whose value is non-empty.
    """
    probe = name + b"\x01"
    found = None
    start = 0
    while True:
        at = raw.find(probe, start)
        if at < 0:
            return found
        if at == 0 or raw[at - 1] == 2:
            begin = at + len(probe)
            end = raw.find(b"\x02", begin)
            if end < 0:
                end = len(raw)
            if end > begin:
                found = raw[begin:end]
        start = at + 1

"""The index keys of many encoded property strings at once (UNIQ_KEY, then each KEYS token).

Properties are ``name\\x01value`` segments joined by ``\\x02``. For a list of them this finds,
with array passes over their concatenation, what decoding each one would give: the last
non-empty ``UNIQ_KEY`` value and the space-separated tokens of the last non-empty ``KEYS``
value, in that order per message.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from mqstore.format.properties import PROPERTY_KEYS, PROPERTY_UNIQ_KEY

NAME_SEP, SEGMENT_SEP, SPACE = 1, 2, 32
_UNIQ_KEY_AT, _KEYS_AT = PROPERTY_UNIQ_KEY.encode() + b"\x01", PROPERTY_KEYS.encode() + b"\x01"


class KeyRanges(NamedTuple):
    data: np.ndarray  # the concatenated properties (uint8)
    message: np.ndarray  # index into the input list of each key
    start: np.ndarray  # where each key's bytes start in ``data``
    length: np.ndarray  # their length


def _find(data: np.ndarray, pattern: bytes) -> np.ndarray:
    if len(data) < len(pattern):
        return np.empty(0, dtype=np.int64)
    last = len(data) - len(pattern) + 1
    at = np.flatnonzero(data[:last] == pattern[0])
    for j in range(1, len(pattern)):
        at = at[data[at + j] == pattern[j]]
    return at


def last_values(data, starts, ends, seps, name: bytes):
    """(message, value start, value end) of the last non-empty ``name`` value per message:
    what ``properties.find_property`` finds in each, for messages whose properties lie at
    ``[starts, ends)`` of ``data`` (``seps``: where ``data`` holds ``\\x02``)."""
    pos = _find(data, name + b"\x01")
    msg = np.searchsorted(ends, pos, side="right")
    if not len(pos):
        return msg, pos, pos
    at_segment = (pos == starts[msg]) | (data[np.maximum(pos - 1, 0)] == SEGMENT_SEP)
    pos, msg = pos[at_segment], msg[at_segment]
    begin = pos + len(name) + 1
    # the value ends at the next segment separator or with its message's properties
    bounded = np.append(seps, len(data))
    end = np.minimum(bounded[np.searchsorted(seps, begin)], ends[msg])
    full = end > begin
    msg, begin, end = msg[full], begin[full], end[full]
    last = np.ones(len(msg), dtype=bool)  # occurrences ascend, so the last of a run wins
    last[:-1] = msg[1:] != msg[:-1]
    return msg[last], begin[last], end[last]


def key_ranges(properties: list[bytes]) -> KeyRanges:
    lengths = np.fromiter(map(len, properties), dtype=np.int64, count=len(properties))
    ends = np.cumsum(lengths)
    starts = ends - lengths
    data = np.frombuffer(b"".join(properties), dtype=np.uint8)
    seps = np.flatnonzero(data == SEGMENT_SEP)
    u_msg, u_begin, u_end = last_values(data, starts, ends, seps, PROPERTY_UNIQ_KEY.encode())
    k_msg, k_begin, k_end = last_values(data, starts, ends, seps, PROPERTY_KEYS.encode())
    # Tokens lie between consecutive cut points of one value: the byte before it, its spaces,
    # its end. Values never overlap, so each value's cuts are contiguous once sorted.
    spaces = np.flatnonzero(data == SPACE) if len(k_begin) else np.empty(0, dtype=np.int64)
    owner = np.searchsorted(k_begin, spaces, side="right") - 1
    inside = (owner >= 0) & (spaces < k_end[np.maximum(owner, 0)])
    spaces, owner = spaces[inside], owner[inside]
    value_ids = np.arange(len(k_begin))
    cuts = np.concatenate([k_begin - 1, spaces, k_end])
    labels = np.concatenate([value_ids, owner, value_ids])
    order = np.argsort(cuts, kind="stable")
    cuts, labels = cuts[order], labels[order]
    pair = labels[1:] == labels[:-1]
    t_begin = cuts[:-1][pair] + 1
    t_len = cuts[1:][pair] - t_begin
    t_msg = k_msg[labels[:-1][pair]]
    keep = t_len > 0
    t_begin, t_len, t_msg = t_begin[keep], t_len[keep], t_msg[keep]
    # Per message: UNIQ_KEY first, then the tokens in order (as a per-message walk gives).
    message = np.concatenate([u_msg, t_msg])
    start = np.concatenate([u_begin, t_begin])
    length = np.concatenate([u_end - u_begin, t_len])
    kind = np.concatenate([np.zeros(len(u_msg), np.int8), np.ones(len(t_msg), np.int8)])
    order = np.lexsort((start, kind, message))
    return KeyRanges(data, message[order], start[order], length[order])


def record_keys(properties: bytes) -> list[bytes]:
    """The keys ``key_ranges`` finds in one record's properties, in its order: the record's
    UNIQ_KEY, then its KEYS tokens (for a few records, cheaper than the array passes). As
    ``properties.find_property`` reads a name: at a segment's start, the last non-empty value
    wins."""
    uniq = keys = None
    for segment in properties.split(b"\x02"):
        if segment.startswith(_UNIQ_KEY_AT):
            if len(segment) > len(_UNIQ_KEY_AT):
                uniq = segment[len(_UNIQ_KEY_AT):]
        elif segment.startswith(_KEYS_AT) and len(segment) > len(_KEYS_AT):
            keys = segment[len(_KEYS_AT):]
    out = [uniq] if uniq is not None else []
    if keys is not None:
        out += [token for token in keys.split(b" ") if token]
    return out

"""The string fields of served rows, decoded in bulk: hosts, msg ids, properties, tags, keys.

``MessageStore.read`` serves a queue's rows as numeric columns and packed bodies; the fields
it leaves out live in each record's variable part:

    +------------------------------+-----------------------------------------------+
    | field                        | where, for the record at commit-log offset p  |
    +------------------------------+-----------------------------------------------+
    | born host   addr(4|16)+port  | p + 48                                        |
    | store host  addr(4|16)+port  | p + 48 + born host width (8|20) + 8           |
    | msg id                       | hex(store addr + port(int32) + p(int64))      |
    | properties                   | the record's PROPERTIES block                 |
    | tags / keys                  | the TAGS / KEYS properties; keys split on ' ' |
    +------------------------------+-----------------------------------------------+

``record_fields`` reads them for many rows at once from the mapped segments with numpy: the
properties block is found by arithmetic over the batch's sizes, flags and body lengths and
split on its separators as whole-buffer index arithmetic (a batch whose rows share one block
parses it once); hosts are formatted once per distinct host. Strings come back in Arrow's
layout (``Strings``: one uint8 buffer, n + 1 int32 offsets), keys as lists and properties as
maps of them, so a columnar consumer wraps the buffers without a Python object per row.

Every answer equals the one ``StoredMessage`` gives for the same record. Rows whose
properties are not valid UTF-8, or may repeat a name (later duplicates win), are decoded by
``decode_properties`` one by one: rare rows, exact answers. The records must be ones a read
just served (checked); a record that no longer reads as one raises ``CorruptRecordError``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from mqstore.errors import CorruptRecordError
from mqstore.format.hosts import Host
from mqstore.format.properties import PROPERTY_KEYS, PROPERTY_TAGS, decode_properties
from mqstore.format.record import (
    MAGIC_V2, POS_BORN_HOST, POS_MAGIC, SYSFLAG_BORNHOST_V6, SYSFLAG_STOREHOST_V6,
)
from mqstore.format.record_rows import HEADER_V4_BYTES, rows, segment_bytes

_NAME_VALUE = 1  # \x01
_PROPERTY_END = 2  # \x02
_KEY_SEPARATOR = 32  # ' '
# Two upper-case hex digits per byte value, as one uint16 each (in memory order).
_HEX_PAIRS = np.frombuffer(b"".join(b"%02X" % b for b in range(256)), dtype=np.uint16)
_HOST_BYTES = 20  # a host read as 16 address bytes + port, whatever its family (see _hosts)


class Strings(NamedTuple):
    """One string per row in Arrow's layout; ``valid`` is None when no row is null."""

    data: np.ndarray  # uint8, UTF-8
    offsets: np.ndarray  # int32, n + 1, from 0
    valid: np.ndarray | None = None  # bool per row

    @property
    def count(self) -> int:  # not __len__: a NamedTuple's own length is its field count
        return len(self.offsets) - 1

    def to_list(self) -> list[str | None]:
        """The strings as Python objects (tests and small answers; not the bulk path)."""
        raw = self.data.tobytes()
        o = self.offsets.tolist()
        out = [raw[o[i]:o[i + 1]].decode("utf-8") for i in range(self.count)]
        if self.valid is not None:
            out = [s if ok else None for s, ok in zip(out, self.valid.tolist())]
        return out


class StringLists(NamedTuple):
    """A list of strings per row: row i holds ``items[offsets[i]:offsets[i + 1]]``."""

    offsets: np.ndarray  # int32, n + 1
    items: Strings


class StringMaps(NamedTuple):
    """A map per row: row i's entries are ``names``/``values`` ``[offsets[i]:offsets[i + 1]]``,
    in the order ``decode_properties`` gives them."""

    offsets: np.ndarray  # int32, n + 1
    names: Strings
    values: Strings


@dataclass(frozen=True)
class RecordFields:
    born_hosts: Strings  # "ip:port" / "[ipv6]:port", as StoredMessage.born_host
    store_hosts: Strings
    msg_ids: Strings  # offset message ids, upper-case hex
    properties: StringMaps
    tags: Strings  # null where a message has no TAGS
    keys: StringLists  # KEYS tokens, empty ones dropped


def record_fields(commit_log, batch) -> RecordFields:
    """The string fields of a ``ReadBatch``'s rows (``phys_offsets``, ``sizes``,
    ``sys_flags`` and ``body_offsets`` say where each record and its parts lie)."""
    phys = np.asarray(batch.phys_offsets, dtype=np.int64)
    sizes = np.asarray(batch.sizes, dtype=np.int64)
    sysflags = np.asarray(batch.sys_flags, dtype=np.int64)
    body_lens = np.diff(np.asarray(batch.body_offsets, dtype=np.int64))
    parts = [_segment_part(u8, start, phys[lo:hi], sizes[lo:hi], sysflags[lo:hi],
                           body_lens[lo:hi]) for u8, start, lo, hi in
             _segment_runs(commit_log, phys)]
    born = _cat([p[0] for p in parts], np.uint8).reshape(-1, _HOST_BYTES)
    store = _cat([p[1] for p in parts], np.uint8).reshape(-1, _HOST_BYTES)
    props_data = _cat([p[2] for p in parts], np.uint8)
    props_lens = _cat([p[3] for p in parts], np.int64)
    born_v6 = (sysflags & SYSFLAG_BORNHOST_V6) != 0
    store_v6 = (sysflags & SYSFLAG_STOREHOST_V6) != 0
    maps, tags, keys = _properties(props_data, _offsets(props_lens))
    return RecordFields(
        born_hosts=_hosts(born, born_v6), store_hosts=_hosts(store, store_v6),
        msg_ids=_msg_ids(store, store_v6, phys), properties=maps, tags=tags, keys=keys)


# -- reading the records ------------------------------------------------------------------
def _segment_runs(commit_log, phys: np.ndarray):
    """(segment bytes, segment start, lo, hi) for each run of rows in one segment."""
    segs = list(commit_log.segments.segments)
    starts = np.array([s.start for s in segs], dtype=np.int64)
    idx = np.searchsorted(starts, phys, "right") - 1
    breaks = np.flatnonzero(np.diff(idx)) + 1
    bounds = [0, *breaks.tolist(), len(phys)]
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        if lo == hi:
            continue
        i = int(idx[lo])
        seg = segs[i] if i >= 0 else None
        if seg is None or int(phys[hi - 1]) >= seg.end:
            raise CorruptRecordError(f"the record at commit-log offset {int(phys[lo])} is no "
                                     f"longer in the commit log")
        try:
            u8 = segment_bytes(seg.mm)
        except ValueError:  # closed by cleanup since the read
            raise CorruptRecordError(f"the segment holding commit-log offset {int(phys[lo])} "
                                     f"was removed since the read") from None
        yield u8, seg.start, lo, hi


def _segment_part(u8: np.ndarray, start: int, phys, sizes, sysflags, body_lens):
    """Raw born and store hosts (20 bytes each), the properties bytes and their lengths, of
    records a read served: their sizes, flags and body lengths are known to add up, so the
    properties are found by arithmetic plus one look at the magic and topic length."""
    at = phys - start
    born_v6 = (sysflags & SYSFLAG_BORNHOST_V6) != 0
    store_v6 = (sysflags & SYSFLAG_STOREHOST_V6) != 0
    if not (born_v6.any() or store_v6.any()):
        # IPv4 hosts (the common case): the magic, and both hosts in one 24-byte gather
        # (born host, born time, store host).
        v2 = rows(u8, at + POS_MAGIC, 4).view(">i4").ravel() == MAGIC_V2
        hosts = rows(u8, at + POS_BORN_HOST, 24)
        born = np.zeros((len(at), _HOST_BYTES), dtype=np.uint8)
        store = np.zeros((len(at), _HOST_BYTES), dtype=np.uint8)
        born[:, :8] = hosts[:, :8]
        store[:, :8] = hosts[:, 16:]
    else:
        v2 = rows(u8, at + POS_MAGIC, 4).copy().view(">i4").ravel() == MAGIC_V2
        born_at = at + POS_BORN_HOST
        born = rows(u8, born_at, _HOST_BYTES)
        store = rows(u8, born_at + np.where(born_v6, 20, 8) + 8, _HOST_BYTES)
    topic_len_at = at + HEADER_V4_BYTES + 12 * born_v6 + 12 * store_v6 + body_lens
    topic_len = np.where(v2, u8[topic_len_at].astype(np.int64) << 8 | u8[topic_len_at + v2],
                         u8[topic_len_at])
    props_len_at = topic_len_at + 1 + v2 + topic_len
    props_at = props_len_at + 2
    props_len = at + sizes - props_at
    # A topic length damaged since the read may place the properties length past the record
    # (and the segment): it is read only when it lies inside.
    ok = (props_len >= 0) & (at + sizes <= len(u8))
    if ok.all():
        ok = (u8[props_len_at].astype(np.int64) << 8 | u8[props_len_at + 1]) == props_len
    bad = np.flatnonzero(~ok)
    if len(bad):
        raise CorruptRecordError(f"the record at commit-log offset {int(phys[bad[0]])} does "
                                 f"not read as one")
    return born.reshape(-1), store.reshape(-1), _take(u8, props_at, props_len).data, props_len


# -- hosts and msg ids --------------------------------------------------------------------
def _hosts(raw: np.ndarray, v6: np.ndarray) -> Strings:
    """Each row's host as text, formatted once per distinct host (a store has few)."""
    n = len(raw)
    if not n:
        return _empty_strings(0)
    if not v6.any():  # IPv4 only: each host is one 64-bit number (address + port)
        codes = np.ascontiguousarray(raw[:, :8]).view("<u8").ravel()
        if (codes == codes[0]).all():
            return _repeat_text(_host_text(raw[0], False), n)
        uniq, inv = np.unique(codes, return_inverse=True)
        texts = [_host_text(k, False) for k in uniq.view(np.uint8).reshape(-1, 8)]
        return _from_table(texts, inv.ravel())
    key = raw.copy()
    key[~v6, 8:] = 0  # an IPv4 host is 8 bytes; what follows is the next field
    if (key == key[0]).all() and (v6 == v6[0]).all():
        return _repeat_text(_host_text(key[0], bool(v6[0])), n)
    inverse = np.empty(n, dtype=np.int64)
    texts: list[bytes] = []
    for family in (False, True):
        picked = v6 == family
        if not picked.any():
            continue
        if family:
            uniq, inv = np.unique(key[picked], axis=0, return_inverse=True)
        else:  # IPv4 hosts compare as one 64-bit number each
            codes, inv = np.unique(key[picked, :8].copy().view("<u8").ravel(),
                                   return_inverse=True)
            uniq = codes.view(np.uint8).reshape(-1, 8)
        inverse[picked] = inv.ravel() + len(texts)
        texts += [_host_text(k, family) for k in uniq]
    return _from_table(texts, inverse)


def _repeat_text(text: bytes, n: int) -> Strings:
    """``text`` as every one of ``n`` rows."""
    raw = np.frombuffer(text, dtype=np.uint8)
    offsets = np.arange(n + 1, dtype=np.int64) * len(raw)
    return Strings(np.tile(raw, n), offsets.astype(np.int32))


def _from_table(texts: list[bytes], inverse: np.ndarray) -> Strings:
    """Row i's string is ``texts[inverse[i]]``."""
    table = np.frombuffer(b"".join(texts), dtype=np.uint8)
    lens = np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))
    table_at = np.concatenate([[0], np.cumsum(lens)[:-1]])
    return _take(table, table_at[inverse], lens[inverse])


def _host_text(raw: np.ndarray, v6: bool) -> bytes:
    width = 16 if v6 else 4
    port = int(raw[width:width + 4].copy().view(">i4")[0])
    return str(Host(raw[:width].tobytes(), port)).encode()


def _msg_ids(store: np.ndarray, v6: np.ndarray, phys: np.ndarray) -> Strings:
    """hex(store address + int32 port + int64 commit-log offset), upper case: 32 hex digits
    with an IPv4 store host, 56 with an IPv6 one."""
    n = len(phys)
    offset = phys.astype(">i8").view(np.uint8).reshape(n, 8)
    if not v6.any():
        digits = np.empty((n, 16), dtype=np.uint16)  # two hex digits per byte
        host = store[:, :8]
        if n and (host == host[0]).all():  # one store host (the usual case): its hex once
            digits[:, :8] = _HEX_PAIRS[host[0]]
        else:
            digits[:, :8] = _HEX_PAIRS[host]
        digits[:, 8:] = _HEX_PAIRS[offset]
        return Strings(digits.view(np.uint8).reshape(-1),
                       (np.arange(n + 1, dtype=np.int64) * 32).astype(np.int32))
    raw = np.concatenate([store, offset], axis=1)  # 28 bytes: an IPv6 host's layout
    raw[~v6, 8:16] = offset[~v6]
    digits = _HEX_PAIRS[raw].view(np.uint8).reshape(-1)
    return _take(digits, np.arange(n, dtype=np.int64) * 56, np.where(v6, 56, 32))


# -- properties ---------------------------------------------------------------------------
def _properties(data: np.ndarray, offsets: np.ndarray) -> tuple[StringMaps, Strings,
                                                                  StringLists]:
    n = len(offsets) - 1
    width = int(offsets[1] - offsets[0]) if n > 1 else -1
    if width > 0 and len(data) == n * width and (np.diff(offsets) == width).all():
        block = data.reshape(n, width)
        if (block == block[0]).all():  # one tail for a whole batch: parse it once
            return _repeat(_properties(block[0], offsets[:2]), n)
    row, seg_a, seg_b = _split(data, offsets[:-1].astype(np.int64),
                               offsets[1:].astype(np.int64), _PROPERTY_END)
    ones = np.flatnonzero(data == _NAME_VALUE)
    first = np.searchsorted(ones, seg_a)
    cut = ones[np.minimum(first, max(len(ones) - 1, 0))] if len(ones) else seg_a
    # decode_properties keeps a segment whose first \x01 has a character on either side.
    keep = (first < len(ones)) & (cut > seg_a) & (cut < seg_b - 1)
    row, name_at, cut, value_end = row[keep], seg_a[keep], cut[keep], seg_b[keep]
    name_len, value_at = cut - name_at, cut + 1
    src = data
    slow = _rows_to_decode(data, offsets, row, name_at, name_len)
    if len(slow):
        src, row, name_at, name_len, value_at, value_end = _decode_rows(
            data, offsets, slow, row, name_at, name_len, value_at, value_end)
    value_len = value_end - value_at
    names = _take(src, name_at, name_len)
    values = _take(src, value_at, value_len)
    maps = StringMaps(_offsets(np.bincount(row, minlength=n)), names, values)
    padded = np.concatenate([src, np.zeros(4, dtype=np.uint8)])
    tags = _entry_strings(padded, row, name_at, name_len, value_at, value_len, PROPERTY_TAGS, n)
    keys = _keys(padded, row, name_at, name_len, value_at, value_end, n)
    return maps, tags, keys


def _repeat(parsed, n: int):
    """The properties, tags and keys of one row, as the same for ``n`` rows."""
    maps, tags, keys = parsed
    return (StringMaps(_repeat_offsets(maps.offsets, n), _tile(maps.names, n),
                       _tile(maps.values, n)),
            Strings(np.tile(tags.data, n), _repeat_offsets(tags.offsets, n),
                    None if tags.valid is None else np.repeat(tags.valid, n)),
            StringLists(_repeat_offsets(keys.offsets, n), _tile(keys.items, n)))


def _tile(s: Strings, n: int) -> Strings:
    """Every string of ``s``, ``n`` times over, in order."""
    step = int(s.offsets[-1])
    offsets = (s.offsets[:-1][None, :] + step * np.arange(n, dtype=np.int64)[:, None]).ravel()
    return Strings(np.tile(s.data, n), np.append(offsets, step * n).astype(np.int32))


def _repeat_offsets(offsets: np.ndarray, n: int) -> np.ndarray:
    """Offsets of one row's ``k`` items (0, k) as those of ``n`` rows of ``k`` items each."""
    k = int(offsets[-1])
    return (np.arange(n + 1, dtype=np.int64) * k).astype(np.int32)


def _rows_to_decode(data, offsets, row, name_at, name_len) -> np.ndarray:
    """Rows the index arithmetic cannot answer: properties that are not valid UTF-8 (the
    byte rules then differ from the character rules, and bytes are replaced), and rows that
    may name a property twice (a 64-bit digest of each name; a collision only costs time)."""
    slow = []
    if len(data) and not (data < 0x80).all():
        starts = offsets[:-1][np.diff(offsets) > 0]
        torn = (data[starts] & 0xC0) == 0x80 if len(starts) else np.zeros(0, bool)
        try:
            data.tobytes().decode("utf-8")
            whole_ok = True
        except UnicodeDecodeError:
            whole_ok = False
        if not whole_ok or torn.any():
            slow.append(_invalid_utf8_rows(data, offsets))
    if len(row) > 1:
        head = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
        first8 = rows(head, name_at, 8).copy()
        first8[np.arange(8) >= np.minimum(name_len, 8)[:, None]] = 0
        digest = first8.view("<u8").ravel() ^ (name_len.astype(np.uint64) * np.uint64(
            0x9E3779B97F4A7C15))
        key = np.sort((row.astype(np.uint64) << np.uint64(40)) | (digest >> np.uint64(24)))
        same = np.flatnonzero(key[1:] == key[:-1])
        if len(same):
            slow.append((key[same] >> np.uint64(40)).astype(np.int64))
    return np.unique(np.concatenate(slow)) if slow else np.empty(0, dtype=np.int64)


def _invalid_utf8_rows(data, offsets) -> np.ndarray:
    raw = data.tobytes()
    o = offsets.tolist()
    bad = []
    for i in range(len(o) - 1):  # only when the batch holds bytes that are not UTF-8
        try:
            raw[o[i]:o[i + 1]].decode("utf-8")
        except UnicodeDecodeError:
            bad.append(i)
    return np.asarray(bad, dtype=np.int64)


def _decode_rows(data, offsets, slow, row, name_at, name_len, value_at, value_end):
    """Entries of the ``slow`` rows replaced by what decode_properties makes of them, their
    bytes appended after ``data``; entries stay in row order."""
    raw = data.tobytes()
    o = offsets.tolist()
    extra = bytearray()
    add_row, add_name, add_nlen, add_value, add_vend = [], [], [], [], []
    base = len(data)
    for r in slow.tolist():
        text = raw[o[r]:o[r + 1]].decode("utf-8", errors="replace")
        for name, value in decode_properties(text).items():
            nb, vb = name.encode(), value.encode()
            at = base + len(extra)
            extra += nb + vb
            add_row.append(r)
            add_name.append(at)
            add_nlen.append(len(nb))
            add_value.append(at + len(nb))
            add_vend.append(at + len(nb) + len(vb))
    keep = ~np.isin(row, slow)
    ints = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
    row = np.concatenate([row[keep], ints(add_row)])
    order = np.argsort(row, kind="stable")
    src = np.concatenate([data, np.frombuffer(bytes(extra), dtype=np.uint8)])
    return (src, row[order], np.concatenate([name_at[keep], ints(add_name)])[order],
            np.concatenate([name_len[keep], ints(add_nlen)])[order],
            np.concatenate([value_at[keep], ints(add_value)])[order],
            np.concatenate([value_end[keep], ints(add_vend)])[order])


def _named(padded, name_at, name_len, name: str) -> np.ndarray:
    want = np.frombuffer(name.encode(), dtype=np.uint8)
    hit = name_len == len(want)
    if hit.any():
        idx = np.flatnonzero(hit)
        hit[idx] = (rows(padded, name_at[idx], len(want)) == want).all(axis=1)
    return hit


def _entry_strings(padded, row, name_at, name_len, value_at, value_len, name: str,
                   n: int) -> Strings:
    """The value of property ``name`` per row (null where absent); names are unique per row."""
    hit = _named(padded, name_at, name_len, name)
    at = np.zeros(n, dtype=np.int64)
    lens = np.zeros(n, dtype=np.int64)
    valid = np.zeros(n, dtype=bool)
    at[row[hit]] = value_at[hit]
    lens[row[hit]] = value_len[hit]
    valid[row[hit]] = True
    out = _take(padded, at, lens)
    return out._replace(valid=None if valid.all() else valid)


def _keys(padded, row, name_at, name_len, value_at, value_end, n: int) -> StringLists:
    """KEYS split on spaces with empty tokens dropped (StoredMessage.keys)."""
    hit = _named(padded, name_at, name_len, PROPERTY_KEYS)
    k_row = row[hit]
    t_range, t_a, t_b = _split(padded, value_at[hit], value_end[hit], _KEY_SEPARATOR)
    nonempty = t_b > t_a
    t_row = k_row[t_range[nonempty]]
    items = _take(padded, t_a[nonempty], (t_b - t_a)[nonempty])
    return StringLists(_offsets(np.bincount(t_row, minlength=n)), items)


# -- array helpers ------------------------------------------------------------------------
def _split(data: np.ndarray, starts: np.ndarray, ends: np.ndarray, sep: int):
    """``str.split(sep)`` of every range ``[starts[i], ends[i])`` of ``data`` (ranges in
    not overlapping): (range of each piece, piece starts, piece ends), pieces in range order."""
    n = len(starts)
    if n > 1 and (np.diff(starts) < 0).any():  # rows decoded one by one sit after the rest
        order = np.argsort(starts, kind="stable")
        owner, a, b = _split(data, starts[order], ends[order], sep)
        owner = order[owner]
        back = np.argsort(owner, kind="stable")
        return owner[back], a[back], b[back]
    hits = np.flatnonzero(data == sep)
    owner = np.searchsorted(starts, hits, "right") - 1
    inside = owner >= 0
    inside[inside] = hits[inside] < ends[owner[inside]]
    hits, owner = hits[inside], owner[inside]
    per = np.bincount(owner, minlength=n)
    hit_base = np.concatenate([[0], np.cumsum(per)[:-1]]).astype(np.int64)
    piece_base = np.concatenate([[0], np.cumsum(per + 1)]).astype(np.int64)
    a = np.empty(piece_base[-1], dtype=np.int64)
    b = np.empty(piece_base[-1], dtype=np.int64)
    a[piece_base[:-1]] = starts
    b[piece_base[1:] - 1] = ends
    k = piece_base[owner] + np.arange(len(hits), dtype=np.int64) - hit_base[owner]
    b[k] = hits
    a[k + 1] = hits + 1
    return np.repeat(np.arange(n, dtype=np.int64), per + 1), a, b


def _take(src: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> Strings:
    """The ranges ``[starts, starts + lens)`` of ``src`` packed in order (no Python loop)."""
    lens = np.asarray(lens, dtype=np.int64)
    offsets = _offsets(lens)
    total = int(offsets[-1])
    if not total:
        return Strings(np.empty(0, dtype=np.uint8), offsets)
    if (lens == lens[0]).all():
        return Strings(rows(src, np.asarray(starts, dtype=np.int64), int(lens[0])).reshape(-1),
                       offsets)
    idx = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1] - starts, lens)
    return Strings(src[idx], offsets)


def _offsets(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens) + 1, dtype=np.int64)
    np.cumsum(lens, out=out[1:])
    if out[-1] > np.iinfo(np.int32).max:
        raise ValueError(f"{int(out[-1])} bytes of strings in one batch exceed Arrow's int32 "
                         f"offsets; read fewer rows at a time")
    return out.astype(np.int32)


def _cat(arrays: list, dtype) -> np.ndarray:
    if len(arrays) == 1:  # one segment run (the usual case): no copy
        return np.asarray(arrays[0]).astype(dtype, copy=False)
    return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.empty(0, dtype)


def _empty_strings(n: int) -> Strings:
    return Strings(np.empty(0, dtype=np.uint8), np.zeros(n + 1, dtype=np.int32))


__all__ = ["RecordFields", "StringLists", "StringMaps", "Strings", "record_fields"]

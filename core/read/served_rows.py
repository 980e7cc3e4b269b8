"""The rows a pull serves, checked and turned into columns or message objects in bulk.

A pull's chunk of consume-queue units that all point into one readable commit-log segment is
checked column-wise (``format.record_rows``): shape, lengths, topic, queue, queue offset and
commit-log offset of every candidate record, then each body's CRC. The rows served become
either numpy columns (``MessageStore.read``) or ``StoredMessage`` objects (``get``).
"""

from __future__ import annotations

import numpy as np

from mqstore.format.record import HEADER_STRUCTS, RecordLayout
from mqstore.format.record_rows import (
    HEADER_V4, HEADER_V4_BYTES, MIN_V1_RECORD, gather, headers, records_crc_ok,
    segment_bytes, v1_ipv4_ok,
)
from mqstore.message import StoredMessage

MIN_RECORD = MIN_V1_RECORD
_HEAD_V4 = HEADER_STRUCTS[0]
# Headers are kept as opaque 88-byte items: numpy copies a row of a dtype with fields field
# by field, an opaque one with one memcpy (about 0.1 us a row less, each way).
_HEAD_ROW = np.dtype((np.void, HEADER_V4_BYTES))
_new_layout = tuple.__new__


def trusted_layout(raw, topic_len: int) -> RecordLayout:
    """The layout of a V1/IPv4 record already checked column-wise."""
    f = _HEAD_V4.unpack_from(raw)
    topic_at = HEADER_V4_BYTES + f[16] + 1
    props_at = topic_at + topic_len + 2
    return _new_layout(RecordLayout,  # as in verify_queue_record: no constructor frame
                       (f, HEADER_V4_BYTES, topic_at, topic_len, props_at, f[0] - props_at))


class Rows:
    """One chunk's units pointing into one segment (starting at commit-log offset ``start``,
    its bytes ``data``): ``pos``, ``sizes``, queue ``offsets`` and tag codes, with the
    headers of the rows checked so far."""

    __slots__ = ("start", "data", "pos", "sizes", "offsets", "codes", "heads", "msgs",
                 "topic_len")

    def __init__(self, start: int, data: np.ndarray, pos, sizes, offsets, codes,
                 topic_len: int) -> None:
        self.start, self.data = start, data
        self.pos, self.sizes, self.offsets, self.codes = pos, sizes, offsets, codes
        self.topic_len = topic_len
        self.heads = np.zeros(len(pos), dtype=_HEAD_ROW)
        self.msgs: dict[int, StoredMessage] = {}

    def check(self, todo: np.ndarray, topic: bytes, queue_id: int, verify_crc: bool,
              crc_range: tuple[int, int] | None = None) -> bool:
        """True when every record of the rows ``todo`` is intact and the one its unit names."""
        data = self.data
        at = self.pos[todo] - self.start
        head = headers(data, at)
        ok = (v1_ipv4_ok(data, at, head, self.sizes[todo], topic)
              & (head["phys_offset"] == self.pos[todo]) & (head["queue_id"] == queue_id)
              & (head["queue_offset"] == self.offsets[todo]))
        if not ok.all():
            return False
        required = None
        if crc_range is not None:
            pos = self.pos[todo]
            required = (pos >= crc_range[0]) & (pos < crc_range[1])
        if verify_crc and not records_crc_ok(data, at, self.sizes[todo], head, len(topic),
                                             required):
            return False
        self.heads[todo] = np.ascontiguousarray(head).view(_HEAD_ROW)
        return True

    def reject(self, todo: np.ndarray, flt) -> np.ndarray:
        """The rows of ``todo`` whose message ``flt`` turns down on the exact check."""
        data, start, msgs = self.data, self.start, self.msgs
        pos, sizes = self.pos, self.sizes
        out = []
        for r in todo.tolist():
            at = int(pos[r]) - start
            raw = data[at:at + int(sizes[r])].tobytes()
            msg = StoredMessage(raw, trusted_layout(raw, self.topic_len))
            if flt.match_message(msg):
                msgs[r] = msg
            else:
                out.append(r)
        return np.asarray(out, dtype=np.int64)

    def take(self, served: np.ndarray) -> "Part":
        msgs = self.msgs
        return Part(self.start, self.data, self.pos[served], self.sizes[served],
                    self.offsets[served],
                    self.codes[served], self.heads[served].view(HEADER_V4),
                    [msgs.get(r) for r in served.tolist()] if msgs else None)


class Walked(list):
    """Rows the unit-by-unit walk served: their messages, and their units' tag codes."""

    __slots__ = ("codes",)

    def __init__(self) -> None:
        super().__init__()
        self.codes: list[int] = []


class Part:
    """Rows served from one segment, column-wise."""

    __slots__ = ("start", "data", "pos", "sizes", "offsets", "codes", "heads", "msgs")

    def __init__(self, start, data, pos, sizes, offsets, codes, heads, msgs) -> None:
        self.start, self.data, self.pos, self.sizes, self.offsets = start, data, pos, sizes, offsets
        self.codes, self.heads, self.msgs = codes, heads, msgs

    def messages(self, topic_len: int) -> list[StoredMessage]:
        data, start = self.data, self.start
        out = []
        append = out.append
        known = self.msgs
        for i, (p, n) in enumerate(zip(self.pos.tolist(), self.sizes.tolist())):
            msg = known[i] if known is not None else None
            if msg is None:
                raw = data[p - start:p - start + n].tobytes()
                msg = StoredMessage(raw, trusted_layout(raw, topic_len))
            append(msg)
        return out


def messages(parts: list, topic: bytes) -> list[StoredMessage]:
    """Every row served, as message objects, in queue order."""
    if len(parts) == 1 and isinstance(parts[0], list):
        return list(parts[0])
    out: list[StoredMessage] = []
    for part in parts:
        out.extend(part if isinstance(part, list) else part.messages(len(topic)))
    return out


_COLUMNS = (("queue_offsets", np.int64), ("phys_offsets", np.int64), ("sizes", np.int32),
            ("store_timestamps", np.int64), ("born_timestamps", np.int64),
            ("tags_codes", np.int64), ("flags", np.int32), ("sys_flags", np.int32),
            ("reconsume_times", np.int32), ("body_crcs", np.int32))


def _part_columns(part: Part, tags_codes) -> tuple[dict, np.ndarray, np.ndarray]:
    h = part.heads
    cols = {
        "queue_offsets": part.offsets, "phys_offsets": part.pos, "sizes": part.sizes,
        "store_timestamps": h["store_timestamp"], "born_timestamps": h["born_timestamp"],
        "tags_codes": tags_codes(part.codes), "flags": h["flag"], "sys_flags": h["sysflag"],
        "reconsume_times": h["reconsume_times"], "body_crcs": h["body_crc"],
    }
    starts = part.pos - part.start + HEADER_V4_BYTES
    bodies, offsets = gather(part.data, starts, h["body_len"].astype(np.int64))
    return cols, bodies, offsets


def _list_columns(msgs: Walked, tags_codes) -> tuple[dict, np.ndarray, np.ndarray]:
    cols = {
        "queue_offsets": [m.queue_offset for m in msgs], "phys_offsets": [m.phys_offset for m in msgs],
        "sizes": [m.size for m in msgs], "store_timestamps": [m.store_timestamp for m in msgs],
        "born_timestamps": [m.born_timestamp for m in msgs],
        "tags_codes": tags_codes(np.asarray(msgs.codes, dtype=np.int64)),
        "flags": [m.flag for m in msgs],
        "sys_flags": [m.sysflag for m in msgs], "reconsume_times": [m.reconsume_times for m in msgs],
        "body_crcs": [m.body_crc for m in msgs],
    }
    bodies = [m.body for m in msgs]
    offsets = np.zeros(len(msgs) + 1, dtype=np.int32)
    np.cumsum([len(b) for b in bodies], out=offsets[1:])
    return cols, np.frombuffer(b"".join(bodies), dtype=np.uint8), offsets


def columns(parts: list, tags_codes) -> dict:
    """Every row served as the keyword arguments of a ``ReadBatch``: numpy columns and the
    bodies packed with their offsets. ``tags_codes(codes)``: the rows' tag codes from their
    units' codes (extension addresses resolved)."""
    pieces = [(_list_columns(p, tags_codes) if isinstance(p, list)
               else _part_columns(p, tags_codes)) for p in parts]
    if not pieces:
        return {}
    out = {name: np.concatenate([np.asarray(c[name]) for c, _b, _o in pieces]).astype(
        dtype, copy=False) for name, dtype in _COLUMNS}
    if len(pieces) == 1:
        out["bodies"], out["body_offsets"] = pieces[0][1], pieces[0][2]
        return out
    out["bodies"] = np.concatenate([b for _c, b, _o in pieces])
    shifts = np.cumsum([0] + [int(o[-1]) for _c, _b, o in pieces[:-1]])
    out["body_offsets"] = np.concatenate(
        [pieces[0][2][:1]] + [o[1:] + s for (_c, _b, o), s in zip(pieces, shifts)]).astype(
        np.int32, copy=False)
    return out

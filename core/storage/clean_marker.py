"""The clean-shutdown marker ``mqstore.clean``: where everything ended when the store closed.

Like Kafka's ``.kafka_cleanshutdown``, it lets a clean reopen skip recovery: no record walk,
no re-dispatch, an open in milliseconds whatever the size of the log. It is mqstore's own
file in the store root (RocketMQ never looks at it, and no RocketMQ file changes by a byte);
a directory without one (a RocketMQ store, an older mqstore, any unclean exit) opens the way
it always did.

One UTF-8 JSON object, keys sorted:

    +--------------------------+---------------------------------------------------------+
    | key                      | value                                                   |
    +--------------------------+---------------------------------------------------------+
    | format                   | 1                                                       |
    | end                      | commit-log end: every byte below it is a whole record   |
    |                          | (or a closing blank), dispatched to every dispatcher    |
    | commit_log.segment_bytes | the segment size                                        |
    | commit_log.first         | start offset of the first segment                       |
    | commit_log.segments      | how many segment files there are                        |
    | commit_log.last_size     | file size of the last segment                           |
    | commit_log.last_record   | offset of the record (or blank) that ends at ``end``;   |
    |                          | -1 when the log holds nothing                           |
    | queues."topic/id"        | [max offset, end of the last unit's record, files] per  |
    |                          | queue; files: [name, size, mtime_ns] each               |
    | index.active             | a key index was built when the store closed             |
    | index.files              | [name, size, 6 header fields] per file in ``index/``    |
    | crc32                    | zlib.crc32 of the object without this key (compact JSON |
    |                          | with sorted keys)                                       |
    +--------------------------+---------------------------------------------------------+

Written by a clean ``close()`` only, after the loops stopped and every file was flushed and
closed, through a temporary file that is fsynced, renamed over the marker, and followed by an
fsync of the directory; ``abort`` is removed after it. An open for writing reads it and
removes it (durably) before it touches any file, so once anything is appended no marker is
left to be trusted after a crash.

Trusted when all of these hold, else ignored with the reason in the report's notes:

- no ``abort`` file, and the CRC and layout check out;
- the commit-log segments are those recorded (size, first, count, last file size), with no
  gap and no short file, and ``end`` lies in the last one;
- the record at ``last_record`` is intact (CRC included) and ends exactly at ``end``, and the
  bytes after ``end`` (64 KiB of them) are zero;
- the consume queues are those recorded, each with the recorded files (name, size and
  modification time: anything written since changes one), its last unit where recorded and
  none after it; their units are then not checked again (as ``recover`` would), so the
  open costs a few system calls per file instead of reading every queue;
- ``index/`` holds the recorded files with the recorded headers, and the key index was
  active at the close if it is enabled now.
"""

from __future__ import annotations

import logging
import os

from mqstore.format.cq_unit import CQ_UNIT_SIZE, FILLER_SIZE
from mqstore.format.index_layout import HEADER_STRUCT
from mqstore.format.record import (
    BLANK_MAGIC, MAGIC_V1, MAGIC_V2, SCAN_BLANK, SCAN_OK, scan_record,
)
from mqstore.errors import StoreCorruptError
from mqstore.storage.meta_file import read_meta
from mqstore.storage.consume_queue import load_consume_queues
from mqstore.storage.mapped_budget import MappedBudget
from mqstore.storage.index_file import INDEX_DIR
from mqstore.storage.durable_file import sync_dir
from mqstore.storage.sealed_json import seal, unseal, write_sealed

log = logging.getLogger(__name__)

MARKER_FILE = "mqstore.clean"
MARKER_FORMAT = 1
COMMIT_LOG_DIR = "commitlog"
ZERO_PROBE_BYTES = 64 * 1024  # after ``end``: a clean close leaves zeros there
FIRST_WINDOW = 64 * 1024  # where the last record is looked for first (records are small)
RECORD_SLACK = 128 * 1024  # topic, properties and header on top of the largest body
MAX_CANDIDATES = 4096
_RECORD_MAGIC_PREFIX = MAGIC_V1.to_bytes(4, "big", signed=True)[:3]  # V1 and V2 share it
assert MAGIC_V2.to_bytes(4, "big", signed=True)[:3] == _RECORD_MAGIC_PREFIX
_BLANK_MAGIC = BLANK_MAGIC.to_bytes(4, "big", signed=True)
_FALLBACK_CQ_BYTES = 300_000 * 20  # only sizes a queue with no file, whose state is (0, -1)
MARKER_MAPPED_FILES = 64  # consume-queue files mapped at once to describe them (mapped_budget)


def marker_path(root: str) -> str:
    return os.path.join(root, MARKER_FILE)


# -- the file ----------------------------------------------------------------------------------
encode = seal


def decode(data: bytes) -> tuple[dict | None, str | None]:
    """The marker's body, or None and why it cannot be used."""
    body, problem = unseal(data)
    if body is None:
        return None, problem
    if body.get("format") != MARKER_FORMAT:
        return None, f"it has format {body.get('format')!r}, not {MARKER_FORMAT}"
    try:
        cl = body["commit_log"]
        for value in (body["end"], cl["segment_bytes"], cl["first"], cl["segments"],
                      cl["last_size"], cl["last_record"]):
            if not isinstance(value, int):
                raise TypeError(f"{value!r} is not an integer")
        for state in body["queues"].values():
            if not (isinstance(state, list) and len(state) == 3 and isinstance(state[0], int)
                    and isinstance(state[1], int) and isinstance(state[2], list)):
                raise TypeError(f"queue state {state!r}")
        if not isinstance(body["index"]["files"], list) or not isinstance(
                body["index"]["active"], bool):
            raise TypeError("index malformed")
    except (KeyError, TypeError, AttributeError) as exc:
        return None, f"it is malformed ({exc!r})"
    return body, None


def take(root: str, *, remove: bool) -> tuple[dict | None, str | None]:
    """Read the marker (None when there is none or it cannot be used, with why); ``remove``
    (an open for writing): delete it durably before anything else changes in the store."""
    path = marker_path(root)
    try:
        with open(path, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        data, problem = None, f"it cannot be read ({exc})"
    if remove:
        try:
            os.unlink(path)
            sync_dir(root)
        except OSError as exc:
            # The open goes on without it; ``abort`` (created at every open for writing)
            # still keeps a marker left behind from being trusted after a crash.
            log.warning("cannot remove the clean-shutdown marker %s: %s", path, exc)
            return None, f"it cannot be removed ({exc})"
    if data is None:
        return None, problem
    return decode(data)


def write(root: str, body: dict) -> None:
    """Atomically and durably (``sealed_json``)."""
    write_sealed(marker_path(root), body)


# -- what is recorded --------------------------------------------------------------------------
def _files_of(segq) -> list[list]:
    """``[name, size, mtime_ns]`` of a segment queue's files: any write after the close
    (damage, a restored backup, a truncation) changes one of them."""
    out = []
    for seg in segq.segments:
        st = os.stat(seg.path)
        out.append([os.path.basename(seg.path), st.st_size, st.st_mtime_ns])
    return out


def queue_states(queues) -> dict[str, list]:
    """``{"topic/id": [max offset, max phys, files]}`` of loaded consume queues, from their
    files as they stand (see ``ConsumeQueue.tail``)."""
    return {f"{cq.topic}/{cq.queue_id}": [*cq.tail(), _files_of(cq.segments)] for cq in queues}


def index_files(root: str) -> list[list]:
    """``[name, size, header fields...]`` of every file in ``index/``, as RocketMQ lists them."""
    directory = os.path.join(root, INDEX_DIR)
    out: list[list] = []
    if not os.path.isdir(directory):
        return out
    for name in sorted(n for n in os.listdir(directory) if n.isdigit()):
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            continue
        fd = os.open(path, os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, HEADER_STRUCT.size, 0).ljust(HEADER_STRUCT.size, b"\0")
        finally:
            os.close(fd)
        out.append([name, size, *HEADER_STRUCT.unpack(head)])
    return out


def _segment_files(root: str) -> list[tuple[int, str, int]]:
    directory = os.path.join(root, COMMIT_LOG_DIR)
    if not os.path.isdir(directory):
        return []
    paths = sorted((int(n), os.path.join(directory, n)) for n in os.listdir(directory)
                   if n.isdigit())
    return [(start, path, os.path.getsize(path)) for start, path in paths
            if os.path.isfile(path)]


def _record_ending_at(path: str, seg_start: int, end_in_seg: int, seg_bytes: int,
                      largest: int) -> int | None:
    """Commit-log offset of the intact record (or closing blank) that ends at ``end_in_seg``
    of the segment file, found backwards from its magic: its TOTALSIZE is the distance to the
    end, its PHYSICALOFFSET its own offset, and it checks out (CRC included)."""
    patterns = ([_BLANK_MAGIC] if end_in_seg == seg_bytes else []) + [_RECORD_MAGIC_PREFIX]
    with open(path, "rb") as f:
        for window in (FIRST_WINDOW, largest):
            lo = max(0, end_in_seg - window)
            buf = os.pread(f.fileno(), end_in_seg - lo, lo)
            if len(buf) != end_in_seg - lo:
                return None
            for pattern in patterns:
                found = _ending_record(buf, pattern, seg_start + lo)
                if found is not None:
                    return found
            if lo == 0:
                return None
    return None


def _ending_record(buf: bytes, pattern: bytes, base: int) -> int | None:
    """Offset (``base`` + position) of the record of ``buf`` whose magic starts with
    ``pattern`` and that ends exactly at the end of ``buf``; the newest candidates first."""
    n, hi = len(buf), len(buf)
    for _ in range(MAX_CANDIDATES):  # bodies may hold the pattern; never search forever
        p = buf.rfind(pattern, 0, hi)
        if p < 4:
            return None
        hi = p + len(pattern) - 1
        at = p - 4
        if int.from_bytes(buf[at:at + 4], "big") != n - at:
            continue
        kind, size, _head = scan_record(buf, at, n, True, expected_phys=base + at)
        if kind in (SCAN_OK, SCAN_BLANK) and at + size == n:
            return base + at
    return None


def describe(root: str, end: int, *, segment_bytes: int, index_active: bool,
             max_record_bytes: int) -> tuple[dict | None, str | None]:
    """The marker of a store closed with its commit log ending at ``end``, read from the
    files as they are now (every map closed); None and why when they do not add up."""
    segs = _segment_files(root)
    cl = {"segment_bytes": segment_bytes, "first": segs[0][0] if segs else 0,
          "segments": len(segs), "last_size": segs[-1][2] if segs else 0, "last_record": -1}
    if segs and end > segs[0][0]:
        at = end - 1 - (end - 1) % segment_bytes
        holder = next((s for s in segs if s[0] == at), None)
        if holder is None:
            return None, f"no segment holds the end {end}"
        found = _record_ending_at(holder[1], at, end - at, segment_bytes,
                                  max_record_bytes + RECORD_SLACK)
        if found is None:
            return None, f"no intact record ends at {end}"
        cl["last_record"] = found
    try:
        cq_bytes = (read_meta(root) or {}).get("consume_queue_file_bytes")
    except StoreCorruptError:
        cq_bytes = None  # then the files say (as they do at open)
    queues = load_consume_queues(root, cq_bytes or _FALLBACK_CQ_BYTES, read_only=True,
                                 known_bytes=cq_bytes, budget=MappedBudget(MARKER_MAPPED_FILES))
    try:
        states = queue_states(queues.values())
    finally:
        for cq in queues.values():
            cq.close()
    return {"format": MARKER_FORMAT, "end": end, "commit_log": cl, "queues": states,
            "index": {"active": bool(index_active), "files": index_files(root)}}, None


def leave(root: str, end: int, *, segment_bytes: int, index_active: bool,
          max_record_bytes: int) -> bool:
    """Write the marker of a cleanly closed store; never raises (the close must finish, and
    without a marker the next open only takes longer). True when it was written."""
    try:
        body, problem = describe(root, end, segment_bytes=segment_bytes,
                                 index_active=index_active, max_record_bytes=max_record_bytes)
        if body is None:
            log.warning("no clean-shutdown marker left in %s: %s", root, problem)
            return False
        write(root, body)
        return True
    except Exception as exc:  # a full disk, a file changed under us: the next open recovers
        log.warning("no clean-shutdown marker left in %s: %s", root, exc)
        return False


# -- checking it against the files at open -----------------------------------------------------
def mismatch(body: dict, commit_log, consume_queues) -> str | None:
    """Why the marker does not describe the loaded files (consume queues loaded, not yet
    recovered), or None: then ``restore`` takes its positions."""
    why = _commit_log_mismatch(body, commit_log)
    if why is not None:
        return why
    recorded = body["queues"]
    by_key = {f"{cq.topic}/{cq.queue_id}": cq for cq in consume_queues}
    if set(by_key) != set(recorded):
        differ = sorted(set(by_key) ^ set(recorded))
        return (f"consume queues {', '.join(differ[:3])}{', ...' if len(differ) > 3 else ''} "
                f"are missing or new")
    for key, cq in by_key.items():
        why = _queue_mismatch(cq, recorded[key])
        if why is not None:
            return f"consume queue {key}: {why}"
    root = os.path.dirname(commit_log.segments.directory)
    if index_files(root) != body["index"]["files"]:
        return "the index files differ from those recorded"
    return None


def _queue_mismatch(cq, state) -> str | None:
    try:
        max_offset, max_phys, files = int(state[0]), int(state[1]), state[2]
        current = _files_of(cq.segments)
    except (TypeError, ValueError, IndexError, OSError) as exc:
        return f"cannot be compared ({exc!r})"
    if current != files:
        return "its files changed since the close"
    # The files are unchanged; still, the recorded end must be where units stop.
    pos = max_offset * CQ_UNIT_SIZE
    if max_offset:
        seg = cq.segments.find(pos - CQ_UNIT_SIZE)
        unit = cq.units_of(seg)[(pos - CQ_UNIT_SIZE - seg.start) // CQ_UNIT_SIZE] \
            if seg is not None else None
        if unit is None or unit["size"] <= 0 or unit["phys_offset"] < 0:
            return f"no unit before its recorded end {max_offset}"
        if unit["size"] != FILLER_SIZE and int(unit["phys_offset"]) + int(unit["size"]) != max_phys:
            return f"its last unit does not end at {max_phys}"
    seg = cq.segments.find(pos)
    if seg is not None and cq.units_of(seg)[(pos - seg.start) // CQ_UNIT_SIZE]["size"] != 0:
        return f"units follow its recorded end {max_offset}"
    return None


def restore(body: dict, consume_queues) -> None:
    """Give the loaded consume queues the positions recorded (after ``mismatch`` said None)."""
    for cq in consume_queues:
        max_offset, max_phys, _files = body["queues"][f"{cq.topic}/{cq.queue_id}"]
        cq.restore(max_offset, max_phys)


def _commit_log_mismatch(body: dict, commit_log) -> str | None:
    segq = commit_log.segments
    segs = segq.segments
    cl, end = body["commit_log"], body["end"]
    if len(segs) != cl["segments"]:
        return f"{len(segs)} commit-log segments, {cl['segments']} recorded"
    if not segs:
        if end or any(state[0] for state in body["queues"].values()):
            return f"no commit-log segment, end {end} and units recorded"
        return None
    if segq.segment_bytes != cl["segment_bytes"]:
        return f"segments of {segq.segment_bytes} bytes, {cl['segment_bytes']} recorded"
    if segs[0].start != cl["first"]:
        return f"the first segment starts at {segs[0].start}, {cl['first']} recorded"
    if segq.repaired or any(b.start != a.end for a, b in zip(segs, segs[1:])):
        return "commit-log segments are missing or short"
    last = segs[-1]
    try:
        size = os.path.getsize(last.path)
    except OSError as exc:
        return f"the last segment cannot be looked at ({exc})"
    if size != cl["last_size"]:
        return f"the last segment is {size} bytes, {cl['last_size']} recorded"
    if not last.start <= end <= last.end:
        return f"the recorded end {end} is not in the last segment [{last.start}, {last.end})"
    at = end - last.start
    tail = last.pread(at, min(ZERO_PROBE_BYTES, last.size - at))
    if tail.count(0) != len(tail):
        return f"bytes follow the recorded end {end}"
    return _last_record_mismatch(segq, cl["last_record"], end)


def _last_record_mismatch(segq, record: int, end: int) -> str | None:
    if record < 0:
        return None if end == segq.segments[0].start else f"no last record recorded before {end}"
    seg = segq.find(record)
    if seg is None or not record < end <= seg.end:
        return f"the last record {record} does not lie before the end {end}"
    kind, size, _head = scan_record(seg.mm, record - seg.start, seg.data_end(), True,
                                    expected_phys=record)
    if kind == SCAN_BLANK:
        ok = end == seg.end and size == seg.end - record
    else:
        ok = kind == SCAN_OK and record + size == end
    if not ok:
        why = size if kind not in (SCAN_OK, SCAN_BLANK) else "it does not end there"
        return f"the record at {record} that should end at {end} is not intact ({why})"
    return None

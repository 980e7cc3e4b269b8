"""RocketMQ 5's epoch file (``epochFileCheckpoint``, written by ``EpochFileCache`` through
``CheckpointFile``): which master epoch wrote which part of the commit log.

The text, UTF-8, one ``\\n`` after every line:

    2              the number of entries
    773307083      CRC32 of the entry lines (each with its ``\\n``), masked to 31 bits as
                   RocketMQ's ``UtilAll.crc32`` masks it; 0 means "not checked"
    7-7000         epoch - start offset: the commit-log offset at which that epoch began
    8-8000

An entry ends where the next one starts; the last one ends at the log's end. Epochs and start
offsets both strictly increase (``EpochFileCache.appendEntry`` refuses anything else). A
store appends ``(epoch, its max offset)`` when it becomes master; a slave holds the entries of
its master that its log reaches.

``consistent_point`` is RocketMQ's ``findConsistentPoint``: of two logs, the offset up to
which both hold the same bytes, as far as the epochs can tell. Nothing here does I/O
(``storage.epoch_file`` reads and writes the file).
"""

from __future__ import annotations

import zlib
from typing import Iterable, NamedTuple

INT32_MAX = (1 << 31) - 1
OFFSET_MAX = (1 << 63) - 1


class EpochFileError(ValueError):
    """Bytes that are not an epoch file, or entries out of order: the message says where."""


class EpochEntry(NamedTuple):
    epoch: int
    start: int  # the commit-log offset at which this epoch began


def entries_crc(lines: bytes) -> int:
    """RocketMQ's ``UtilAll.crc32``: zlib's CRC32 with the top bit cleared."""
    return zlib.crc32(lines) & 0x7FFFFFFF


def check_entries(entries: Iterable[EpochEntry]) -> list[EpochEntry]:
    """``entries`` as a list, EpochFileError unless epochs and starts strictly increase and
    every value fits RocketMQ's types (an int epoch from 0, a long offset from 0)."""
    out: list[EpochEntry] = []
    for entry in entries:
        epoch, start = entry
        if not 0 <= epoch <= INT32_MAX or not 0 <= start <= OFFSET_MAX:
            raise EpochFileError(f"epoch entry {epoch}-{start}: the epoch must be 0..{INT32_MAX} "
                                 f"and the start offset 0..{OFFSET_MAX}")
        if out and (epoch <= out[-1].epoch or start <= out[-1].start):
            raise EpochFileError(f"epoch entry {epoch}-{start} after {out[-1].epoch}-"
                                 f"{out[-1].start}: epochs and start offsets must both "
                                 f"strictly increase")
        out.append(EpochEntry(int(epoch), int(start)))
    return out


def encode(entries: Iterable[EpochEntry]) -> bytes:
    """The file's bytes (EpochFileError for entries out of order)."""
    entries = check_entries(entries)
    lines = b"".join(b"%d-%d\n" % (e.epoch, e.start) for e in entries)
    return b"%d\n%d\n" % (len(entries), entries_crc(lines)) + lines


def decode(data: bytes) -> list[EpochEntry]:
    """The entries of a file's bytes; EpochFileError naming what is wrong."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EpochFileError(f"the epoch file is not UTF-8 text ({exc})") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline after the last line
    if len(lines) < 2 or not _is_int(lines[0]) or not _is_int(lines[1], signed=True):
        raise EpochFileError("the epoch file does not start with a count line and a CRC32 "
                             "line (two decimal integers)")
    count, crc = int(lines[0]), int(lines[1])
    body = lines[2:]
    entries = []
    for number, line in enumerate(body, start=3):
        epoch, dash, start = line.partition("-")
        if not dash or not _is_int(epoch) or not _is_int(start):
            raise EpochFileError(f"line {number} of the epoch file, {line!r}, is not "
                                 f"'epoch-startOffset'")
        entries.append(EpochEntry(int(epoch), int(start)))
    if len(entries) != count:
        raise EpochFileError(f"the epoch file says {count} entries and holds {len(entries)}")
    actual = entries_crc("".join(f"{line}\n" for line in body).encode())
    if crc != 0 and crc != actual:
        raise EpochFileError(f"the epoch file's CRC32 is {crc}, its entries' is {actual}")
    return check_entries(entries)


def _is_int(text: str, signed: bool = False) -> bool:
    digits = text[1:] if signed and text.startswith("-") else text
    return digits.isascii() and digits.isdigit() and len(digits) <= 19


def appended(entries: list[EpochEntry], epoch: int, start: int) -> list[EpochEntry]:
    """``entries`` with ``(epoch, start)`` after them: EpochFileError unless both are above
    the last entry's (RocketMQ's appendEntry)."""
    return check_entries([*entries, EpochEntry(epoch, start)])


def truncated(entries: list[EpochEntry], offset: int) -> list[EpochEntry]:
    """``entries`` without those starting at or after ``offset`` (RocketMQ's
    truncateSuffixByOffset: the log was cut there)."""
    return [e for e in entries if e.start < offset]


def reached(entries: list[EpochEntry], end: int) -> list[EpochEntry]:
    """The entries a log ending at ``end`` holds: those that started at or below it."""
    return [e for e in entries if e.start <= end]


def consistent_point(local: list[EpochEntry], local_end: int, remote: list[EpochEntry],
                     remote_end: int) -> int:
    """RocketMQ's findConsistentPoint: each side's last entry ends at its log's end; of the
    local entries, newest first, the first the remote side has with the same start gives
    ``min(local end of that epoch, remote end of it)``; -1 when no epoch is common."""
    remote_by_epoch = dict(_spans(remote, remote_end))
    for epoch, (start, end) in reversed(list(_spans(local, local_end))):
        other = remote_by_epoch.get(epoch)
        if other is not None and other[0] == start:
            return min(end, other[1])
    return -1


def _spans(entries: list[EpochEntry], end: int):
    for i, entry in enumerate(entries):
        stop = entries[i + 1].start if i + 1 < len(entries) else max(end, entry.start)
        yield entry.epoch, (entry.start, stop)


__all__ = ["EpochEntry", "EpochFileError", "entries_crc", "check_entries", "encode", "decode",
           "appended", "truncated", "reached", "consistent_point"]

"""The queues a store knows it has: ``config/mqstore_queues.json``.

    {"format": 1, "queues": {"<topic>/<queueId>": {"first_phys": <int>, "max_offset": <int>,
                                                   "max_phys": <int>}}}

``first_phys`` is the commit-log offset of the queue's first message when the queue was
created (-1: the queue holds no message, only offsets kept by fillers); ``max_offset`` the
queue's end when the manifest was last written, and ``max_phys`` the end of the record of its
last unit then (-1, or absent as older versions wrote it: no record stands for that end). The
dispatch side writes it (atomically: a temporary file renamed over it) when queues appear and
when it stops. At open, a queue listed here whose directory is gone, or which holds fewer
units than listed, is rebuilt from the commit log (recovery re-dispatches from where its units
went missing): without it, a deleted ``consumequeue/<topic>/<id>`` would leave that queue's
old messages unreachable and its next put would reuse offset 0. RocketMQ ignores the file.

``max_offset`` is also a floor (NOTE [ Offset floors ] in ``offset_floor``): an entry never
goes down and never goes away, whatever the queue holds now, unless its topic is deleted. The open writes the floors it
settled before dispatch starts; the keeper of the running store merges what it writes into
what the file held, so no write loses a floor before the queue holds its fillers.

A garbled manifest is reported and ignored (it only ever widens a rebuild).
"""

from __future__ import annotations

import json
import logging
import os

from mqstore.storage.durable_file import replace_file

log = logging.getLogger(__name__)
CONFIG_DIR = "config"
MANIFEST_FILE = "mqstore_queues.json"


def manifest_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, MANIFEST_FILE)


Key = tuple[str, int]
Entry = tuple[int, int, int]  # first_phys, max_offset, max_phys


def read_manifest(root: str) -> tuple[dict[Key, tuple[int, int]], str | None]:
    """``{(topic, queue_id): (first_phys, max_offset)}`` and a problem (None if fine)."""
    entries, problem = read_entries(root)
    return {key: (first, end) for key, (first, end, _phys) in entries.items()}, problem


def read_entries(root: str) -> tuple[dict[Key, Entry], str | None]:
    """``{(topic, queue_id): (first_phys, max_offset, max_phys)}`` and a problem (None if
    fine)."""
    path = manifest_path(root)
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except FileNotFoundError:
        return {}, None
    except (OSError, ValueError) as exc:
        return {}, f"queue manifest {path} is unreadable ({exc}); ignored"
    try:
        queues = {}
        for key, entry in data["queues"].items():
            topic, _, qid = key.rpartition("/")
            queues[(topic, int(qid))] = (int(entry["first_phys"]), int(entry["max_offset"]),
                                         int(entry.get("max_phys", -1)))
        return queues, None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return {}, f"queue manifest {path} is malformed ({exc!r}); ignored"


def write_manifest(root: str, queues: dict[Key, Entry], *, durable: bool = False) -> None:
    """Atomically; ``durable``: fsynced with its directory too, a full disk raising
    DiskFullError naming the file."""
    path = manifest_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = {"format": 1, "queues": {
        f"{t}/{q}": {"first_phys": first, "max_offset": end, "max_phys": phys}
        for (t, q), (first, end, phys) in sorted(queues.items())}}
    replace_file(path, json.dumps(body, separators=(",", ":")).encode(), fsync=durable,
                 sync_directory=durable)


def describe(queues: dict) -> dict[Key, Entry]:
    """The manifest entries of ``{(topic, queue_id): ConsumeQueue}`` as they are now."""
    out = {}
    for key, cq in queues.items():
        first = cq.first_phys()
        if first is not None:
            out[key] = (first, cq.max_offset, cq.max_phys)
        elif cq.max_offset > 0:  # offsets held by fillers alone: still a floor
            out[key] = (-1, cq.max_offset, -1)
    return out


def merged(recorded: dict[Key, Entry], current: dict[Key, Entry]) -> dict[Key, Entry]:
    """``recorded`` entries raised by ``current`` ones: the first message as the queue now
    says (the recorded one when it holds none), the higher end with its record's end."""
    out = dict(recorded)
    for key, (first, end, phys) in current.items():
        was_first, was_end, was_phys = out.get(key, (-1, 0, -1))
        first = first if first >= 0 else was_first
        out[key] = (first, end, phys) if end >= was_end else (first, was_end, was_phys)
    return out


class ManifestKeeper:
    """Keeps the manifest current for the owner of the consume queues: ``mark`` when a queue
    is created, ``write_marked`` once the batch that created it is written (so its first unit
    is known), ``update`` about once a second and, with ``final``, when the owner stops.

    Every write is ``merged`` into the entries the file held when the keeper was made (or
    that ``settle`` set): the floors."""

    def __init__(self, root: str, recorded: dict[Key, Entry] | None = None) -> None:
        """``recorded``: the file's entries, when the caller has read them already."""
        self.root = root
        self._written: frozenset | None = None
        self._marked = False
        if recorded is None:
            recorded, _problem = read_entries(root)  # the open reported any problem
        self.recorded = recorded

    def floors(self) -> dict[Key, int]:
        """Each listed queue's end: the offset below which it must hold a unit."""
        return {key: end for key, (_first, end, _phys) in self.recorded.items()}

    def settle(self, entries: dict[Key, Entry]) -> None:
        """Make ``entries`` the manifest, durably (the open, before it cuts a unit and before
        dispatch starts); written only when that changes it."""
        if entries != self.recorded:
            write_manifest(self.root, entries, durable=True)
        self.recorded = dict(entries)

    def forget(self, keys) -> None:
        """Drop the entries of ``keys``, floors included, durably: their topic was deleted
        (``store.topic_removal``), so its queues start over at offset 0, as on a broker."""
        entries = {key: entry for key, entry in self.recorded.items() if key not in keys}
        if entries != self.recorded:
            write_manifest(self.root, entries, durable=True)
        self.recorded = entries
        self._written = None

    def mark(self) -> None:
        self._marked = True

    def write_marked(self, queues: dict) -> None:
        if self._marked:
            self._marked = False
            self.update(queues)

    def update(self, queues: dict, *, final: bool = False) -> None:
        queues = dict(queues)  # one C-level copy: the dispatch thread may add queues meanwhile
        keys = frozenset(queues)
        if not final and keys == self._written:
            return
        entries = merged(self.recorded, describe(queues))
        try:
            write_manifest(self.root, entries)
        except OSError as exc:  # a full disk: the manifest only narrows rebuilds; try later
            self._marked = True
            log.warning("queue manifest not written (%s); it is tried again", exc)
            return
        self.recorded = entries
        self._written = keys

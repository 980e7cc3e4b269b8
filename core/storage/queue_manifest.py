"""The queues a store knows it has: ``config/mqstore_queues.json``.

    {"format": 1, "queues": {"<topic>/<queueId>": {"first_phys": <int>, "max_offset": <int>}}}

``first_phys`` is the commit-log offset of the queue's first message when the queue was
created; ``max_offset`` the queue's end when the manifest was last written. The dispatch side
writes it (atomically: a temporary file renamed over it) when queues appear and when it stops.
At open, a queue listed here whose directory is gone, or which holds fewer units than listed,
is rebuilt from the commit log (recovery re-dispatches from where its units went missing):
without it, a deleted ``consumequeue/<topic>/<id>`` would leave that queue's old messages
unreachable and its next put would reuse offset 0. RocketMQ ignores the file.

A garbled manifest is reported and ignored (it only ever widens a rebuild).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os

log = logging.getLogger("mqstore.dispatch")
CONFIG_DIR = "config"
MANIFEST_FILE = "mqstore_queues.json"


def manifest_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, MANIFEST_FILE)


def read_manifest(root: str) -> tuple[dict[tuple[str, int], tuple[int, int]], str | None]:
    """``{(topic, queue_id): (first_phys, max_offset)}`` and a problem (None if fine)."""
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
            queues[(topic, int(qid))] = (int(entry["first_phys"]), int(entry["max_offset"]))
        return queues, None
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        return {}, f"queue manifest {path} is malformed ({exc!r}); ignored"


def write_manifest(root: str, queues: dict[tuple[str, int], tuple[int, int]]) -> None:
    path = manifest_path(root)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    body = {"format": 1, "queues": {f"{t}/{q}": {"first_phys": first, "max_offset": end}
                                    for (t, q), (first, end) in sorted(queues.items())}}
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(body, f, separators=(",", ":"))
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def describe(queues: dict) -> dict[tuple[str, int], tuple[int, int]]:
    """The manifest entries of ``{(topic, queue_id): ConsumeQueue}`` as they are now."""
    out = {}
    for key, cq in queues.items():
        first = cq.first_phys()
        if first is not None:
            out[key] = (first, cq.max_offset)
    return out


class ManifestKeeper:
    """Keeps the manifest current for the owner of the consume queues: ``mark`` when a queue
    is created, ``write_marked`` once the batch that created it is written (so its first unit
    is known), ``update`` about once a second and, with ``final``, when the owner stops."""

    def __init__(self, root: str) -> None:
        self.root = root
        self._written: frozenset | None = None
        self._marked = False

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
        try:
            write_manifest(self.root, describe(queues))
        except OSError as exc:  # a full disk: the manifest only narrows rebuilds; try later
            self._marked = True
            log.warning("queue manifest not written (%s); it is tried again", exc)
            return
        self._written = keys

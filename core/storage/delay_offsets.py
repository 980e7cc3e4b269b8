"""``config/delayOffset.json`` on disk (the document: ``format.delay_offsets``).

Only the schedule service of the writer process changes it, so no lock: a change is written
whole to ``delayOffset.json.tmp``, forced and renamed over the file (``storage.durable_file``,
which also notes it in the state mirror's feed). A process killed at any instant leaves the
last renamed version. A RocketMQ broker keeps ``delayOffset.json.bak`` beside it (the version
before its last change); mqstore reads the file itself, and a damaged one is reported naming
the file and the problem, never replaced.
"""

from __future__ import annotations

import os

from mqstore.format.delay_offsets import DelayOffsets, decode, encode
from mqstore.storage.durable_file import read_document, replace_file

CONFIG_DIR = "config"
DELAY_OFFSET_FILE = "delayOffset.json"


def delay_offsets_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, DELAY_OFFSET_FILE)


def read_delay_offsets(root: str) -> DelayOffsets | None:
    """The document, or None when the store has none; CorruptStateError when it does not
    parse."""
    path = delay_offsets_path(root)
    return read_document(path, decode, lambda problem: (
        f"{path}: {problem}; the schedule delivers nothing until it is repaired (RocketMQ's "
        f"previous version: {path}.bak, when there is one)"))


def write_delay_offsets(root: str, doc: DelayOffsets) -> None:
    """Replace the document (forced to disk before the rename)."""
    os.makedirs(os.path.join(root, CONFIG_DIR), exist_ok=True)
    replace_file(delay_offsets_path(root), encode(doc).encode("utf-8"), fsync=True)

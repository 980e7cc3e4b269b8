"""``config/mqstore_deleted_topics.json``: where each deleted topic's old messages end.

    {"format": 1, "topics": {"<topic>": <commit-log offset>, ...}, "crc32": <int>}

Deleting a topic (RocketMQ's ``deleteTopic``) removes its consume queues but leaves its
records in the commit log until cleanup deletes their segments. Whatever dispatches those
records again (an abnormal recovery's re-dispatch, a queue rebuilt from the manifest,
``mqstore check --fix``) must not bring the queues back: dispatch gives no unit to a record of
a topic listed here below the offset recorded (the commit log's end when it was deleted), and
``mqstore check`` expects none. A topic created again later gets its new messages, which lie
above, as usual. RocketMQ ignores the file.

A sealed file (``storage.sealed_json``): written durably, its CRC checked when read. One that
cannot be trusted is reported (``CorruptStateError`` naming it) and never replaced: without it
a deleted topic's old messages could come back, so the operator must look.
"""

from __future__ import annotations

import os

from mqstore.errors import CorruptStateError
from mqstore.storage.sealed_json import read_sealed, write_sealed

CONFIG_DIR = "config"
DELETED_FILE = "mqstore_deleted_topics.json"
FORMAT = 1


def deleted_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, DELETED_FILE)


def read_deleted(root: str) -> dict[str, int]:
    """``{topic: commit-log offset}`` (empty: no topic was ever deleted)."""
    path = deleted_path(root)
    body, problem = read_sealed(path)
    if problem is None and body is not None:
        topics = body.get("topics")
        if body.get("format") != FORMAT or not isinstance(topics, dict) or not all(
                isinstance(k, str) and type(v) is int and v >= 0 for k, v in topics.items()):
            problem = f"{path}: not a format-{FORMAT} table of topics and offsets"
        else:
            return dict(topics)
    if problem is not None:
        raise CorruptStateError(f"deleted topics {problem}; it is left as it is (without it a "
                                f"deleted topic's old messages could be dispatched again): "
                                f"repair or remove it")
    return {}


def record_deleted(root: str, topic: str, below: int) -> dict[str, int]:
    """Record that ``topic``'s records below ``below`` belong to a deleted topic. The caller
    holds the store's write lock (topics are deleted in the one process that writes)."""
    table = read_deleted(root)
    table[topic] = max(below, table.get(topic, 0))
    os.makedirs(os.path.join(root, CONFIG_DIR), exist_ok=True)
    write_sealed(deleted_path(root), {"format": FORMAT, "topics": table})
    return table

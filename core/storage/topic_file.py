"""``config/topics.json`` on disk: read by anyone, changed by any process without losing
another's change (the document itself: ``format.topic_config``).

    config/topics.json         the document; replaced whole by a rename, never written in place
    config/topics.json.lock    flock'ed (exclusive) around every read-modify-write
    config/topics.json.tmp     the next version while it is written

A change takes the lock, reads the file as it is now, applies itself, writes the ``.tmp``
(fsynced), renames it over the file, fsyncs the directory and lets go. So the store process
(auto-creating topics) and ``mqstore topic`` beside it never lose each other's changes, and a
reader, which takes no lock, sees the old document or the new one. A process killed at any
instant leaves the last renamed version, and its lock goes with it.

A file that does not parse (or breaks a rule of the document) is never replaced: reads and
changes raise ``CorruptStateError`` naming the file and the problem, and the file is left for
the operator. A RocketMQ broker keeps its previous version as ``topics.json.bak`` (it falls
back to it silently; mqstore does not), so the message points there when there is one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from typing import Callable, Iterator

from mqstore.format.topic_config import TopicTable, decode_table, encode_table
from mqstore.storage.durable_file import read_document, replace_file

CONFIG_DIR = "config"
TOPICS_FILE = "topics.json"
BACKUP_SUFFIX = ".bak"  # RocketMQ's ConfigManager: the version before its last change


def topics_path(root: str) -> str:
    return os.path.join(root, CONFIG_DIR, TOPICS_FILE)


def identity(path: str) -> tuple | None:
    """What changes whenever the file is replaced or written (None: there is no file)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_ino, st.st_size, st.st_mtime_ns


def read_table(path: str) -> TopicTable | None:
    """The document at ``path`` (None: no file); ``CorruptStateError`` when it is damaged."""
    return read_document(path, decode_table, lambda problem: damaged(path, problem))


def damaged(path: str, problem: str) -> str:
    backup = path + BACKUP_SUFFIX
    hint = (f"repair it, or put back {os.path.basename(backup)} (RocketMQ's version before its "
            f"last change)" if os.path.exists(backup) else "repair or remove it")
    return f"topic configs {path} are damaged: {problem}; the file is left as it is: {hint}"


@contextlib.contextmanager
def locked(path: str) -> Iterator[None]:
    """Hold the exclusive lock every change of the file takes."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path + ".lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # lets go of the lock too


def update_table(path: str, change: Callable[[TopicTable | None], TopicTable | None]
                 ) -> tuple[TopicTable | None, tuple | None]:
    """Apply ``change(current) -> new`` to the file as it is now (``current`` None: no file)
    under the lock; ``new`` is written unless it is ``current`` itself. ``change`` may raise
    to refuse: nothing is written. Returns the table now on disk and the file's identity,
    both taken under the lock (no other change can come between them)."""
    with locked(path):
        current = read_table(path)
        new = change(current)
        if new is not None and new is not current:
            replace_file(path, encode_table(new).encode("utf-8"), fsync=True,
                         sync_directory=True)
            current = new
        return current, identity(path)

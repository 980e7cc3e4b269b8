"""The change feed of the state files: which of them changed, written by every process that
changes one, read by the master's shipper (NOTE [ State mirror ] in ``mirror``).

    <root>/state/feed        one line per change: the file's path relative to the root;
                             flock'ed shared around every append, exclusive while the shipper
                             empties it (truncated in place: every descriptor stays good)

A process that changes a state file (``storage.durable_file``'s replacement, the journals'
appends, the offset marks) calls ``changed`` after the change, still under the file's own
lock, so the shipper, which reads a unit under that lock, never reads a state older than the
line it acts on. The line is one ``write`` of an ``O_APPEND`` descriptor: lines from any
number of processes never mix. Changes made in this process also call the listeners of the
root (the shipper in the writer's process), so it need not wait for its next look.

The feed exists only while a master ships (the shipper makes ``state/`` when it starts): a
store without one writes nothing. A feed that reaches ``FEED_FULL_BYTES`` (its shipper is not
running, or stuck) takes no more lines; the shipper, when it runs again, sends every state file
whole (it does at every start anyway) and empties it.
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from typing import Callable

from mqstore.storage.state_files import split_path

log = logging.getLogger(__name__)

STATE_DIR = "state"
FEED_FILE = "feed"
FEED_FULL_BYTES = 16 << 20

_lock = threading.Lock()
# root -> this process's descriptor of its feed, kept open for the process's life: closing it
# while another thread is about to write through it could send a line into whatever file
# reuses the number (one descriptor per store a process changes).
_fds: dict[str, int] = {}
_listeners: dict[str, list[Callable[[], None]]] = {}


def feed_path(root: str) -> str:
    return os.path.join(root, STATE_DIR, FEED_FILE)


def changed(path: str) -> None:
    """``path`` (absolute) was changed; a line goes to its store's feed if it is a state
    file and the store has a feed. Never raises: a line that cannot be written is logged
    (the shipper sends every file whole at its next start)."""
    found = split_path(path)
    if found is not None:
        changed_in(*found)


def changed_in(root: str, rel: str) -> None:
    """The state file ``rel`` of the store in ``root`` was changed (see ``changed``)."""
    fd = _feed_fd(root)
    if fd is not None:
        try:
            _append(fd, (rel + "\n").encode())
        except OSError as exc:
            log.warning("state feed of %s: %s not noted (%s); the next snapshot carries it",
                        root, rel, exc)
    for listener in _listeners.get(root, ()):
        listener()


def _append(fd: int, line: bytes) -> None:
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        if os.fstat(fd).st_size < FEED_FULL_BYTES:
            os.write(fd, line)
    finally:
        fcntl.flock(fd, fcntl.LOCK_UN)


def _feed_fd(root: str) -> int | None:
    fd = _fds.get(root)
    if fd is not None:
        return fd
    path = feed_path(root)
    if not os.path.exists(path):
        return None
    with _lock:
        fd = _fds.get(root)
        if fd is None:
            try:
                fd = os.open(path, os.O_WRONLY | os.O_APPEND)
            except OSError:  # gone since, or not ours to write
                return None
            _fds[root] = fd
        return fd


def listen(root: str, listener: Callable[[], None]) -> None:
    """Call ``listener()`` after every change this process makes in ``root``."""
    with _lock:
        _listeners[root] = [*_listeners.get(root, ()), listener]


def unlisten(root: str, listener: Callable[[], None]) -> None:
    with _lock:
        kept = [f for f in _listeners.get(root, ()) if f is not listener]
        if kept:
            _listeners[root] = kept
        else:
            _listeners.pop(root, None)


class FeedReader:
    """The shipper's side: makes the feed, reads the lines appended since it last looked,
    and empties the feed once they are read."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.path = feed_path(root)
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        self._pos = 0
        self._partial = b""

    def restart(self) -> None:
        """Empty the feed (a snapshot is about to carry every file)."""
        with self._exclusive():
            os.ftruncate(self._fd, 0)
            self._pos, self._partial = 0, b""

    def full(self) -> bool:
        return os.fstat(self._fd).st_size >= FEED_FULL_BYTES

    def read(self, rotate_at: int = 1 << 20) -> list[str]:
        """The paths noted since the last call, deduplicated, in the order first noted; the
        feed is emptied once it passed ``rotate_at`` bytes and all of it was read."""
        size = os.fstat(self._fd).st_size
        if size < self._pos:  # emptied behind us (a restarted shipper)
            self._pos, self._partial = 0, b""
        lines = self._take(size)
        if size >= rotate_at:
            with self._exclusive():
                lines += self._take(os.fstat(self._fd).st_size)
                os.ftruncate(self._fd, 0)
                self._pos, self._partial = 0, b""
        return list(dict.fromkeys(lines))

    def _take(self, size: int) -> list[str]:
        if size <= self._pos:
            return []
        data = self._partial + os.pread(self._fd, size - self._pos, self._pos)
        self._pos = size
        complete, _, self._partial = data.rpartition(b"\n")
        return [line.decode("utf-8", "replace") for line in complete.split(b"\n") if line]

    def _exclusive(self):
        return _Flock(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class _Flock:
    def __init__(self, fd: int) -> None:
        self.fd = fd

    def __enter__(self) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_EX)

    def __exit__(self, *exc) -> None:
        fcntl.flock(self.fd, fcntl.LOCK_UN)

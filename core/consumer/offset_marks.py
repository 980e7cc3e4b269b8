"""Evidence, kept apart from the offsets, that a consumer group recorded offsets for a topic.

    <root>/consumer/groups/<group>/<topic>/recorded     empty; exists while the group has some

A group with no offset in ``config/consumerOffset.json`` is new: it starts where
``consume_from`` says, which for ``last`` skips every message not yet consumed. So a document
that parses, but was replaced by an older or emptied one, must not read as "every group is
new". The mark is made, under the offset file's lock, once the group's offsets for the topic
are in the document or its journal (``ConsumerOffsets``), and removed, under the same lock,
with them (``delete_consumer_group``): while the lock is held, a mark without offsets is a
document that lost them, and the reader refuses it (``CorruptStateError``) instead of starting
the group over. Groups whose offsets predate the marks (or came from a RocketMQ broker) get
theirs with their next commit.
"""

from __future__ import annotations

import os

from mqstore.consumer.membership import GROUPS_DIR
from mqstore.storage import state_feed

MARK = "recorded"


def mark_path(root: str, group: str, topic: str) -> str:
    return os.path.join(root, GROUPS_DIR, group, topic, MARK)


def make(root: str, group: str, topic: str) -> None:
    path = mark_path(root, group, topic)
    if os.path.exists(path):
        return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o644))
    state_feed.changed_in(root, _rel(group, topic))


def remove(root: str, group: str, topics) -> None:
    """Remove ``group``'s marks for ``topics`` (None: every topic)."""
    if topics is None:
        topics = [topic for topic, g in marked(root) if g == group]
    for topic in topics:
        try:
            os.unlink(mark_path(root, group, topic))
        except FileNotFoundError:
            continue
        state_feed.changed_in(root, _rel(group, topic))


def _rel(group: str, topic: str) -> str:
    """The mark's path as the change feed names it."""
    return "/".join((*GROUPS_DIR.split(os.sep), group, topic, MARK))


def marked(root: str) -> list[tuple[str, str]]:
    """Every ``(topic, group)`` with a mark."""
    base = os.path.join(root, GROUPS_DIR)
    out = []
    for group in _names(base):
        for topic in _names(os.path.join(base, group)):
            if os.path.isfile(os.path.join(base, group, topic, MARK)):
                out.append((topic, group))
    return sorted(out)


def _names(directory: str) -> list[str]:
    try:
        with os.scandir(directory) as entries:
            return [e.name for e in entries if e.is_dir(follow_symlinks=False)]
    except (FileNotFoundError, NotADirectoryError):
        return []

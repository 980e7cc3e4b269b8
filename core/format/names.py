"""Topic names and queue ids as the record format and the store's directories allow them.

A topic becomes a path component (``consumequeue/<topic>/<queue id>``), so RocketMQ's character
rule also keeps every path inside the store directory; a queue id is a Java int.
"""

from __future__ import annotations

import re

import numpy as np

TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # used with fullmatch: "$" allows a final "\n"
INT32_MAX = 0x7FFFFFFF

_valid_topics: set[str] = set()


def check_topic(topic: object) -> str:
    """RocketMQ's character rule; it also keeps every path inside the store directory."""
    if type(topic) is str and topic in _valid_topics:
        return topic
    if not isinstance(topic, str) or not TOPIC_PATTERN.fullmatch(topic):
        raise ValueError(f"topic {topic!r} must match {TOPIC_PATTERN.pattern} (letters, digits, %|_-)")
    if len(_valid_topics) < 100_000:
        _valid_topics.add(topic)
    return topic


def check_queue_id(queue_id: object) -> int:
    if isinstance(queue_id, bool) or not isinstance(queue_id, (int, np.integer)) \
            or not 0 <= queue_id <= INT32_MAX:
        raise ValueError(f"queue_id {queue_id!r} must be an int in [0, {INT32_MAX}]")
    return int(queue_id)

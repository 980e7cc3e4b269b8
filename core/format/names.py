"""Topic names, queue ids and integer arguments as the record format and the store's directories
allow them: the one set of rules puts, reads and consumers check their arguments by.

A topic becomes a path component (``consumequeue/<topic>/<queue id>``), so RocketMQ's character
rule also keeps every path inside the store directory; a queue id is a Java int.
"""

from __future__ import annotations

import re

import numpy as np

from mqstore.format.record import MAX_TOPIC_BYTES

TOPIC_PATTERN = re.compile(r"[%|a-zA-Z0-9_-]+")  # used with fullmatch: "$" allows a final "\n"
INT32_MIN = -(1 << 31)
INT32_MAX = 0x7FFFFFFF
INT64_MIN = -(1 << 63)
INT64_MAX = (1 << 63) - 1

# Topics that reads and consumers name (they become path components of consume-queue and
# consumer-state directories): the put rule's characters, and dots, as a RocketMQ broker's
# store may hold ``metrics.cpu``; no topic longer than MAX_TOPIC_BYTES is ever stored.
STORED_TOPIC_RULE = f"^[%|a-zA-Z0-9_.-]+$, at most {MAX_TOPIC_BYTES} characters, not only dots"
_STORED_TOPIC = re.compile(rf"[%|a-zA-Z0-9_.-]{{1,{MAX_TOPIC_BYTES}}}")

# RocketMQ's prefix of the topics a broker keeps for itself (TopicValidator.SYSTEM_TOPIC_PREFIX):
# mqstore's own state travels in such a topic (``format.state_record``). Producers and
# consumers are refused them, and user listings leave them out.
SYSTEM_TOPIC_PREFIX = "rmq_sys_"

_valid_topics: set[str] = set()
_valid_stored_topics: set[str] = set()


def shown(value: object) -> str:
    """``repr(value)`` for an error message; a long string is cut and its length named."""
    if isinstance(value, str) and len(value) > 64:
        return f"{value[:32]!r}... ({len(value)} characters)"
    return repr(value)


def check_topic(topic: object) -> str:
    """A topic a put names: RocketMQ's character rule."""
    if type(topic) is str and topic in _valid_topics:
        return topic
    if not isinstance(topic, str) or not TOPIC_PATTERN.fullmatch(topic):
        raise ValueError(f"topic {shown(topic)} must match {TOPIC_PATTERN.pattern} "
                         f"(letters, digits, %|_-)")
    if len(_valid_topics) < 100_000:
        _valid_topics.add(topic)
    return topic


def check_stored_topic(topic: object) -> str:
    """A topic a read or a consumer names, by STORED_TOPIC_RULE: always one safe path component
    of the store directory (never ``..``, never too long for a file name)."""
    if type(topic) is str and topic in _valid_stored_topics:
        return topic
    if not isinstance(topic, str) or not _STORED_TOPIC.fullmatch(topic) or not topic.strip("."):
        raise ValueError(f"topic {shown(topic)} must match {STORED_TOPIC_RULE}")
    if len(_valid_stored_topics) < 100_000:
        _valid_stored_topics.add(topic)
    return topic


# The transactions' topics (``format.transaction``): RocketMQ's TopicValidator lists them as
# system topics too, and only the store writes and reads them.
TRANSACTION_TOPICS = frozenset(("RMQ_SYS_TRANS_HALF_TOPIC", "RMQ_SYS_TRANS_OP_HALF_TOPIC",
                                "TRANS_CHECK_MAX_TIME_TOPIC"))


def is_system_topic(topic: str) -> bool:
    """A topic the store keeps for itself (``SYSTEM_TOPIC_PREFIX``, ``TRANSACTION_TOPICS``)."""
    return topic.startswith(SYSTEM_TOPIC_PREFIX) or topic in TRANSACTION_TOPICS


def system_topic_refusal(topic: str, doing: str) -> str:
    """Why ``doing`` (``"send to"``, ``"consume"``) is refused for a system topic."""
    kind = (f"prefix {SYSTEM_TOPIC_PREFIX}" if topic.startswith(SYSTEM_TOPIC_PREFIX)
            else "a transaction's")
    return (f"topic {shown(topic)} is a system topic ({kind}): the store "
            f"keeps its own state there, and clients may not {doing} it")


def check_queue_id(queue_id: object) -> int:
    if isinstance(queue_id, bool) or not isinstance(queue_id, (int, np.integer)) \
            or not 0 <= queue_id <= INT32_MAX:
        raise ValueError(f"queue_id {queue_id!r} must be an int in [0, {INT32_MAX}]")
    return int(queue_id)


def check_int(name: str, value: object, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"{name} {value!r} must be an int in [{lo}, {hi}]")
    return int(value)

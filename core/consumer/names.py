"""Checks of what callers hand the consumer API, made before anything touches the disk.

Group and topic names become path components (membership and pop-state files), so they are
held to RocketMQ's character rule; topics follow the rule of every read
(``format.names.check_stored_topic``), which also allows dots, as a RocketMQ broker's store
directory may hold them (``metrics.cpu``).
"""

from __future__ import annotations

import re

from mqstore.format.names import STORED_TOPIC_RULE as TOPIC_RULE  # noqa: F401 - the rule consumers name
from mqstore.errors import SystemTopicError
from mqstore.format.names import (
    check_stored_topic, is_system_topic, shown, system_topic_refusal,
)

GROUP_RULE = "^[%|a-zA-Z0-9_-]+$, at most 255 characters (RocketMQ's rule)"
_GROUP = re.compile(r"[%|a-zA-Z0-9_-]{1,255}")

FIRST, LAST, TIMESTAMP = "first", "last", "timestamp"
CONSUME_FROM = (FIRST, LAST, TIMESTAMP)
MAX = "max"  # pops only: RocketMQ 5's ConsumeInitMode.MAX (the gRPC proxy's start)
HALF_AN_HOUR_MS = 30 * 60 * 1000  # RocketMQ's default consumeTimestamp: half an hour back


def check_group(group: object) -> str:
    if not isinstance(group, str) or not _GROUP.fullmatch(group):
        raise ValueError(f"group {shown(group)} must match {GROUP_RULE}")
    return group


def check_topic(topic: object) -> str:
    """A topic a consumer call names: the rule of every read, and no system topic
    (``SystemTopicError``)."""
    check_stored_topic(topic)
    if is_system_topic(topic):
        raise SystemTopicError(system_topic_refusal(topic, "consume"))
    return topic


def check_int(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} {value!r} must be an int >= {minimum}")
    return value


def check_consume_from(consume_from: object, consume_timestamp: object) -> None:
    """RocketMQ's ConsumeFromWhere: where a group with no committed offset starts."""
    if consume_from not in CONSUME_FROM:
        raise ValueError(f"consume_from {consume_from!r} must be one of "
                         f"{', '.join(map(repr, CONSUME_FROM))}")
    if consume_timestamp is not None:
        if consume_from != TIMESTAMP:
            raise ValueError(f"consume_timestamp {consume_timestamp!r} is only used with "
                             f"consume_from='timestamp', not {consume_from!r}")
        check_int("consume_timestamp", consume_timestamp, 0)

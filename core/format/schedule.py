"""RocketMQ 4.x's delay levels in the record format: where a delayed message is kept and what
it carries (``CommitLog.putMessage``'s rewrite, ``ScheduleMessageService``'s delivery).

A message whose ``DELAY`` property is a level > 0 is stored in ``SCHEDULE_TOPIC_XXXX``, queue
``level - 1`` (the level capped at the highest configured one, ``DELAY`` rewritten to it), with
``REAL_TOPIC`` and ``REAL_QID`` naming where it goes once due; its consume-queue tags code is
its deliver time (``dispatch.loop.TagsCoder``). The delivered copy is a new record in the real
topic and queue with the same properties text (``DELAY`` and ``REAL_*`` included, as 4.9.8
leaves them) and the real topic's tags code.
"""

from __future__ import annotations

from collections.abc import Mapping

SCHEDULE_TOPIC = "SCHEDULE_TOPIC_XXXX"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"


def delay_level(props: Mapping[str, str], max_level: int) -> int:
    """The level a message's ``DELAY`` asks for, capped at ``max_level``; 0: not delayed
    (absent, not a decimal, or <= 0)."""
    text = props.get("DELAY")
    if text is None:
        return 0
    text = text.strip()
    if not (text.isdecimal() and text.isascii()):
        return 0
    return min(int(text), max_level)


def queue_of_level(level: int) -> int:
    return level - 1


def level_of_queue(queue_id: int) -> int:
    return queue_id + 1

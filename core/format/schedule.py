"""RocketMQ 4.x's delay levels and RocketMQ 5's timers in the record format: where a delayed message is kept and what
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
TIMER_TOPIC = "rmq_sys_wheel_timer"
PROPERTY_REAL_TOPIC = "REAL_TOPIC"
PROPERTY_REAL_QID = "REAL_QID"
PROPERTY_TIMER_DELIVER_MS = "TIMER_DELIVER_MS"
PROPERTY_TIMER_DELAY_SEC = "TIMER_DELAY_SEC"
PROPERTY_TIMER_DELAY_MS = "TIMER_DELAY_MS"
PROPERTY_TIMER_OUT_MS = "TIMER_OUT_MS"
TIMER_PROPERTIES = (PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC, PROPERTY_TIMER_DELAY_MS)


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


def is_timed(props: Mapping[str, str]) -> bool:
    """Whether a message asks for a delivery time (of RocketMQ 5's timers)."""
    return any(name in props for name in TIMER_PROPERTIES)


def deliver_ms(props: Mapping[str, str], now: int) -> int:
    """The delivery time a timed message asks for (the first of ``TIMER_DELAY_SEC``,
    ``TIMER_DELAY_MS`` from ``now``, ``TIMER_DELIVER_MS``, as RocketMQ reads them);
    ValueError naming the property that is not an integer."""
    for name, scale in ((PROPERTY_TIMER_DELAY_SEC, 1000), (PROPERTY_TIMER_DELAY_MS, 1)):
        if name in props:
            return now + _integer(name, props[name]) * scale
    return _integer(PROPERTY_TIMER_DELIVER_MS, props[PROPERTY_TIMER_DELIVER_MS])


def _integer(name: str, text: str) -> int:
    value = text.strip()
    if not value.lstrip("-").isdecimal() or not value.isascii() or len(value) > 19:
        raise ValueError(f"property {name} {text!r} must be an integer")
    return int(value)


def timer_out_ms(deliver: int, precision_ms: int) -> int:
    """``TIMER_OUT_MS`` of a delivery time: rounded down to the precision, and one step
    earlier when already on a step (RocketMQ's rule: its wheel delivers a slot at its end)."""
    if deliver % precision_ms == 0:
        return deliver - precision_ms
    return deliver // precision_ms * precision_ms

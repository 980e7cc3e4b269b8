"""``config/mqstore_timers.json``: how far the timers (RocketMQ 5's delivery times) have come.

    {"readTimeMs": 1700000004000, "queueOffset": 812, "countedBelow": 523776}

``queueOffset``: the units of ``rmq_sys_wheel_timer`` queue 0 below it were taken into the
timers' index; of those, every message due at or before ``readTimeMs`` was delivered, and the
others were not. Units from ``queueOffset`` on were not yet looked at. ``countedBelow``, as in
``delayOffset.json``: every delivered copy below this commit-log offset is counted here.

RocketMQ 5 keeps this in its timer checkpoint (``timercheck``, beside its timer log and wheel,
which are indexes it derives); mqstore keeps the index in memory and this file, small and whole,
as its one piece of timer state (docs/delays.md says why).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

FIELDS = ("readTimeMs", "queueOffset", "countedBelow")


@dataclass(frozen=True)
class TimerProgress:
    read_time_ms: int = 0
    queue_offset: int = 0
    counted_below: int | None = None


def decode(text: str) -> TimerProgress:
    """The progress of ``text``; ValueError naming what is wrong."""
    doc = json.loads(text)
    if not isinstance(doc, dict):
        raise ValueError(f"timer progress: expected an object, got {text[:80]!r}")
    values = []
    for name in FIELDS:
        value = doc.get(name)
        if value is None and name == "countedBelow":
            values.append(None)
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"timer progress: {name} {value!r} must be an integer >= 0")
        values.append(value)
    return TimerProgress(*values)


def encode(progress: TimerProgress) -> str:
    doc = {"readTimeMs": progress.read_time_ms, "queueOffset": progress.queue_offset}
    if progress.counted_below is not None:
        doc["countedBelow"] = progress.counted_below
    return json.dumps(doc) + "\n"

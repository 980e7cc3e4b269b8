"""Receipt handles of the pop consumer: opaque strings to callers, checked before any lookup.

    mq2:<topic>:<group>:<queue id>:<queue offset>:<attempt>:<delivery, hex>:<crc32, 8 hex>

``delivery`` is the delivery number, unique per delivery within the topic and group (every
pop, redelivery and change of invisible time takes a new one, above every earlier one and
above the store clock shifted left: ``PopState.next_delivery``), so a handle names one
delivery and no other. The crc covers the text before it, so a handle garbled on its way
back is refused as one this store never handed out, instead of reading as some other
delivery. What a handle needs to be checked is in it: the state file (topic, group), the
in-flight entry (queue, offset) and whether it is still the current delivery there
(delivery); the attempt only lets the refusal say why a handle went stale. Topics and groups
hold no ``:`` (``names``).

Handles of the format before (``mq1:<topic>:<group>:<queue>:<offset>:<attempt>:<delivery>``,
decimal, no crc) are still read: their deliveries carried over into the journal's state.
"""

from __future__ import annotations

import zlib

from mqstore.consumer import names
from mqstore.consumer.errors import ReceiptHandleError

PREFIX = "mq2"
OLD_PREFIX = "mq1"
FORMAT = f"{PREFIX}:<topic>:<group>:<queue>:<offset>:<attempt>:<delivery>:<check>"


def make_handle(topic: str, group: str, queue_id: int, offset: int, attempt: int,
                delivery: int) -> str:
    text = f"{PREFIX}:{topic}:{group}:{queue_id}:{offset}:{attempt}:{delivery:x}"
    return f"{text}:{zlib.crc32(text.encode()):08x}"


def parse_handle(handle: object) -> tuple[str, str, int, int, int, int]:
    """``(topic, group, queue, offset, attempt, delivery)``, or ``ReceiptHandleError``."""
    try:
        if not isinstance(handle, str):
            raise ValueError
        text, _, check = handle.rpartition(":")
        parts = text.split(":")
        if len(parts) == 7 and parts[0] == PREFIX:
            if len(check) != 8 or int(check, 16) != zlib.crc32(text.encode()):
                raise ValueError
            delivery = int(parts[6], 16)
        elif len(parts) == 6 and parts[0] == OLD_PREFIX:
            delivery = int(check)
        else:
            raise ValueError
        topic, group = parts[1], parts[2]
        if (topic, group) not in _CHECKED:
            names.check_topic(topic)
            names.check_group(group)
            if len(_CHECKED) >= 1024:
                _CHECKED.clear()
            _CHECKED.add((topic, group))
        q, offset, attempt = int(parts[3]), int(parts[4]), int(parts[5])
        if q < 0 or offset < 0 or attempt < 0 or delivery < 0 or q >= 1 << 31:
            raise ValueError
    except ValueError:
        raise ReceiptHandleError(f"receipt handle {handle!r} is not one this store hands out "
                                 f"(they read {FORMAT})") from None
    return topic, group, q, offset, attempt, delivery


_CHECKED: set = set()  # topic and group pairs whose names passed the check

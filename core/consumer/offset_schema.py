"""The shape of ``config/consumerOffset.json``, checked whole every time it is read.

    {"offsetTable": {"<topic>@<group>": {"<queue id>": <offset>, ...}, ...}, <other keys>}

``offsetTable`` must be there (RocketMQ's ConsumerOffsetManager and mqstore always write it):
a document without it is not an offset table that happens to be empty. Keys are a topic and a
group as RocketMQ names them, joined by ``@``; queue ids are decimal ints >= 0 without leading
zeros (``"7"``, never ``"07"``, so that no two keys name one queue); offsets are JSON integers
>= 0 (not strings, floats or booleans). Other top-level keys a broker wrote (``dataVersion``,
``pullOffsetTable`` ...) are kept as they are and not interpreted.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictInt, StringConstraints, ValidationError

from mqstore.consumer.names import GROUP_RULE, TOPIC_RULE

TABLE = "offsetTable"
_TOPIC = r"[%|a-zA-Z0-9_.-]{1,255}"
_GROUP = r"[%|a-zA-Z0-9_-]{1,255}"
_KEY = rf"^{_TOPIC}@{_GROUP}$"
_QUEUE_ID = r"^(0|[1-9][0-9]{0,9})$"
TableKey = Annotated[str, StringConstraints(pattern=_KEY)]
QueueId = Annotated[str, StringConstraints(pattern=_QUEUE_ID)]
Offset = Annotated[StrictInt, Field(ge=0)]


class OffsetDocument(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)
    offsetTable: dict[TableKey, dict[QueueId, Offset]]  # noqa: N815 - RocketMQ's name


def check_offsets(doc: object) -> dict:
    """``doc`` when it has the shape above; else ValueError saying where and what is wrong."""
    try:
        OffsetDocument.model_validate(doc)
    except ValidationError as exc:
        problems = [_describe(err) for err in exc.errors()]
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise ValueError(problems[0] + more) from None
    return doc


def is_entry(key: str, queue_id: int, offset: int) -> bool:
    """Whether one offset (a journal line's) fits the document."""
    return (re.fullmatch(_KEY, key) is not None and re.fullmatch(_QUEUE_ID, str(queue_id))
            is not None and offset >= 0)


def _describe(err: dict) -> str:
    loc = list(err["loc"])
    value = _short(err.get("input"))
    if loc and loc[-1] == "[key]":
        key = loc[-2]
        if len(loc) == 3:  # a key of offsetTable
            return (f"{TABLE} key {_short(key)} is not <topic>@<group> (topic {TOPIC_RULE}; "
                    f"group {GROUP_RULE})")
        return (f"{_path(loc[:-2])}: queue id {_short(key)} is not a decimal int >= 0 without "
                f"leading zeros")
    if err["type"] == "missing":
        return f"no {_path(loc)}: not an offset table (RocketMQ's has one, even when empty)"
    if len(loc) == 3:
        return f"{_path(loc)} is {value}, not a queue offset (a JSON integer >= 0)"
    if len(loc) == 2:
        return f"{_path(loc)} is {value}, not an object of queue offsets"
    if len(loc) == 1:
        return f"{_path(loc)} is {value}, not an object of <topic>@<group> entries"
    return f"the document is {value}, not a JSON object"


def _path(loc: list) -> str:
    return loc[0] + "".join(f"[{_short(part)}]" for part in loc[1:]) if loc else "document"


def _short(value: object, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit - 3] + "..."

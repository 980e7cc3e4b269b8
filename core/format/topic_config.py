"""RocketMQ's topic configs, ``config/topics.json``: the document, checked, and its text.

The broker's ``TopicConfigManager`` keeps the file (a ``TopicConfigSerializeWrapper``, written
by fastjson pretty-printed: tabs, no space after ``:``, fields sorted); mqstore reads and
writes the same document, so a broker's store directory brings its topics along and a broker
reads what mqstore wrote::

    {
        "dataVersion":{                         bumped at every change
            "counter":3,
            "stateVersion":0,                   5.x only
            "timestamp":1622907213314           ms of the last change
        },
        "topicConfigTable":{                    keyed by topic name
            "TopicTest":{
                "attributes":{},                5.x only ("message.type": "FIFO" ...)
                "order":false,
                "perm":6,                       PRIORITY 8 | READ 4 | WRITE 2 | INHERIT 1
                "readQueueNums":4,              queues consumers read: ids 0..n-1
                "topicFilterType":"SINGLE_TAG", SINGLE_TAG | MULTI_TAG
                "topicName":"TopicTest",        the key again
                "topicSysFlag":0,
                "writeQueueNums":4              queues producers write: ids 0..n-1
            }
        }
    }

Every field is checked strictly (types, Java int ranges, the key matching ``topicName``); a
field a 4.x broker did not write takes its Java default, and keys this module does not know
(a later RocketMQ's) are kept as they are. Pure: text <-> values, no files.
"""

from __future__ import annotations

import json
from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

INT32_MIN = -(1 << 31)
INT32_MAX = (1 << 31) - 1

PERM_PRIORITY = 8
PERM_READ = 4
PERM_WRITE = 2
PERM_INHERIT = 1
PERM_READ_WRITE = PERM_READ | PERM_WRITE
# The permissions an operator gives a topic (mqadmin updateTopic -p): write, read, both.
SETTABLE_PERMS = (PERM_WRITE, PERM_READ, PERM_READ_WRITE)
# RocketMQ's TopicConfig defaults (fields a broker's file may lack take them).
JAVA_DEFAULT_QUEUE_NUMS = 16
SINGLE_TAG = "SINGLE_TAG"


class _Document(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, strict=True, populate_by_name=True)


class TopicConfig(_Document):
    """One topic's config, as RocketMQ's ``TopicConfig`` serializes it."""

    name: str = Field(alias="topicName", min_length=1)
    read_queue_nums: int = Field(JAVA_DEFAULT_QUEUE_NUMS, alias="readQueueNums", ge=0,
                                 le=INT32_MAX)
    write_queue_nums: int = Field(JAVA_DEFAULT_QUEUE_NUMS, alias="writeQueueNums", ge=0,
                                  le=INT32_MAX)
    perm: int = Field(PERM_READ_WRITE, ge=0, le=15)
    topic_filter_type: Literal["SINGLE_TAG", "MULTI_TAG"] = Field(SINGLE_TAG,
                                                                  alias="topicFilterType")
    topic_sys_flag: int = Field(0, alias="topicSysFlag", ge=INT32_MIN, le=INT32_MAX)
    order: bool = False
    attributes: dict[str, str] | None = None  # 5.x; None: the file did not have the key

    @property
    def readable(self) -> bool:
        return bool(self.perm & PERM_READ)

    @property
    def writable(self) -> bool:
        return bool(self.perm & PERM_WRITE)

    @property
    def perm_text(self) -> str:
        return perm_text(self.perm)

    def changed(self, **fields) -> "TopicConfig":
        """A copy with ``fields`` (Python names) replaced, checked again."""
        data = self.model_dump(by_alias=False)
        data.update(fields)
        return TopicConfig.model_validate(data)


class DataVersion(_Document):
    """RocketMQ's ``DataVersion``: which version of the table this is."""

    state_version: int | None = Field(None, alias="stateVersion")  # 5.x
    timestamp: int = 0
    counter: int = Field(0, ge=0)

    def next(self, now_ms: int) -> "DataVersion":
        """The version after one change made at ``now_ms`` (RocketMQ's ``nextVersion``)."""
        return self.model_copy(update={"timestamp": int(now_ms), "counter": self.counter + 1})


class TopicTable(_Document):
    """The whole document."""

    topics: dict[str, TopicConfig] = Field(alias="topicConfigTable")
    data_version: DataVersion = Field(DataVersion(), alias="dataVersion")

    @model_validator(mode="after")
    def _keys_are_names(self) -> "TopicTable":
        for key, config in self.topics.items():
            if key != config.name:
                raise ValueError(f"topicConfigTable key {key!r} holds the config of topic "
                                 f"{config.name!r} (topicName must equal its key)")
        return self

    def with_topics(self, topics: dict[str, TopicConfig], now_ms: int) -> "TopicTable":
        """The next version of the table, holding ``topics``."""
        return self.model_copy(update={"topics": dict(topics),
                                       "data_version": self.data_version.next(now_ms)})


def empty_table() -> TopicTable:
    """A new document, in 5.x's shape."""
    return TopicTable(topicConfigTable={}, dataVersion=DataVersion(stateVersion=0))


def new_topic(name: str, read_queue_nums: int, write_queue_nums: int,
              perm: int = PERM_READ_WRITE) -> TopicConfig:
    """A topic as a 5.x broker creates one (``attributes`` included)."""
    return TopicConfig(topicName=name, readQueueNums=read_queue_nums,
                       writeQueueNums=write_queue_nums, perm=perm, attributes={})


def perm_text(perm: int) -> str:
    """RocketMQ's ``PermName.perm2String``: ``6`` -> ``"RW-"``, ``7`` -> ``"RWX"``."""
    return ("R" if perm & PERM_READ else "-") + ("W" if perm & PERM_WRITE else "-") + (
        "X" if perm & PERM_INHERIT else "-")


def decode_table(text: str) -> TopicTable:
    """The document in ``text``; ValueError naming the first problems when it is not one."""
    return decode_document(text, TopicTable, "topicConfigTable")


_Doc = TypeVar("_Doc", bound=BaseModel)


def decode_document(text: str, model: type[_Doc], table: str) -> _Doc:
    """A broker's JSON document (``table`` names its map) as ``model``; ValueError naming
    the first problems when it is not one."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not valid JSON ({exc.msg} at line {exc.lineno}, column "
                         f"{exc.colno})") from None
    if not isinstance(data, dict):
        raise ValueError(f"holds a {type(data).__name__}, not an object with a {table}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ValueError(describe_errors(exc)) from None


def encode_table(table: TopicTable) -> str:
    """The document as fastjson pretty-prints it (tabs, ``"key":value``, keys sorted)."""
    data = table.model_dump(by_alias=True, exclude_none=True)
    return json.dumps(data, indent="\t", separators=(",", ":"), sort_keys=True,
                      ensure_ascii=False) + "\n"


def describe_errors(exc: ValidationError, limit: int = 3) -> str:
    """pydantic's errors as one line: where, what and the value found, the first few."""
    parts = []
    for err in exc.errors()[:limit]:
        where = ".".join(str(p) for p in err["loc"]) or "the document"
        if err["type"] == "missing":
            parts.append(f"{where}: missing")
        elif err["type"] == "value_error":
            parts.append(err["msg"].removeprefix("Value error, "))
        else:
            shown = repr(err.get("input"))
            shown = shown if len(shown) <= 60 else shown[:57] + "..."
            parts.append(f"{where}: {err['msg'].lower()} (got {shown})")
    more = len(exc.errors()) - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")

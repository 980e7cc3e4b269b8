"""RocketMQ's consumer group configs, ``config/subscriptionGroup.json``: the document,
checked, and its text.

The broker's ``SubscriptionGroupManager`` keeps the file (fastjson pretty-printed, as
``topics.json``: tabs, no space after ``:``, fields sorted)::

    {
        "dataVersion":{"counter":1, "timestamp":1795869353458},
        "subscriptionGroupTable":{                  keyed by group name
            "FixGroup":{
                "brokerId":0,                       the broker a slow consumer is sent to ...
                "consumeBroadcastEnable":true,
                "consumeEnable":true,
                "consumeFromMinEnable":true,
                "consumeMessageOrderly":false,      5.x only: a FIFO group
                "groupName":"FixGroup",             the key again
                "notifyConsumerIdsChangedEnable":true,
                "retryMaxTimes":16,                 retries before a message is dead-lettered
                "retryQueueNums":1,                 queues of %RETRY%<group>
                "whichBrokerWhenConsumeSlowly":1
            }
        }
    }

A group the table does not list has ``SubscriptionGroupConfig``'s defaults. Fields a 4.x
broker did not write take their Java defaults and are not written back; keys this module does
not know (a later RocketMQ's: ``groupSysFlag``, ``attributes`` ...) are kept as they are. Pure:
text <-> values, no files.
"""

from __future__ import annotations

import json

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mqstore.format.topic_config import INT32_MAX, DataVersion, decode_document, describe_errors

DEFAULT_RETRY_MAX_TIMES = 16
DEFAULT_RETRY_QUEUE_NUMS = 1
MAX_RETRY_MAX_TIMES = 1000  # far beyond RocketMQ's delay levels; a larger count is a mistake
# The fields an operator may set (Python names), each as its document key.
SETTABLE = {
    "consume_enable": "consumeEnable",
    "consume_broadcast_enable": "consumeBroadcastEnable",
    "retry_queue_nums": "retryQueueNums",
    "retry_max_times": "retryMaxTimes",
    "consume_message_orderly": "consumeMessageOrderly",
}


class GroupConfig(BaseModel):
    """One group's config, as RocketMQ's ``SubscriptionGroupConfig`` serializes it."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, populate_by_name=True)

    name: str = Field(alias="groupName", min_length=1)
    consume_enable: bool = Field(True, alias="consumeEnable")
    consume_from_min_enable: bool = Field(True, alias="consumeFromMinEnable")
    consume_broadcast_enable: bool = Field(True, alias="consumeBroadcastEnable")
    retry_queue_nums: int = Field(DEFAULT_RETRY_QUEUE_NUMS, alias="retryQueueNums", ge=1,
                                  le=INT32_MAX)
    retry_max_times: int = Field(DEFAULT_RETRY_MAX_TIMES, alias="retryMaxTimes", ge=0,
                                 le=MAX_RETRY_MAX_TIMES)
    broker_id: int = Field(0, alias="brokerId", ge=0)
    which_broker_when_consume_slowly: int = Field(1, alias="whichBrokerWhenConsumeSlowly",
                                                  ge=0)
    notify_consumer_ids_changed_enable: bool = Field(True,
                                                     alias="notifyConsumerIdsChangedEnable")
    consume_message_orderly: bool | None = Field(None, alias="consumeMessageOrderly")  # 5.x

    @property
    def max_attempts(self) -> int:
        """Deliveries a message gets before it is dead-lettered: the first and the retries."""
        return self.retry_max_times + 1

    @property
    def orderly(self) -> bool:
        """Whether the group consumes in order (a FIFO group)."""
        return bool(self.consume_message_orderly)

    def changed(self, **fields) -> "GroupConfig":
        """A copy with ``fields`` (names of ``SETTABLE``) replaced, checked again; ValueError
        naming the field and the rule."""
        unknown = sorted(set(fields) - set(SETTABLE))
        if unknown:
            raise ValueError(f"group config fields {unknown} cannot be set; the settable ones "
                             f"are {sorted(SETTABLE)}")
        data = self.model_dump(by_alias=True, exclude_none=True)
        data.update({SETTABLE[k]: v for k, v in fields.items()})
        try:
            return GroupConfig.model_validate(data)
        except ValidationError as exc:
            raise ValueError(f"group {self.name!r}: {describe_errors(exc)}") from None


def default_config(group: str) -> GroupConfig:
    """The config of a group the table does not list (a 4.x broker's defaults)."""
    return GroupConfig(groupName=group)


class GroupTable(BaseModel):
    """The whole document."""

    model_config = ConfigDict(extra="allow", frozen=True, strict=True, populate_by_name=True)

    groups: dict[str, GroupConfig] = Field(alias="subscriptionGroupTable")
    data_version: DataVersion = Field(DataVersion(), alias="dataVersion")

    @model_validator(mode="after")
    def _keys_are_names(self) -> "GroupTable":
        for key, config in self.groups.items():
            if key != config.name:
                raise ValueError(f"subscriptionGroupTable key {key!r} holds the config of group "
                                 f"{config.name!r} (groupName must equal its key)")
        return self

    def with_group(self, config: GroupConfig, now_ms: int) -> "GroupTable":
        """The next version of the table, with ``config`` in place of its group's."""
        groups = dict(self.groups)
        groups[config.name] = config
        return self.model_copy(update={"groups": groups,
                                       "data_version": self.data_version.next(now_ms)})


def empty_table() -> GroupTable:
    return GroupTable(subscriptionGroupTable={}, dataVersion=DataVersion(stateVersion=0))


def decode_table(text: str) -> GroupTable:
    """The document in ``text``; ValueError naming the first problems when it is not one."""
    return decode_document(text, GroupTable, "subscriptionGroupTable")


def encode_table(table: GroupTable) -> str:
    """The document as fastjson pretty-prints it (tabs, ``"key":value``, fields sorted); the
    groups stay in the table's order (a broker's map order), so a rewrite moves no line."""
    dumped = table.model_dump(by_alias=True, exclude_none=True)
    groups = dumped.pop("subscriptionGroupTable")
    dumped["subscriptionGroupTable"] = {name: _sorted(c) for name, c in groups.items()}
    data = {k: dumped[k] if k == "subscriptionGroupTable" else _sorted(dumped[k])
            for k in sorted(dumped)}
    return json.dumps(data, indent="\t", separators=(",", ":"), ensure_ascii=False)


def _sorted(value):
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    return value

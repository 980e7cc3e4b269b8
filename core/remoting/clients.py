"""The clients of the broker (``ConsumerManager``, ``ProducerManager``): who heart-beat, in
which groups, with which subscriptions, on which connection.

A HEART_BEAT body lists the client's consumer groups (with their subscriptions) and producer
groups. A consumer group's members are the client ids that heart-beat for it; the group
changes when a client joins it, leaves it (UNREGISTER_CLIENT), its connection closes, or it
has not heart-beat for ``CLIENT_EXPIRY_S`` (clients heart-beat every 30 s); then every member
left is told with a oneway NOTIFY_CONSUMER_IDS_CHANGED on its connection, so it rebalances
at once (``Broker2Client.notifyConsumerIdsChanged``).

Both clients' dialects are read: Java's enums by name and subVersion a number, the C++
client's enums as numbers, subVersion a string, no expressionType. Only the event loop's thread
calls this.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from mqstore.remoting.codes import RemotingError, Resp

CLIENT_EXPIRY_S = 120.0  # ClientHousekeepingService: channelExpiredTimeout
MAX_GROUPS_PER_HEARTBEAT = 1024
MAX_SUBSCRIPTIONS = 4096
CONSUME_TYPES = {0: "CONSUME_ACTIVELY", 1: "CONSUME_PASSIVELY"}
MESSAGE_MODELS = {0: "BROADCASTING", 1: "CLUSTERING"}
CONSUME_FROM = {0: "CONSUME_FROM_LAST_OFFSET", 1: "CONSUME_FROM_LAST_OFFSET_AND_FROM_MIN_WHEN_BOOT_FIRST",
                2: "CONSUME_FROM_MIN_OFFSET", 3: "CONSUME_FROM_MAX_OFFSET",
                4: "CONSUME_FROM_FIRST_OFFSET", 5: "CONSUME_FROM_TIMESTAMP"}


@dataclass
class Subscription:
    topic: str
    expression: str
    expression_type: str
    sub_version: int

    def doc(self) -> dict:
        """``SubscriptionData`` as fastjson writes it."""
        tags = [] if self.expression in ("*", "") or self.expression_type != "TAG" else [
            t.strip() for t in self.expression.split("||") if t.strip()]
        return {"classFilterMode": False, "codeSet": [], "expressionType": self.expression_type,
                "subString": self.expression, "subVersion": self.sub_version, "tagsSet": tags,
                "topic": self.topic}


@dataclass
class Member:
    client_id: str
    connection: object
    language: str
    version: int
    seen: float


@dataclass
class ConsumerGroup:
    name: str
    consume_type: str = "CONSUME_PASSIVELY"
    message_model: str = "CLUSTERING"
    consume_from: str = "CONSUME_FROM_LAST_OFFSET"
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    members: dict[str, Member] = field(default_factory=dict)


def _enum(value, names: dict, default: str) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return names.get(value, default)
    return value if isinstance(value, str) else default


def _sub_version(value) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


def parse_subscription(doc) -> Subscription:
    if not isinstance(doc, dict) or not isinstance(doc.get("topic"), str):
        raise RemotingError(Resp.SYSTEM_ERROR, f"subscription {doc!r} names no topic")
    expression = doc.get("subString")
    kind = doc.get("expressionType") or "TAG"
    return Subscription(doc["topic"], expression if isinstance(expression, str) else "*",
                        kind if isinstance(kind, str) else "TAG",
                        _sub_version(doc.get("subVersion")))


class Clients:
    def __init__(self, clock=time.monotonic) -> None:
        self._clock = clock
        self.consumers: dict[str, ConsumerGroup] = {}
        self.producers: dict[str, dict[str, Member]] = {}

    # -- heartbeats -----------------------------------------------------------------------
    def heartbeat(self, connection, doc, language: str, version: int) -> list[str]:
        """Record a HEART_BEAT body; the consumer groups whose members changed."""
        if not isinstance(doc, dict) or not isinstance(doc.get("clientID"), str):
            raise RemotingError(Resp.SYSTEM_ERROR, "heartbeat body has no clientID")
        client_id = doc["clientID"]
        consumers = doc.get("consumerDataSet") or []
        producers = doc.get("producerDataSet") or []
        if (not isinstance(consumers, list) or not isinstance(producers, list)
                or len(consumers) + len(producers) > MAX_GROUPS_PER_HEARTBEAT):
            raise RemotingError(Resp.SYSTEM_ERROR, (
                f"heartbeat of {client_id!r}: consumerDataSet and producerDataSet must be "
                f"lists of at most {MAX_GROUPS_PER_HEARTBEAT} groups together"))
        now = self._clock()
        changed = []
        for data in consumers:
            if not isinstance(data, dict) or not isinstance(data.get("groupName"), str):
                raise RemotingError(Resp.SYSTEM_ERROR, f"consumer data {data!r} names no group")
            subs = data.get("subscriptionDataSet") or []
            if not isinstance(subs, list) or len(subs) > MAX_SUBSCRIPTIONS:
                raise RemotingError(Resp.SYSTEM_ERROR, "subscriptionDataSet must be a list")
            parsed = [parse_subscription(s) for s in subs]
            group = self.consumers.setdefault(data["groupName"], ConsumerGroup(data["groupName"]))
            group.consume_type = _enum(data.get("consumeType"), CONSUME_TYPES, group.consume_type)
            group.message_model = _enum(data.get("messageModel"), MESSAGE_MODELS,
                                        group.message_model)
            group.consume_from = _enum(data.get("consumeFromWhere"), CONSUME_FROM,
                                       group.consume_from)
            for sub in parsed:
                old = group.subscriptions.get(sub.topic)
                if old is None or old.sub_version <= sub.sub_version:
                    group.subscriptions[sub.topic] = sub
            member = group.members.get(client_id)
            if member is None or member.connection is not connection:
                changed.append(group.name)
            group.members[client_id] = Member(client_id, connection, language, version, now)
        for data in producers:
            name = data.get("groupName") if isinstance(data, dict) else None
            if isinstance(name, str):
                self.producers.setdefault(name, {})[client_id] = Member(
                    client_id, connection, language, version, now)
        return changed

    def unregister(self, client_id: str, producer_group: str | None,
                   consumer_group: str | None) -> list[str]:
        if producer_group:
            self.producers.get(producer_group, {}).pop(client_id, None)
        if consumer_group:
            group = self.consumers.get(consumer_group)
            if group is not None and group.members.pop(client_id, None) is not None:
                self._drop_if_empty(group)
                return [consumer_group]
        return []

    def connection_closed(self, connection) -> list[str]:
        return self._remove(lambda m: m.connection is connection)

    def expire(self) -> list[str]:
        before = self._clock() - CLIENT_EXPIRY_S
        return self._remove(lambda m: m.seen < before)

    def _remove(self, gone) -> list[str]:
        changed = []
        for group in list(self.consumers.values()):
            dead = [cid for cid, m in group.members.items() if gone(m)]
            for cid in dead:
                del group.members[cid]
            if dead:
                changed.append(group.name)
                self._drop_if_empty(group)
        for name, members in list(self.producers.items()):
            for cid in [cid for cid, m in members.items() if gone(m)]:
                del members[cid]
            if not members:
                del self.producers[name]
        return changed

    def _drop_if_empty(self, group: ConsumerGroup) -> None:
        if not group.members:
            del self.consumers[group.name]

    # -- lookups --------------------------------------------------------------------------
    def group(self, name: str) -> ConsumerGroup | None:
        return self.consumers.get(name)

    def member_ids(self, name: str) -> list[str]:
        group = self.consumers.get(name)
        return sorted(group.members) if group is not None else []

    def groups_of_topic(self, topic: str) -> list[str]:
        return sorted(g.name for g in self.consumers.values() if topic in g.subscriptions)


__all__ = ["Clients", "ConsumerGroup", "Subscription", "Member", "parse_subscription"]

"""What each client host may create through the endpoint: topics, by sending to topics that do
not exist (``topics.auto_create``), and consumer groups, by receiving for a group that has no
pop state for the topic (each one files of its own on disk).

Counted per client host (the peer's IP address, whatever its port: a client that reconnects is
the same host) while serve runs, at most ``server.grpc_peer_max_new_topics`` topics and
``server.grpc_peer_max_new_groups`` groups each. Past them the endpoint answers as a RocketMQ
broker with auto-creation off answers: TOPIC_NOT_FOUND (40402) for the send, and
CONSUMER_GROUP_NOT_FOUND (40403) for the receive (the broker's SUBSCRIPTION_GROUP_NOT_EXIST,
as the proxy maps it), both naming the setting; the clients take both as final, not as a
reason to retry. What exists already (topics with queues or a config, groups with state) is
never counted, nor are topics and groups made through the admin service or the API.

The table of hosts holds at most ``MAX_HOSTS``; past it the host heard from least recently is
forgotten, and its count starts again.
"""

from __future__ import annotations

from collections import OrderedDict

from mqstore.endpoint.protocol import Code
from mqstore.endpoint.status import EndpointError

MAX_HOSTS = 65_536
MAX_KNOWN_GROUPS = 65_536  # (topic, group) pairs remembered to have state: no look at the disk


def peer_host(peer: str) -> str:
    """``ipv4:1.2.3.4:5`` -> ``1.2.3.4``; ``ipv6:[::1]:5`` -> ``::1``; anything else whole."""
    scheme, _sep, address = peer.partition(":")
    if scheme == "ipv4":
        return address.rpartition(":")[0] or address
    if scheme == "ipv6":
        return address.rpartition(":")[0].strip("[]") or address
    return peer


class Creations:
    """The counts. Only the event loop's thread calls it. ``has_group(topic, group)``: whether
    the store holds state of that group for that topic."""

    def __init__(self, max_topics: int, max_groups: int, has_group) -> None:
        self.max_topics = max_topics
        self.max_groups = max_groups
        self._has_group = has_group
        self._hosts: OrderedDict = OrderedDict()  # host -> [topics, groups] created
        self._topics: set[str] = set()  # topics a peer was let create (counted once)
        self._groups: OrderedDict = OrderedDict()  # (topic, group) known to have state

    def _counts(self, peer: str) -> list:
        host = peer_host(peer)
        counts = self._hosts.get(host)
        if counts is None:
            counts = self._hosts[host] = [0, 0]
            if len(self._hosts) > MAX_HOSTS:
                self._hosts.popitem(last=False)
        else:
            self._hosts.move_to_end(host)
        return counts

    def topic(self, peer: str, topic: str) -> None:
        """A send from ``peer`` would create ``topic``: count it, or TOPIC_NOT_FOUND."""
        if topic in self._topics:
            return
        counts = self._counts(peer)
        if counts[0] >= self.max_topics:
            raise EndpointError(Code.TOPIC_NOT_FOUND, (
                f"topic {topic!r} does not exist, and client host {peer_host(peer)} has created "
                f"{counts[0]} topics, the most server.grpc_peer_max_new_topics lets one host "
                f"create; create it with `mqstore topic create`"))
        counts[0] += 1
        self._topics.add(topic)

    def group(self, peer: str, topic: str, group: str) -> None:
        """A receive from ``peer`` for ``group``: count it when the group has no state for
        ``topic`` yet, or CONSUMER_GROUP_NOT_FOUND past the host's allowance."""
        key = (topic, group)
        if key in self._groups:
            self._groups.move_to_end(key)
            return
        if not self._has_group(topic, group):
            counts = self._counts(peer)
            if counts[1] >= self.max_groups:
                raise EndpointError(Code.CONSUMER_GROUP_NOT_FOUND, (
                    f"group {group!r} has never received from topic {topic!r}, and client "
                    f"host {peer_host(peer)} has started {counts[1]} groups, the most "
                    f"server.grpc_peer_max_new_groups lets one host start"))
            counts[1] += 1
        self._groups[key] = True
        if len(self._groups) > MAX_KNOWN_GROUPS:
            self._groups.popitem(last=False)


__all__ = ["Creations", "peer_host", "MAX_HOSTS"]

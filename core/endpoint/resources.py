"""Resource names: a client's ``Resource{resource_namespace, name}`` <-> the store's topic or
group name.

As RocketMQ's NamespaceUtil, a namespaced resource is stored as ``<namespace>%<name>`` (``%``
is allowed in topic and group names, so a RocketMQ broker's store directory reads the same),
and a stored name splits back at its first ``%``.

Every name a request carries is checked here, namespace and all, before anything looks it up:
a bad topic is ILLEGAL_TOPIC (40002), a bad group ILLEGAL_CONSUMER_GROUP (40003), each naming
the value (cut short when long) and the rule, never the store's ValueError as a failure.
"""

from __future__ import annotations

from mqstore.append.encoding import topic_refusal
from mqstore.consumer import names
from mqstore.format import names as put_names
from mqstore.endpoint.protocol import Code, Resource
from mqstore.endpoint.status import EndpointError
from mqstore.errors import SystemTopicError

NAMESPACE_SEPARATOR = "%"


def full_name(resource) -> str:
    namespace, name = resource.resource_namespace, resource.name
    return f"{namespace}{NAMESPACE_SEPARATOR}{name}" if namespace else name


def resource(stored: str) -> Resource:
    namespace, sep, name = stored.partition(NAMESPACE_SEPARATOR)
    return Resource(resource_namespace=namespace, name=name) if sep else Resource(name=stored)


def topic_to_read(res) -> str:
    """A topic a client reads: the store's rule for topics (a RocketMQ broker's topic names
    may hold dots), else ILLEGAL_TOPIC; a system topic is FORBIDDEN (no route either)."""
    topic = full_name(res)
    try:
        return names.check_topic(topic)
    except SystemTopicError as exc:
        raise EndpointError(Code.FORBIDDEN, str(exc)) from None
    except ValueError as exc:
        raise EndpointError(Code.ILLEGAL_TOPIC, str(exc)) from None


def topic_to_write(topic: str, auto_v2: bool = True) -> str:
    """A topic a client sends to: RocketMQ's character rule and the length a put stores
    (``topic_refusal``: 127 characters as the proxy's rule, 255 for %RETRY% topics in V2
    records; ``auto_v2``: ``commit_log.auto_v2_on_long_topic``), else ILLEGAL_TOPIC; a system
    topic is FORBIDDEN."""
    try:
        put_names.check_topic(topic)
    except ValueError as exc:
        raise EndpointError(Code.ILLEGAL_TOPIC, str(exc)) from None
    if put_names.is_system_topic(topic):
        raise EndpointError(Code.FORBIDDEN, put_names.system_topic_refusal(topic, "send to"))
    refusal = topic_refusal(topic, auto_v2)
    if refusal is not None:
        raise EndpointError(Code.ILLEGAL_TOPIC, refusal)
    return topic


def group_name(res) -> str:
    group = full_name(res)
    try:
        return names.check_group(group)
    except ValueError as exc:
        raise EndpointError(Code.ILLEGAL_CONSUMER_GROUP, str(exc)) from None


__all__ = ["full_name", "resource", "topic_to_read", "topic_to_write", "group_name"]

"""QueryRoute: which topics exist, with which queues, and the one broker serving them;
QueryAssignment: what a push consumer receives from (``assignment_response``).

``Topics.queues`` is the single lookup of a topic's queues. A topic with a config
(``config/topics.json``, ``store.topic_config``; docs/topics.md) exists, and its queues are its
write queues, the ones its puts pick among (the store refuses any other). Without one, a topic
exists once the store has a queue of it, or once this endpoint took a send to it (its queues
appear when dispatch reaches them), and its queues are those the store has plus the
``queue_select.queues_per_topic`` the store's selector spreads sends over. A send to a topic
that does not exist creates it when ``topics.auto_create`` allows; a route query
for it then answers the queues it will have, as a RocketMQ broker with autoCreateTopicEnable
answers with its default topic's route; a receive from it gets TOPIC_NOT_FOUND.

The route names one broker (``BROKER_NAME``, id 0, read-write, NORMAL, FIFO and DELAY messages) whose
endpoints are the address the client dialled (the request's ``endpoints``), so a client behind
NAT or a name keeps using the address that reached us; the endpoint's own address otherwise.
"""

from __future__ import annotations

from mqstore.endpoint.protocol import Code, definition_pb2, service_pb2
from mqstore.errors import CorruptStateError
from mqstore.endpoint.status import EndpointError, ok, status

BROKER_NAME = "mqstore"
ASSIGNED_QUEUE = -1  # the proxy's queue id of a pop-mode assignment: all the broker's queues
ACCEPTED_TYPES = (definition_pb2.MessageType.NORMAL, definition_pb2.MessageType.FIFO,
                  definition_pb2.MessageType.DELAY, definition_pb2.MessageType.TRANSACTION)


class Topics:
    """The store's topics as the endpoint serves them. Only the event loop's thread calls
    it."""

    def __init__(self, store, queues_per_topic: int, auto_create: bool) -> None:
        self._store = store
        self.queues_per_topic = queues_per_topic
        self.auto_create = auto_create
        self._known: set[str] = set()  # topics seen to exist (topics are never deleted here)

    def exists(self, topic: str) -> bool:
        if topic in self._known:
            return True
        if self._config(topic) is not None or self._store.queue_ids(topic):
            self._known.add(topic)
            return True
        return False

    def queues(self, topic: str) -> list[int] | None:
        """The topic's queue ids; None when it does not exist."""
        if not self.exists(topic):
            return None
        config = self._config(topic)
        if config is not None:  # a topic without write queues is routed to its read queues
            return list(range(config.write_queue_nums or config.read_queue_nums))
        return sorted(set(self._store.queue_ids(topic)) | set(range(self.queues_per_topic)))

    def _config(self, topic: str):
        """The topic's config, or None (it has none, or topics.json is damaged: its puts
        answer why)."""
        try:
            return self._store.topic_config(topic)
        except CorruptStateError:
            return None

    def for_send(self, topic: str) -> bool:
        """Whether ``topic`` exists; False: a send creates it (TOPIC_NOT_FOUND when it may
        not)."""
        if topic in self._known or self.exists(topic):
            return True
        if not self.auto_create:
            raise EndpointError(Code.TOPIC_NOT_FOUND, (
                f"topic {topic!r} does not exist and topics.auto_create is "
                f"false"))
        return False

    def created(self, topic: str) -> None:
        """A send to ``topic`` was stored: it exists from now on."""
        self._known.add(topic)

    def for_route(self, topic: str) -> list[int]:
        queues = self.queues(topic)
        if queues is not None:
            return queues
        if self.auto_create:
            return list(range(self.queues_per_topic))
        raise EndpointError(Code.TOPIC_NOT_FOUND, f"topic {topic!r} does not exist")

    def for_receive(self, topic: str) -> None:
        if not self.exists(topic):
            raise EndpointError(Code.TOPIC_NOT_FOUND, (
                f"topic {topic!r} does not exist: nothing was ever sent to it"))


def endpoints_of(host: str, port: int):
    """``Endpoints`` for a listen address (the fallback when a request names none)."""
    scheme = definition_pb2.AddressScheme
    kind = scheme.IPv6 if ":" in host else (
        scheme.IPv4 if host.replace(".", "").isdigit() else scheme.DOMAIN_NAME)
    return definition_pb2.Endpoints(scheme=kind,
                                    addresses=[definition_pb2.Address(host=host, port=port)])


def assignment_response(topic_resource, queue_ids, endpoints
                        ) -> service_pb2.QueryAssignmentResponse:
    """QueryAssignment as the proxy answers a group that is not FIFO: one assignment per
    broker, its queue id -1 (every queue: receives pop across them all, and every consumer of
    the group shares them through the pop state, so nothing is rebalanced client-side); a
    FIFO group's alike (its pops keep each queue with one consumer: NOTE [ FIFO groups ]);
    FORBIDDEN when the topic has no queue to read."""
    if not queue_ids:
        return service_pb2.QueryAssignmentResponse(status=status(Code.FORBIDDEN,
                                                                  "no readable queue"))
    broker = definition_pb2.Broker(name=BROKER_NAME, id=0, endpoints=endpoints)
    queue = definition_pb2.MessageQueue(topic=topic_resource, id=ASSIGNED_QUEUE,
                                        permission=definition_pb2.Permission.READ_WRITE,
                                        broker=broker)
    return service_pb2.QueryAssignmentResponse(
        status=ok(), assignments=[definition_pb2.Assignment(message_queue=queue)])


def route_response(topic_resource, queue_ids, endpoints) -> service_pb2.QueryRouteResponse:
    broker = definition_pb2.Broker(name=BROKER_NAME, id=0, endpoints=endpoints)
    queues = [definition_pb2.MessageQueue(
        topic=topic_resource, id=q, permission=definition_pb2.Permission.READ_WRITE,
        broker=broker, accept_message_types=ACCEPTED_TYPES) for q in queue_ids]
    return service_pb2.QueryRouteResponse(status=ok(), message_queues=queues)


__all__ = ["Topics", "route_response", "assignment_response", "endpoints_of", "BROKER_NAME"]

"""Raw gRPC calls to ``mqstore serve``'s MessagingService, for what the official client will not
do: names and tags it refuses itself, streams it never reads, requests it would never sign so.
Each ``Raw`` is its own TCP connection (gRPC's Python channels otherwise share one per
target)."""

from __future__ import annotations

import uuid

import grpc
from google.protobuf.duration_pb2 import Duration

from mqstore.endpoint.protocol import definition_pb2, service_pb2, service_pb2_grpc

Resource = definition_pb2.Resource
OPTIONS = [("grpc.max_receive_message_length", -1), ("grpc.use_local_subchannel_pool", 1)]
TIMEOUT_S = 30


class Raw:
    def __init__(self, endpoint: str, metadata=()) -> None:
        self.channel = grpc.insecure_channel(endpoint, options=OPTIONS)
        self.stub = service_pb2_grpc.MessagingServiceStub(self.channel)
        self.metadata = list(metadata)

    def send(self, topic: str, body: bytes = b"x", **system) -> definition_pb2.Status:
        """The status of a SendMessage of one message; ``system``: its system properties
        (``keys`` a list)."""
        m = definition_pb2.Message(topic=Resource(name=topic), body=body)
        sp = m.system_properties
        sp.message_id = uuid.uuid4().hex
        sp.message_type = definition_pb2.MessageType.NORMAL
        for name, value in system.items():
            if name == "keys":
                sp.keys.extend(value)
            elif name == "user_properties":
                m.user_properties.update(value)
            else:
                setattr(sp, name, value)
        return self.stub.SendMessage(service_pb2.SendMessageRequest(messages=[m]),
                                     timeout=TIMEOUT_S, metadata=self.metadata).status

    def receive_request(self, group: str, topic: str, batch: int = 32, invisible_s: int = 10,
                        poll_s: float = 0, expression: str = "*",
                        sql: bool = False) -> service_pb2.ReceiveMessageRequest:
        poll = Duration()
        poll.FromMilliseconds(int(poll_s * 1000))
        kind = definition_pb2.FilterType.SQL if sql else definition_pb2.FilterType.TAG
        return service_pb2.ReceiveMessageRequest(
            group=Resource(name=group),
            message_queue=definition_pb2.MessageQueue(topic=Resource(name=topic), id=0),
            filter_expression=definition_pb2.FilterExpression(type=kind, expression=expression),
            batch_size=batch, invisible_duration=Duration(seconds=invisible_s),
            long_polling_timeout=poll)

    def receive(self, group: str, topic: str, **kwargs) -> list:
        """Every response of a ReceiveMessage, read to the end."""
        return list(self.stub.ReceiveMessage(self.receive_request(group, topic, **kwargs),
                                             timeout=TIMEOUT_S, metadata=self.metadata))

    def open_receive(self, group: str, topic: str, **kwargs):
        """A ReceiveMessage stream that nobody reads."""
        return self.stub.ReceiveMessage(self.receive_request(group, topic, **kwargs),
                                        timeout=600, metadata=self.metadata)

    def heartbeat(self) -> definition_pb2.Status:
        return self.stub.Heartbeat(service_pb2.HeartbeatRequest(), timeout=TIMEOUT_S,
                                   metadata=self.metadata).status

    def close(self) -> None:
        self.channel.close()

"""mqstore's admin service on the gRPC endpoint, as both sides speak it: ``mqstore.admin.v1.Admin``.

RocketMQ 5's gRPC API has no topic or group administration (``mqadmin`` speaks the broker's
remoting protocol), so ``mqstore serve`` adds a service of its own beside MessagingService, on
the same port, behind the same access-key check and bounds. No .proto: every method is unary,
its request a JSON object of the operation's arguments (checked whole, strictly, by the
method's model below) and its response the operation's result as JSON, the plain values
``ops.admin.StoreAdmin`` returns on a closed store.

A refusal ends the call with a gRPC status (``code_of``) whose details are the store's own
message, and the trailing metadata ``x-mqstore-error`` names the exception's class (one of
``ERRORS``), so the client raises what a closed store raises and the command exits as it
would there.
"""

from __future__ import annotations

import builtins
from dataclasses import dataclass

import grpc
from pydantic import BaseModel, ConfigDict

import mqstore.errors as errors

SERVICE = "mqstore.admin.v1.Admin"
ERROR_KEY = "x-mqstore-error"


class _Arguments(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class NoArguments(_Arguments):
    pass


class CreateTopic(_Arguments):
    name: str
    queues: int | None = None
    read_queues: int | None = None
    write_queues: int | None = None
    perm: int = 6


class UpdateTopic(_Arguments):
    name: str
    queues: int | None = None
    read_queues: int | None = None
    write_queues: int | None = None
    perm: int | None = None


class TopicName(_Arguments):
    name: str


class GroupName(_Arguments):
    group: str
    topic: str | None = None


class GroupOnly(_Arguments):
    group: str


class SetGroupConfig(_Arguments):
    group: str
    retry_max_times: int | None = None
    retry_queue_nums: int | None = None
    consume_enable: bool | None = None
    consume_broadcast_enable: bool | None = None
    consume_message_orderly: bool | None = None


class ResendDeadLetters(_Arguments):
    group: str
    offsets: list[int] | None = None
    ids: list[str] | None = None
    every: bool = False


class Promote(_Arguments):
    force: bool = False
    epoch: int | None = None
    role: str | None = None


class Demote(_Arguments):
    master: str


class ResetOffset(_Arguments):
    group: str
    topic: str
    offset: int | None = None
    timestamp_ms: int | None = None
    queue_id: int | None = None


@dataclass(frozen=True)
class Method:
    """One RPC: the ``StoreAdmin`` operation it runs and the model of its arguments."""

    operation: str
    arguments: type[_Arguments]


METHODS = {
    "ListTopics": Method("topic_list", NoArguments),
    "CreateTopic": Method("topic_create", CreateTopic),
    "UpdateTopic": Method("topic_update", UpdateTopic),
    "DeleteTopic": Method("topic_delete", TopicName),
    "ListGroups": Method("group_list", NoArguments),
    "DescribeGroup": Method("group_describe", GroupName),
    "ResetOffset": Method("group_reset", ResetOffset),
    "DeleteGroup": Method("group_delete", GroupName),
    "GroupConfig": Method("group_config", GroupOnly),
    "SetGroupConfig": Method("group_config_set", SetGroupConfig),
    "ListDeadLetters": Method("group_dlq", GroupOnly),
    "ResendDeadLetters": Method("group_dlq_resend", ResendDeadLetters),
    "RoleStatus": Method("role_status", NoArguments),
    "Promote": Method("role_promote", Promote),
    "Demote": Method("role_demote", Demote),
}


def path(method: str) -> str:
    return f"/{SERVICE}/{method}"


# The exceptions a refusal names, most specific first: the first the exception is an instance
# of is the one named (an exception of another class goes as the first base it has here).
ERRORS: tuple[type[BaseException], ...] = (
    errors.ConfigError, errors.CorruptRecordError, errors.CorruptStateError,
    errors.TopicNotFoundError, errors.GroupNotFoundError, errors.InUseError,
    errors.StoreLockedError, errors.StoreClosedError, errors.PromotionRefusedError,
    errors.DiskFullError,
    errors.StoreCorruptError, errors.PluginError, errors.WorkerError, errors.MQStoreError,
    builtins.ValueError, builtins.PermissionError, builtins.TimeoutError, builtins.OSError,
)
BY_NAME = {cls.__name__: cls for cls in ERRORS}
_CODES: tuple[tuple[type[BaseException], grpc.StatusCode], ...] = (
    (errors.CorruptRecordError, grpc.StatusCode.DATA_LOSS),
    (errors.CorruptStateError, grpc.StatusCode.DATA_LOSS),
    (LookupError, grpc.StatusCode.NOT_FOUND),
    (ValueError, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.InUseError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.StoreLockedError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.PromotionRefusedError, grpc.StatusCode.FAILED_PRECONDITION),
    (PermissionError, grpc.StatusCode.FAILED_PRECONDITION),
    (errors.StoreClosedError, grpc.StatusCode.UNAVAILABLE),
)


def named(exc: BaseException) -> type[BaseException] | None:
    """The class of ``ERRORS`` a refusal names; None for an exception that is none of them
    (a failure, not a refusal)."""
    for cls in ERRORS:
        if isinstance(exc, cls):
            return cls
    return None


def code_of(exc: BaseException) -> grpc.StatusCode:
    for cls, code in _CODES:
        if isinstance(exc, cls):
            return code
    return grpc.StatusCode.INTERNAL


__all__ = ["SERVICE", "ERROR_KEY", "METHODS", "Method", "ERRORS", "BY_NAME", "named",
           "code_of", "path"]

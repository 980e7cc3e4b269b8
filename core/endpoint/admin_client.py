"""``mqstore topic|group ... --server HOST:PORT``: the admin service (``admin_wire``) of a running
``mqstore serve``, as an object with ``ops.admin.StoreAdmin``'s methods and results.

Each call is one unary RPC on a plaintext channel (as ``produce --server`` and ``consume
--server`` dial), signed with the access key as the RocketMQ clients sign theirs when one is
given (an admin key: ``server.grpc_admin_keys``). A refusal raises the exception the store raised, with its message, so a command prints
and exits as it does on a closed store; when the call itself fails (no server there, the
access key refused, too many connections, a server without the admin service) the exception
names the server.
"""

from __future__ import annotations

import json

import grpc

from mqstore.config import parse_listen
from mqstore.endpoint.admin_wire import BY_NAME, ERROR_KEY, METHODS, SERVICE, path
from mqstore.endpoint.auth import now_date_time, signed_metadata
from mqstore.errors import MQStoreError

CALL_TIMEOUT_S = 60.0
CHANNEL_OPTIONS = [("grpc.max_receive_message_length", -1),  # a big store's group list
                   ("grpc.enable_retries", 0)]


class AdminClient:
    """The store a ``mqstore serve`` at ``server`` (``HOST:PORT``) holds open."""

    def __init__(self, server: str, access_key: str = "", secret_key: str = "") -> None:
        parse_listen(server)  # ValueError naming the rule
        self.server = server
        self._access_key, self._secret_key = access_key, secret_key

    # -- topics ----------------------------------------------------------------------------
    def topic_list(self) -> list[dict]:
        return self._call("ListTopics")

    def topic_create(self, name: str, *, queues: int | None = None,
                     read_queues: int | None = None, write_queues: int | None = None,
                     perm: int = 6) -> dict:
        return self._call("CreateTopic", name=name, queues=queues, read_queues=read_queues,
                          write_queues=write_queues, perm=perm)

    def topic_update(self, name: str, *, queues: int | None = None,
                     read_queues: int | None = None, write_queues: int | None = None,
                     perm: int | None = None) -> dict:
        return self._call("UpdateTopic", name=name, queues=queues, read_queues=read_queues,
                          write_queues=write_queues, perm=perm)

    def topic_delete(self, name: str) -> dict:
        return self._call("DeleteTopic", name=name)

    # -- groups ----------------------------------------------------------------------------
    def group_list(self) -> list[dict]:
        return self._call("ListGroups")

    def group_describe(self, group: str, topic: str | None = None) -> list[dict]:
        return self._call("DescribeGroup", group=group, topic=topic)

    def group_reset(self, group: str, topic: str, *, offset: int | None = None,
                    timestamp_ms: int | None = None, queue_id: int | None = None) -> dict:
        return self._call("ResetOffset", group=group, topic=topic, offset=offset,
                          timestamp_ms=timestamp_ms, queue_id=queue_id)

    def group_delete(self, group: str, topic: str | None = None) -> dict:
        return self._call("DeleteGroup", group=group, topic=topic)

    def group_config(self, group: str) -> dict:
        return self._call("GroupConfig", group=group)

    def group_config_set(self, group: str, **fields) -> dict:
        return self._call("SetGroupConfig", group=group, **fields)

    def group_dlq(self, group: str) -> list[dict]:
        return self._call("ListDeadLetters", group=group)

    def group_dlq_resend(self, group: str, offsets: list[int] | None = None,
                         ids: list[str] | None = None, every: bool = False) -> dict:
        return self._call("ResendDeadLetters", group=group, offsets=offsets, ids=ids,
                          every=every)

    # -- roles -----------------------------------------------------------------------------
    def role_status(self) -> dict:
        return self._call("RoleStatus")

    def role_promote(self, *, force: bool = False, epoch: int | None = None,
                     role: str | None = None) -> dict:
        return self._call("Promote", force=force, epoch=epoch, role=role)

    def role_demote(self, master: str) -> dict:
        return self._call("Demote", master=master)

    # -- the call --------------------------------------------------------------------------
    def _call(self, method: str, **arguments):
        request = METHODS[method].arguments(**arguments).model_dump_json().encode()
        with grpc.insecure_channel(self.server, options=CHANNEL_OPTIONS) as channel:
            call = channel.unary_unary(path(method))
            try:
                response = call(request, timeout=CALL_TIMEOUT_S, metadata=self._metadata())
            except grpc.RpcError as exc:
                raise self._refusal(method, exc) from None
        return json.loads(response)

    def _metadata(self) -> list[tuple[str, str]]:
        if not self._access_key:
            return []
        return signed_metadata(self._access_key, self._secret_key, now_date_time())

    def _refusal(self, method: str, exc: grpc.RpcError) -> BaseException:
        code, details = exc.code(), exc.details() or ""
        name = dict(exc.trailing_metadata() or ()).get(ERROR_KEY)
        if name in BY_NAME:  # the store's refusal, as it raised it
            return BY_NAME[name](details)
        if code is grpc.StatusCode.UNAVAILABLE:
            return ConnectionError(f"{self.server}: no `mqstore serve` endpoint answers there: "
                                   f"{details}")
        if code is grpc.StatusCode.DEADLINE_EXCEEDED:
            return TimeoutError(f"{self.server}: {SERVICE}/{method} did not answer within "
                                f"{CALL_TIMEOUT_S:g} s")
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return PermissionError(f"{self.server} refused the call: {details}")
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            return ValueError(details)
        return MQStoreError(f"{self.server}: {SERVICE}/{method}: {code.name}: {details}")


__all__ = ["AdminClient"]

"""RocketMQ's status codes as the endpoint answers them (``apache.rocketmq.v2.Code``).

Every answer carries a ``Status``: ``OK`` or the code the Apache proxy gives for the same
refusal, with a message naming the bad value and the rule. Handlers raise ``EndpointError``;
the servicer turns it into the response's status (``service.guarded``).

Put statuses map as the proxy's SendMessageActivity maps the broker's: a flush timeout is
MASTER_PERSISTENCE_TIMEOUT (the message is stored; the client may send it again), a store that
refuses puts (disk full, a failed flush) INTERNAL_SERVER_ERROR with the store's reason, a busy
put lock TOO_MANY_REQUESTS.
"""

from __future__ import annotations

from mqstore.endpoint.protocol import Code, Status
from mqstore.message import PutStatus


class EndpointError(Exception):
    """A request refused with RocketMQ status ``code`` and ``message``."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


PUT_CODES = {
    PutStatus.PUT_OK: Code.OK,
    PutStatus.FLUSH_DISK_TIMEOUT: Code.MASTER_PERSISTENCE_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: Code.SLAVE_PERSISTENCE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: Code.HA_NOT_AVAILABLE,
    PutStatus.SERVICE_NOT_AVAILABLE: Code.INTERNAL_SERVER_ERROR,
    PutStatus.CREATE_MAPPED_FILE_FAILED: Code.INTERNAL_SERVER_ERROR,
    PutStatus.MESSAGE_ILLEGAL: Code.BAD_REQUEST,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: Code.MESSAGE_PROPERTIES_TOO_LARGE,
    PutStatus.OS_PAGE_CACHE_BUSY: Code.TOO_MANY_REQUESTS,
    PutStatus.UNKNOWN_ERROR: Code.INTERNAL_SERVER_ERROR,
    # The broker's refusals of a store with topic configs, as the proxy maps them.
    PutStatus.TOPIC_NOT_EXIST: Code.TOPIC_NOT_FOUND,
    PutStatus.NO_PERMISSION: Code.FORBIDDEN,
}

_OK = Status(code=Code.OK, message="OK")


def ok() -> Status:
    return _OK


def status(code: int, message: str) -> Status:
    return Status(code=code, message=message)


def put_status(put: PutStatus, error: str | None) -> Status:
    """The status of a put's outcome (one for the whole batch: a put is all-or-nothing)."""
    if put is PutStatus.PUT_OK:
        return _OK
    return Status(code=PUT_CODES.get(put, Code.INTERNAL_SERVER_ERROR),
                  message=f"send failed, {put.name}" + (f": {error}" if error else ""))


def code_name(code: int) -> str:
    return Code.Name(code)


__all__ = ["EndpointError", "PUT_CODES", "ok", "status", "put_status", "code_name"]

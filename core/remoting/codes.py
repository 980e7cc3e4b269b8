"""RocketMQ 4.9.8's request and response codes (``RequestCode``, ``ResponseCode``), the store's
statuses mapped to them, and ``RemotingError``: a request refused with a code and a remark."""

from __future__ import annotations

from mqstore.message import GetStatus, PutStatus


class Req:
    """Request codes (``RequestCode``) served or named here."""

    SEND_MESSAGE = 10
    PULL_MESSAGE = 11
    QUERY_MESSAGE = 12
    QUERY_CONSUMER_OFFSET = 14
    UPDATE_CONSUMER_OFFSET = 15
    UPDATE_AND_CREATE_TOPIC = 17
    GET_ALL_TOPIC_CONFIG = 21
    GET_BROKER_RUNTIME_INFO = 28
    SEARCH_OFFSET_BY_TIMESTAMP = 29
    GET_MAX_OFFSET = 30
    GET_MIN_OFFSET = 31
    GET_EARLIEST_MSG_STORETIME = 32
    VIEW_MESSAGE_BY_ID = 33
    HEART_BEAT = 34
    UNREGISTER_CLIENT = 35
    CONSUMER_SEND_MSG_BACK = 36
    GET_CONSUMER_LIST_BY_GROUP = 38
    NOTIFY_CONSUMER_IDS_CHANGED = 40
    LOCK_BATCH_MQ = 41
    UNLOCK_BATCH_MQ = 42
    REGISTER_BROKER = 103
    UNREGISTER_BROKER = 104
    GET_ROUTEINFO_BY_TOPIC = 105
    GET_BROKER_CLUSTER_INFO = 106
    GET_TOPIC_STATS_INFO = 202
    GET_CONSUMER_CONNECTION_LIST = 203
    GET_ALL_TOPIC_LIST_FROM_NAMESERVER = 206
    GET_CONSUME_STATS = 208
    QUERY_TOPIC_CONSUME_BY_WHO = 300
    SEND_MESSAGE_V2 = 310
    SEND_BATCH_MESSAGE = 320


class Resp:
    """Response codes (``ResponseCode``)."""

    SUCCESS = 0
    SYSTEM_ERROR = 1
    SYSTEM_BUSY = 2
    REQUEST_CODE_NOT_SUPPORTED = 3
    FLUSH_DISK_TIMEOUT = 10
    SLAVE_NOT_AVAILABLE = 11
    FLUSH_SLAVE_TIMEOUT = 12
    MESSAGE_ILLEGAL = 13
    SERVICE_NOT_AVAILABLE = 14
    NO_PERMISSION = 16
    TOPIC_NOT_EXIST = 17
    PULL_NOT_FOUND = 19
    PULL_RETRY_IMMEDIATELY = 20
    PULL_OFFSET_MOVED = 21
    QUERY_NOT_FOUND = 22
    SUBSCRIPTION_PARSE_FAILED = 23
    SUBSCRIPTION_NOT_EXIST = 24
    SUBSCRIPTION_NOT_LATEST = 25
    SUBSCRIPTION_GROUP_NOT_EXIST = 26
    CONSUMER_NOT_ONLINE = 206


class RemotingError(Exception):
    """A request refused: the response's code and remark."""

    def __init__(self, code: int, remark: str) -> None:
        super().__init__(remark)
        self.code, self.remark = code, remark


# SendMessageProcessor.handlePutMessageResult: every put status -> the response code.
PUT_CODES = {
    PutStatus.PUT_OK: Resp.SUCCESS,
    PutStatus.FLUSH_DISK_TIMEOUT: Resp.FLUSH_DISK_TIMEOUT,
    PutStatus.FLUSH_SLAVE_TIMEOUT: Resp.FLUSH_SLAVE_TIMEOUT,
    PutStatus.SLAVE_NOT_AVAILABLE: Resp.SLAVE_NOT_AVAILABLE,
    PutStatus.SERVICE_NOT_AVAILABLE: Resp.SERVICE_NOT_AVAILABLE,
    PutStatus.CREATE_MAPPED_FILE_FAILED: Resp.SYSTEM_ERROR,
    PutStatus.MESSAGE_ILLEGAL: Resp.MESSAGE_ILLEGAL,
    PutStatus.PROPERTIES_SIZE_EXCEEDED: Resp.MESSAGE_ILLEGAL,
    PutStatus.OS_PAGE_CACHE_BUSY: Resp.SYSTEM_ERROR,
    PutStatus.UNKNOWN_ERROR: Resp.SYSTEM_ERROR,
    PutStatus.TOPIC_NOT_EXIST: Resp.TOPIC_NOT_EXIST,
    PutStatus.NO_PERMISSION: Resp.NO_PERMISSION,
}

# PullMessageProcessor: a getMessage status -> the response code; NO_MESSAGE_IN_QUEUE and
# NO_MATCHED_LOGIC_QUEUE answer PULL_NOT_FOUND at offset 0 and PULL_OFFSET_MOVED elsewhere.
GET_CODES = {
    GetStatus.FOUND: Resp.SUCCESS,
    GetStatus.OFFSET_OVERFLOW_ONE: Resp.PULL_NOT_FOUND,
    GetStatus.OFFSET_FOUND_NULL: Resp.PULL_NOT_FOUND,
    GetStatus.OFFSET_OVERFLOW_BADLY: Resp.PULL_OFFSET_MOVED,
    GetStatus.OFFSET_TOO_SMALL: Resp.PULL_OFFSET_MOVED,
    GetStatus.NO_MATCHED_MESSAGE: Resp.PULL_RETRY_IMMEDIATELY,
    GetStatus.MESSAGE_WAS_REMOVING: Resp.PULL_RETRY_IMMEDIATELY,
    GetStatus.OFFSET_RESET: Resp.PULL_OFFSET_MOVED,
}
EMPTY_QUEUE_STATUSES = (GetStatus.NO_MESSAGE_IN_QUEUE, GetStatus.NO_MATCHED_LOGIC_QUEUE)


def get_code(status: GetStatus, offset: int) -> int:
    if status in EMPTY_QUEUE_STATUSES:
        return Resp.PULL_NOT_FOUND if offset == 0 else Resp.PULL_OFFSET_MOVED
    return GET_CODES[status]


__all__ = ["Req", "Resp", "RemotingError", "PUT_CODES", "get_code"]

"""What callers hand to and get back from a store: messages, statuses and results."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, Sequence

import numpy as np

from mqstore.format.hosts import Host
from mqstore.format.properties import (
    KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, decode_properties,
)
from mqstore.format.record import DecodedRecord, decompress_body, offset_msg_id


class PutStatus(enum.Enum):
    PUT_OK = "PUT_OK"
    FLUSH_DISK_TIMEOUT = "FLUSH_DISK_TIMEOUT"
    FLUSH_SLAVE_TIMEOUT = "FLUSH_SLAVE_TIMEOUT"
    SLAVE_NOT_AVAILABLE = "SLAVE_NOT_AVAILABLE"
    SERVICE_NOT_AVAILABLE = "SERVICE_NOT_AVAILABLE"
    CREATE_MAPPED_FILE_FAILED = "CREATE_MAPPED_FILE_FAILED"
    MESSAGE_ILLEGAL = "MESSAGE_ILLEGAL"
    PROPERTIES_SIZE_EXCEEDED = "PROPERTIES_SIZE_EXCEEDED"
    OS_PAGE_CACHE_BUSY = "OS_PAGE_CACHE_BUSY"
    UNKNOWN_ERROR = "UNKNOWN_ERROR"

    @property
    def stored(self) -> bool:
        """True when the message was appended (also when flush or replication lagged)."""
        return self in _STORED


_STORED = {PutStatus.PUT_OK, PutStatus.FLUSH_DISK_TIMEOUT, PutStatus.FLUSH_SLAVE_TIMEOUT,
           PutStatus.SLAVE_NOT_AVAILABLE}


class GetStatus(enum.Enum):
    FOUND = "FOUND"
    NO_MATCHED_MESSAGE = "NO_MATCHED_MESSAGE"
    MESSAGE_WAS_REMOVING = "MESSAGE_WAS_REMOVING"
    OFFSET_FOUND_NULL = "OFFSET_FOUND_NULL"
    OFFSET_OVERFLOW_BADLY = "OFFSET_OVERFLOW_BADLY"
    OFFSET_OVERFLOW_ONE = "OFFSET_OVERFLOW_ONE"
    OFFSET_TOO_SMALL = "OFFSET_TOO_SMALL"
    NO_MATCHED_LOGIC_QUEUE = "NO_MATCHED_LOGIC_QUEUE"
    NO_MESSAGE_IN_QUEUE = "NO_MESSAGE_IN_QUEUE"
    OFFSET_RESET = "OFFSET_RESET"


@dataclass(slots=True)
class Message:
    """A message to put. ``tags``/``keys`` become the TAGS/KEYS properties.

    ``queue_id=None`` lets the configured queue selector choose; ``shard_key`` (not stored)
    is what the key-hash selector hashes. ``born_timestamp=None`` means "now" and
    ``born_host=None`` the store's own host.
    """

    topic: str
    body: bytes | None
    tags: str | None = None
    keys: Sequence[str] | str | None = None
    properties: Mapping[str, str] | None = None
    queue_id: int | None = None
    flag: int = 0
    sysflag: int = 0
    born_timestamp: int | None = None
    born_host: str | None = None
    reconsume_times: int = 0
    prepared_tx_offset: int = 0
    shard_key: str | int | None = None


@dataclass(frozen=True, slots=True)
class PutResult:
    status: PutStatus
    queue_id: int = -1
    queue_offset: int = -1
    phys_offset: int = -1
    size: int = 0
    msg_id: str | None = None
    store_timestamp: int = 0
    error: str | None = None  # why a message was rejected


@dataclass(frozen=True)
class BatchPutResult:
    """Outcome of one ``put_batch``: a status for the call and columns per message."""

    status: PutStatus
    queue_ids: np.ndarray
    queue_offsets: np.ndarray
    phys_offsets: np.ndarray
    sizes: np.ndarray
    store_timestamp: int
    store_host: Host | None
    error: str | None = None
    error_index: int | None = None  # the message that got a batch rejected

    def __len__(self) -> int:
        return len(self.phys_offsets)

    def __getitem__(self, i: int) -> PutResult:
        return PutResult(
            self.status, int(self.queue_ids[i]), int(self.queue_offsets[i]),
            int(self.phys_offsets[i]), int(self.sizes[i]), self.msg_ids[i],
            self.store_timestamp, self.error,
        )

    def __iter__(self):
        return (self[i] for i in range(len(self)))

    @cached_property
    def msg_ids(self) -> list[str]:
        if self.store_host is None:
            return []
        return [offset_msg_id(self.store_host, int(p)) for p in self.phys_offsets]

    @property
    def msg_id(self) -> str:
        """Comma-joined ids, as RocketMQ reports a batch."""
        return ",".join(self.msg_ids)

    @property
    def wrote_bytes(self) -> int:
        return int(self.sizes.sum())

    @classmethod
    def rejected(cls, status: PutStatus, error: str | None = None,
                 index: int | None = None) -> "BatchPutResult":
        empty = np.empty(0, dtype=np.int64)
        return cls(status, empty, empty, empty, empty, 0, None, error, index)


class StoredMessage:
    """A message read back from the commit log with every stored field.

    Properties, tags and keys are decoded on first use: pulls often need only body and offsets.
    """

    __slots__ = ("_rec", "_props")

    def __init__(self, record: DecodedRecord) -> None:
        self._rec = record
        self._props: dict[str, str] | None = None

    topic = property(lambda self: self._rec.topic)
    queue_id = property(lambda self: self._rec.queue_id)
    queue_offset = property(lambda self: self._rec.queue_offset)
    phys_offset = property(lambda self: self._rec.phys_offset)
    size = property(lambda self: self._rec.size)
    body = property(lambda self: self._rec.body)
    body_crc = property(lambda self: self._rec.body_crc)
    flag = property(lambda self: self._rec.flag)
    sysflag = property(lambda self: self._rec.sysflag)
    born_timestamp = property(lambda self: self._rec.born_timestamp)
    store_timestamp = property(lambda self: self._rec.store_timestamp)
    reconsume_times = property(lambda self: self._rec.reconsume_times)
    prepared_tx_offset = property(lambda self: self._rec.prepared_tx_offset)
    properties_text = property(lambda self: self._rec.properties_text)
    magic = property(lambda self: self._rec.magic)

    @property
    def born_host(self) -> str:
        return str(self._rec.born_host)

    @property
    def store_host(self) -> str:
        return str(self._rec.store_host)

    @property
    def msg_id(self) -> str:
        return offset_msg_id(self._rec.store_host, self._rec.phys_offset)

    @property
    def properties(self) -> dict[str, str]:
        if self._props is None:
            self._props = decode_properties(self._rec.properties_text)
        return self._props

    @property
    def tags(self) -> str | None:
        return self.properties.get(PROPERTY_TAGS)

    @property
    def keys(self) -> list[str]:
        raw = self.properties.get(PROPERTY_KEYS)
        return [k for k in raw.split(KEY_SEPARATOR) if k] if raw else []

    @property
    def uniq_key(self) -> str | None:
        return self.properties.get(PROPERTY_UNIQ_KEY)

    def decompressed_body(self) -> bytes:
        return decompress_body(self._rec.body, self._rec.sysflag)

    @property
    def record(self) -> DecodedRecord:
        return self._rec

    def __repr__(self) -> str:
        return (f"StoredMessage(topic={self.topic!r}, queue_id={self.queue_id}, "
                f"queue_offset={self.queue_offset}, phys_offset={self.phys_offset}, "
                f"size={self.size}, tags={self.tags!r})")


@dataclass(slots=True)
class GetResult:
    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    messages: list[StoredMessage] = field(default_factory=list)
    suggest_pulling_from_slave: bool = False
    filtered_count: int = 0

    @property
    def buffer_total_size(self) -> int:
        return sum(m.size for m in self.messages)

"""What callers hand to and get back from a store: messages, statuses and results (``get``'s
message objects, ``read``'s columns)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from functools import cached_property
from typing import Mapping, NamedTuple, Sequence

import numpy as np

from mqstore.format.hosts import Host
from mqstore.format.properties import (
    KEY_SEPARATOR, PROPERTY_KEYS, PROPERTY_TAGS, PROPERTY_UNIQ_KEY, decode_properties,
)
from mqstore.format.record import (
    DecodedRecord, RecordLayout, checked_layout, decode_record, decompress_body, offset_msg_id,
    unpack_record,
)


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
    # The broker's refusals (its ResponseCode names), for stores with topic configs
    # (docs/topics.md): a topic with no config while topics.auto_create is off, and a topic
    # whose perm has no write bit.
    TOPIC_NOT_EXIST = "TOPIC_NOT_EXIST"
    NO_PERMISSION = "NO_PERMISSION"

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

    Tags, keys, and property names and values share one encoded block, so each must be a
    non-empty string without ``\\x01`` or ``\\x02``; a key also holds no space, since spaces
    separate keys (a string ``keys`` is split on them). ``queue_id=None`` lets the configured
    queue selector choose; ``shard_key`` (not stored) is what the key-hash selector hashes.
    ``born_timestamp=None`` means "now" and ``born_host=None`` (``"ip:port"``, port 0..65535)
    the store's own host.
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


@dataclass(slots=True)
class MessageBatch:
    """Many messages as columns: the fast way to append.

    ``bodies`` holds one body per message. ``topic``, ``queue_ids``, ``tags`` and
    ``properties`` take either one value for every message or a sequence with one per
    message; ``keys`` is a sequence of key lists (or None) per message. ``queue_ids=None`` lets
    the configured queue selector choose for the whole batch. The other fields apply to every
    message. A batch is checked and refused exactly as the list of the Messages it stands for.
    """

    topic: str | Sequence[str]
    bodies: Sequence[bytes]
    queue_ids: int | Sequence[int] | None = None
    tags: str | Sequence[str | None] | None = None
    keys: Sequence[Sequence[str] | str | None] | None = None
    properties: Mapping[str, str] | Sequence[Mapping[str, str] | None] | None = None
    flag: int = 0
    born_timestamp: int | None = None
    born_host: str | None = None

    def __len__(self) -> int:
        return len(self.bodies)


class PutResult(NamedTuple):
    status: PutStatus
    queue_id: int = -1
    queue_offset: int = -1
    phys_offset: int = -1
    size: int = 0
    msg_id: str | None = None
    store_timestamp: int = 0
    error: str | None = None  # why a message was rejected


class PutCounts(NamedTuple):
    """What a store's puts did since it opened (``MessageStore.put_counts``), as RocketMQ's
    StoreStatsService totals them."""

    messages: int  # messages appended
    bytes: int  # commit-log bytes their records took
    refused: int  # put calls answered with a status that stored nothing


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
        sizes = self.sizes
        # A single put's result (what after_append hooks mostly see) skips numpy's sum, which
        # costs more than the put's own bookkeeping.
        return int(sizes[0]) if len(sizes) == 1 else int(sizes.sum())

    @classmethod
    def rejected(cls, status: PutStatus, error: str | None = None,
                 index: int | None = None) -> "BatchPutResult":
        empty = np.empty(0, dtype=np.int64)
        return cls(status, empty, empty, empty, empty, 0, None, error, index)


class _Deferred(enum.Enum):
    """A ``StoredMessage`` layout read from its record when first needed (an enum member, so
    a pickled or copied message still knows it)."""

    #: The record is a V1 record whose checks have passed (``format.record.checked_layout``).
    CHECKED_V1 = "checked V1"


CHECKED_V1 = _Deferred.CHECKED_V1


class StoredMessage:
    """A message read back from the commit log with every stored field.

    Holds the record's bytes; fields are read from them on first use, so a pull that only
    needs bodies and offsets pays for nothing else. ``layout``: the record's, None to parse
    (and check) it on first use, or ``CHECKED_V1``; ``body``: the body's bytes when the
    reader already holds them (as ``body`` would slice them).
    """

    __slots__ = ("_raw", "_layout", "_props", "_body")

    def __init__(self, raw: bytes, layout: RecordLayout | object | None = None,
                 body: bytes | None = None) -> None:
        self._raw = raw
        self._layout = layout
        self._props: dict[str, str] | None = None
        self._body = body

    @classmethod
    def from_bytes(cls, raw: bytes) -> "StoredMessage":
        """Validate one record's bytes (ValueError if malformed) and wrap them."""
        return cls(raw, unpack_record(raw))

    @property
    def _lay(self) -> RecordLayout:
        # Pulls hand over records whose size, magic and position were checked; the rest of the
        # layout is parsed (and checked) the first time a field is read.
        lay = self._layout
        if lay is None:
            lay = self._layout = unpack_record(self._raw)
        elif lay is CHECKED_V1:
            lay = self._layout = checked_layout(self._raw)
        return lay  # type: ignore[return-value]

    size = property(lambda self: self._lay.fields[0])
    magic = property(lambda self: self._lay.fields[1])
    body_crc = property(lambda self: self._lay.fields[2])
    queue_id = property(lambda self: self._lay.fields[3])
    flag = property(lambda self: self._lay.fields[4])
    queue_offset = property(lambda self: self._lay.fields[5])
    phys_offset = property(lambda self: self._lay.fields[6])
    sysflag = property(lambda self: self._lay.fields[7])
    born_timestamp = property(lambda self: self._lay.fields[8])
    store_timestamp = property(lambda self: self._lay.fields[11])
    reconsume_times = property(lambda self: self._lay.fields[14])
    prepared_tx_offset = property(lambda self: self._lay.fields[15])

    @property
    def body(self) -> bytes:
        body = self._body
        if body is None:
            lay = self._lay
            body = self._raw[lay.body_at:lay.body_at + lay.fields[16]]
        return body

    @property
    def topic(self) -> str:
        lay = self._lay
        return self._raw[lay.topic_at:lay.topic_at + lay.topic_len].decode("utf-8")

    @property
    def properties_text(self) -> str:
        lay = self._lay
        return self._raw[lay.props_at:lay.props_at + lay.props_len].decode("utf-8", errors="replace")

    @property
    def born_host(self) -> str:
        f = self._lay.fields
        return str(Host(f[9], f[10]))

    @property
    def store_host(self) -> str:
        f = self._lay.fields
        return str(Host(f[12], f[13]))

    @property
    def msg_id(self) -> str:
        f = self._lay.fields
        return offset_msg_id(Host(f[12], f[13]), f[6])

    @property
    def properties(self) -> dict[str, str]:
        if self._props is None:
            self._props = decode_properties(self.properties_text)
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
        return decompress_body(self.body, self.sysflag, offset=self.phys_offset)

    @property
    def raw(self) -> bytes:
        """The record exactly as stored."""
        return self._raw

    @property
    def record(self) -> DecodedRecord:
        return decode_record(self._raw)

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
    # Queue offsets passed over because what they point at cannot be served (damaged, or lost
    # to damage): (queue offset, commit-log offset, why). The next offset moves past them.
    # A damaged unit whose record was found in the commit log (and served) is listed too, its
    # ``why`` ending "served the record of queue offset N found in the commit log at offset P".
    corrupt: list[tuple[int, int, str]] = field(default_factory=list)

    @property
    def buffer_total_size(self) -> int:
        return sum(m.size for m in self.messages)


_EMPTY64 = np.empty(0, dtype=np.int64)
_EMPTY32 = np.empty(0, dtype=np.int32)


@dataclass(eq=False)
class ReadBatch:
    """Up to ``max_msgs`` messages of one queue, with ``get``'s status and next offset."""

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    queue_offsets: np.ndarray = field(default_factory=lambda: _EMPTY64)
    phys_offsets: np.ndarray = field(default_factory=lambda: _EMPTY64)
    sizes: np.ndarray = field(default_factory=lambda: _EMPTY32)
    store_timestamps: np.ndarray = field(default_factory=lambda: _EMPTY64)
    born_timestamps: np.ndarray = field(default_factory=lambda: _EMPTY64)
    tags_codes: np.ndarray = field(default_factory=lambda: _EMPTY64)
    flags: np.ndarray = field(default_factory=lambda: _EMPTY32)
    sys_flags: np.ndarray = field(default_factory=lambda: _EMPTY32)
    reconsume_times: np.ndarray = field(default_factory=lambda: _EMPTY32)
    body_crcs: np.ndarray = field(default_factory=lambda: _EMPTY32)
    bodies: bytes = b""
    body_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int32))
    filtered_count: int = 0
    # Queue offsets passed over because what they point at cannot be served (as in GetResult).
    corrupt: list = field(default_factory=list)
    suggest_pulling_from_slave: bool = False
    _message_at: object = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def body(self, i: int) -> bytes:
        o = self.body_offsets
        return self.bodies[o[i]:o[i + 1]]

    def message(self, i: int) -> StoredMessage:
        """Row ``i`` as a full message (every stored field), decoded now."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of a batch of {len(self)}")
        msg = self._message_at(int(self.phys_offsets[i]))
        if msg is None:
            raise LookupError(f"the record of row {i} (commit-log offset "
                              f"{int(self.phys_offsets[i])}) was removed since the read")
        return msg

    def __iter__(self):
        return (self.message(i) for i in range(len(self)))

    def __getitem__(self, i: int) -> StoredMessage:
        return self.message(i)

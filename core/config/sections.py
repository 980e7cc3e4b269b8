"""The store's sections: one frozen model per part of the store (``serve``'s and failover's
are in ``config.server``)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from mqstore.config.values import (
    DEFAULT_DELAY_LEVELS, GiB, JAVA_INT_MAX, parse_bytes, parse_delay_levels, parse_hours,
)
from mqstore.format.hosts import parse_host
from mqstore.format.names import check_topic


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StoreSection(_Section):
    root: str | None = None  # the store directory `mqstore serve` opens when not given --root
    hash: Literal["mmh3", "java"] = "mmh3"
    store_host: str = "127.0.0.1:10911"
    role: Literal["async_master", "sync_master", "slave"] = "async_master"
    message_delay_levels: str = DEFAULT_DELAY_LEVELS
    # RocketMQ 5's timers (delivery times; docs/delays.md), its defaults: three days at most,
    # deliver times rounded down to a second.
    timer_max_delay_sec: int = Field(3 * 24 * 3600, ge=1, le=10 * 365 * 24 * 3600)
    timer_precision_ms: int = Field(1000, ge=1, le=60_000)
    os_page_cache_busy_timeout_ms: int = Field(1000, ge=1)
    # Transactions (docs/transactions.md), RocketMQ's defaults: a half is checked back once
    # 6 s old, then once a minute, and discarded after 15 checks.
    transaction_timeout_ms: int = Field(6_000, ge=1, le=24 * 3600 * 1000)
    transaction_check_interval_ms: int = Field(60_000, ge=10, le=24 * 3600 * 1000)
    transaction_check_max: int = Field(15, ge=1, le=10_000)
    # Replication (RocketMQ's HA protocol; docs/replication.md), RocketMQ's defaults.
    ha_slave_fallbehind_max: int = Field(256 << 20, ge=1)
    ha_heartbeat_interval_ms: int = Field(5_000, ge=10, le=3_600_000)
    ha_housekeeping_interval_ms: int = Field(20_000, ge=100, le=3_600_000)
    ha_transfer_batch_bytes: int = Field(32 * 1024, ge=1024, le=4 << 20)
    ha_new_slave_from: Literal["last_segment", "first_segment"] = "last_segment"
    ha_state_ship_interval_ms: int = Field(100, ge=1, le=60_000)

    @model_validator(mode="after")
    def _ha_intervals(self) -> "StoreSection":
        # A connection idle for the housekeeping interval is closed: heartbeats must come first.
        if self.ha_housekeeping_interval_ms <= self.ha_heartbeat_interval_ms:
            raise ValueError(
                f"store.ha_housekeeping_interval_ms ({self.ha_housekeeping_interval_ms}) must "
                f"exceed store.ha_heartbeat_interval_ms ({self.ha_heartbeat_interval_ms}): an "
                f"idle connection is closed after the first, and heartbeats keep it open")
        return self

    @field_validator("store_host")
    @classmethod
    def _host(cls, value: str) -> str:
        parse_host(value)
        return value

    @field_validator("message_delay_levels")
    @classmethod
    def _levels(cls, value: str) -> str:
        parse_delay_levels(value)
        return value


class CommitLogSection(_Section):
    segment_bytes: int = Field(GiB, ge=256, le=1 << 40)
    max_message_bytes: int = Field(4 * 1024 * 1024, ge=1)
    check_crc_on_recover: bool = True
    auto_v2_on_long_topic: bool = True
    record_crc: bool = False


class ConsumeQueueSection(_Section):
    file_units: int = Field(300_000, ge=1, le=1 << 30)
    ext_file_bytes: int = Field(48 * 1024 * 1024, ge=4096, le=1 << 31)
    max_mapped_files: int = Field(128, ge=1, le=1 << 20)  # per process: NOTE [ Mapped budget ]


class FlushSection(_Section):
    policy: str = Field("async", min_length=1)  # a flush policy plugin by name
    interval_ms: int = Field(500, ge=1)
    least_pages: int = Field(4, ge=0)
    thorough_interval_ms: int = Field(10_000, ge=1)
    sync_timeout_ms: int = Field(5_000, ge=1)
    worker: Literal["process", "thread"] = "process"


class WriterSection(_Section):
    kind: str = Field("mmap", min_length=1)
    transient_pool_buffers: int = Field(5, ge=2, le=512)
    commit_interval_ms: int = Field(200, ge=1)
    commit_least_pages: int = Field(4, ge=0)
    commit_thorough_interval_ms: int = Field(200, ge=1)
    fast_fail_no_buffer: bool = False


class DispatchSection(_Section):
    worker: Literal["process", "thread"] = "process"
    interval_ms: int = Field(1, ge=1)
    batch_bytes: int = Field(4 * 1024 * 1024, ge=4096)


class CleanupSection(_Section):
    policy: str = Field("rocketmq", min_length=1)  # a cleanup policy plugin by name
    interval_ms: int = Field(10_000, ge=1)
    delete_when: str = "04"
    # RocketMQ's fileReservedTime is a Java int; the bound also keeps out .inf, which the
    # cleanup pass could not turn into milliseconds.
    file_reserved_hours: float = Field(72, ge=0, le=JAVA_INT_MAX)
    # A percent of the disk in use, or a byte amount of free space ("20GiB": passed once less
    # than that is free), which means the same on a small disk and a huge one.
    disk_max_used_ratio: int | str = 75
    disk_forcibly_ratio: int | str = 85
    disk_warning_ratio: int | str = 90
    clean_forcibly: bool = True
    max_segments_per_run: int = Field(10, ge=1)

    @field_validator("delete_when")
    @classmethod
    def _hours(cls, value: str) -> str:
        parse_hours(value)
        return value

    @field_validator("disk_max_used_ratio", "disk_forcibly_ratio", "disk_warning_ratio")
    @classmethod
    def _watermark(cls, value: int | str, info) -> int | str:
        if isinstance(value, str):
            parse_bytes(value)
            return value
        top = 95 if info.field_name == "disk_max_used_ratio" else 100
        if not 10 <= value <= top:
            raise ValueError(f"{value} must be a percent from 10 to {top}, or a byte amount "
                             f"of free space such as '20GiB'")
        return value

    @model_validator(mode="after")
    def _ratios_ordered(self) -> "CleanupSection":
        # decide() tests the warning ratio, then the forcibly one, then max used; a ratio above
        # the one tested before it is never reached, so its setting would be silently ignored.
        # Percents and byte amounts can only be ordered against a disk, so a mix is not checked.
        order = ("disk_max_used_ratio", "disk_forcibly_ratio", "disk_warning_ratio")
        for low, high in zip(order, order[1:]):
            a, b = getattr(self, low), getattr(self, high)
            if isinstance(a, int) and isinstance(b, int) and a > b:
                raise ValueError(
                    f"cleanup.{low} ({a}) must not exceed cleanup.{high} ({b}); RocketMQ "
                    f"requires disk_max_used_ratio <= disk_forcibly_ratio <= disk_warning_ratio")
            if isinstance(a, str) and isinstance(b, str) and parse_bytes(a) < parse_bytes(b):
                raise ValueError(
                    f"cleanup.{low} ({a!r} free) must not be less free space than "
                    f"cleanup.{high} ({b!r} free); each watermark must be passed before the "
                    f"next: disk_max_used_ratio, then disk_forcibly_ratio, then "
                    f"disk_warning_ratio")
        return self


class IndexSection(_Section):
    enabled: bool = True
    max_hash_slots: int = Field(5_000_000, ge=1, le=(1 << 31) - 1)
    max_index_entries: int = Field(20_000_000, ge=2, le=(1 << 31) - 1)


class GetSection(_Section):
    max_filter_bytes: int = Field(16_000, ge=20)
    max_transfer_bytes_in_memory: int = Field(262_144, ge=1)
    max_transfer_count_in_memory: int = Field(32, ge=1)
    max_transfer_bytes_on_disk: int = Field(65_536, ge=1)
    max_transfer_count_on_disk: int = Field(8, ge=1)
    access_in_memory_max_ratio: int = Field(40, ge=0, le=100)
    physical_memory_bytes: int | None = Field(None, ge=0)
    offset_check_in_slave: bool = False


class QueueSelectSection(_Section):
    selector: str = Field("round_robin", min_length=1)
    queues_per_topic: int = Field(4, ge=1, le=65_536)


MAX_TOPIC_QUEUES = 65_536


class DeclaredTopic(_Section):
    """One entry of ``topics.declare``."""

    name: str
    queues: int | None = Field(None, ge=1, le=MAX_TOPIC_QUEUES)
    read_queues: int | None = Field(None, ge=1, le=MAX_TOPIC_QUEUES)
    write_queues: int | None = Field(None, ge=1, le=MAX_TOPIC_QUEUES)
    perm: Literal[2, 4, 6] = 6

    @field_validator("name")
    @classmethod
    def _name(cls, value: str) -> str:
        return check_topic(value)


class TopicsSection(_Section):
    """Topic configs (``config/topics.json``, RocketMQ's format). Each ``declare`` entry is
    ``{name: T, queues: N, perm: 6}``: ``queues`` sets both queue counts (default
    ``queue_select.queues_per_topic``), ``read_queues`` / ``write_queues`` set one each, ``perm``
    is 2 (write), 4 (read) or 6 (both, the default). A writable open creates or updates every
    declared topic to match; see docs/topics.md."""

    auto_create: bool = True
    declare: tuple[DeclaredTopic, ...] = ()

    @field_validator("declare")
    @classmethod
    def _unique(cls, value: tuple[DeclaredTopic, ...]) -> tuple[DeclaredTopic, ...]:
        seen = set()
        for topic in value:
            if topic.name in seen:
                raise ValueError(f"topic {topic.name!r} is declared twice")
            seen.add(topic.name)
        return value


class PluginsSection(_Section):
    load_entry_points: bool = True
    modules: tuple[str, ...] = ()
    disable: tuple[str, ...] = ()


class ConsumerSection(_Section):
    """Group consumers (``store.consumer``): offsets, rebalancing, auto-commit."""

    allocation: str = Field("average", min_length=1)  # an allocation strategy plugin by name
    auto_commit: bool = False
    auto_commit_interval_ms: int = Field(5_000, ge=1)
    rebalance_interval_ms: int = Field(1_000, ge=10, le=3_600_000)
    persist_interval_ms: int = Field(5_000, ge=0)
    commit_fsync: bool = False
    max_open_pop_states: int = Field(64, ge=1, le=1 << 20)  # per process; 2 descriptors each

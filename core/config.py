"""Store configuration: one frozen section per part of the store, loaded from YAML.

Every key, its unit and its default is listed in ``config/mqstore.yaml``. Loading rejects
unknown keys, wrong types and out-of-range values with the dotted key in the message, and
names that no plugin registers: ``writer.kind``, ``queue_select.selector``, ``flush.policy``,
``cleanup.policy`` and ``plugins.disable`` are checked against the plugins this very config loads, so a typo fails
here rather than when a store opens. A key that was renamed (``RENAMED_KEYS``) still loads
under its old name, with a DeprecationWarning naming the new one.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Literal, Mapping

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mqstore.errors import ConfigError, PluginError
from mqstore.format.hosts import parse_host
from mqstore.format.names import check_topic

GiB = 1 << 30
DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_DELAY_UNITS_MS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
JAVA_INT_MAX = (1 << 31) - 1


# Keys renamed since a release used them: (section, old name) -> new name. A file, an override
# or ``StoreConfig.replace`` that uses an old name means the new one, and is warned about.
RENAMED_KEYS: dict[tuple[str, str], str] = {
    ("flush", "mode"): "policy",  # the flush policy plugin: async | sync
    ("dispatch", "mode"): "worker",  # process | thread, as flush.worker
}


class PluginConfigError(ConfigError, PluginError):
    """A config value names a plugin, or a strategy, that the configured plugins do not provide.

    Also a PluginError: callers that caught the store's open-time lookup error keep working.
    """


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class StoreSection(_Section):
    root: str | None = None  # the store directory `mqstore serve` opens when not given --root
    hash: Literal["mmh3", "java"] = "mmh3"
    store_host: str = "127.0.0.1:10911"
    role: Literal["async_master", "sync_master", "slave"] = "async_master"
    message_delay_levels: str = DEFAULT_DELAY_LEVELS
    os_page_cache_busy_timeout_ms: int = Field(1000, ge=1)
    # Replication (RocketMQ's HA protocol; docs/replication.md), RocketMQ's defaults.
    ha_slave_fallbehind_max: int = Field(256 << 20, ge=1)
    ha_heartbeat_interval_ms: int = Field(5_000, ge=10, le=3_600_000)
    ha_housekeeping_interval_ms: int = Field(20_000, ge=100, le=3_600_000)
    ha_transfer_batch_bytes: int = Field(32 * 1024, ge=1024, le=4 << 20)
    ha_new_slave_from: Literal["last_segment", "first_segment"] = "last_segment"

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


class ServerSection(_Section):
    """``mqstore serve``: where the metrics and health endpoints listen, what a client may hold
    there (connections, time, header bytes), how much it logs, the RocketMQ 5 gRPC endpoint
    (``grpc_*``, docs/endpoint.md) and replication's addresses (``ha_*``, docs/replication.md)."""

    metrics_listen: str = "127.0.0.1:9108"
    log_level: Literal["debug", "info", "warning", "error", "critical"] = "info"
    max_connections: int = Field(64, ge=1, le=65_536)
    idle_timeout_ms: int = Field(10_000, ge=1, le=86_400_000)
    request_timeout_ms: int = Field(10_000, ge=1, le=86_400_000)
    max_header_bytes: int = Field(16_384, ge=1024, le=1 << 20)
    grpc_listen: str | None = None  # None: no gRPC endpoint
    grpc_tls_cert_file: str | None = None
    grpc_tls_key_file: str | None = None
    grpc_access_keys: tuple[str, ...] = ()  # "ACCESS_KEY:SECRET_KEY" each
    grpc_max_request_bytes: int = Field(8 * 1024 * 1024, ge=4096, le=JAVA_INT_MAX)
    grpc_max_concurrent_streams: int = Field(1024, ge=1, le=JAVA_INT_MAX)
    grpc_max_concurrent_rpcs: int = Field(8192, ge=1, le=JAVA_INT_MAX)
    grpc_max_connections: int = Field(1024, ge=1, le=JAVA_INT_MAX)
    grpc_client_idle_ms: int = Field(120_000, ge=1000, le=JAVA_INT_MAX)
    grpc_min_invisible_ms: int = Field(10_000, ge=0, le=JAVA_INT_MAX)
    grpc_max_long_polling_ms: int = Field(20_000, ge=0, le=JAVA_INT_MAX)
    grpc_signature_skew_ms: int = Field(15 * 60_000, ge=1000, le=JAVA_INT_MAX)
    grpc_admin_enabled: bool = True
    grpc_admin_keys: tuple[str, ...] = ()  # "ACCESS_KEY:SECRET_KEY" each, for the admin service
    grpc_peer_max_new_topics: int = Field(1000, ge=0, le=JAVA_INT_MAX)
    grpc_peer_max_new_groups: int = Field(1000, ge=0, le=JAVA_INT_MAX)
    grpc_max_unwritten_bytes: int = Field(256 << 20, ge=1 << 20, le=1 << 40)
    grpc_max_unwritten_bytes_per_connection: int = Field(32 << 20, ge=1 << 16, le=1 << 40)
    grpc_write_stall_ms: int = Field(30_000, ge=100, le=JAVA_INT_MAX)
    ha_listen: str | None = None  # a master's replication port (RocketMQ: broker port + 1)
    ha_master: str | None = None  # the master's ha_listen, which a slave dials

    @field_validator("metrics_listen", "grpc_listen", "ha_listen")
    @classmethod
    def _listen(cls, value: str | None) -> str | None:
        if value is not None:
            parse_listen(value)
        return value

    @field_validator("ha_master")
    @classmethod
    def _master(cls, value: str | None) -> str | None:
        if value is not None and parse_listen(value)[1] == 0:
            raise ValueError(f"master address {value!r}: port 0 cannot be dialled; give the "
                             f"port the master's server.ha_listen binds")
        return value

    @field_validator("grpc_access_keys", "grpc_admin_keys", mode="before")
    @classmethod
    def _key_list(cls, value):
        return tuple(value) if isinstance(value, list) else value  # YAML gives lists

    @model_validator(mode="after")
    def _tls_pair(self) -> "ServerSection":
        if (self.grpc_tls_cert_file is None) != (self.grpc_tls_key_file is None):
            raise ValueError(
                f"server.grpc_tls_cert_file ({self.grpc_tls_cert_file!r}) and "
                f"server.grpc_tls_key_file ({self.grpc_tls_key_file!r}) go together: give both "
                f"for TLS, or neither for plaintext")
        for key in ("grpc_access_keys", "grpc_admin_keys"):
            for i, pair in enumerate(getattr(self, key)):
                # The message names the access key at most: a secret never goes to a log.
                access_key, sep, secret_key = pair.partition(":")
                if not sep or not access_key or not secret_key:
                    what = (f"access key {access_key!r} has an empty secret key" if access_key
                            and sep else f"entry {i} has no access key before a ':'")
                    raise ValueError(f"server.{key}: {what}; each entry is "
                                     f"'ACCESS_KEY:SECRET_KEY', both non-empty")
        if self.grpc_max_unwritten_bytes_per_connection > self.grpc_max_unwritten_bytes:
            raise ValueError(
                f"server.grpc_max_unwritten_bytes_per_connection "
                f"({self.grpc_max_unwritten_bytes_per_connection}) cannot exceed "
                f"server.grpc_max_unwritten_bytes ({self.grpc_max_unwritten_bytes})")
        return self


class ConsumerSection(_Section):
    """Group consumers (``store.consumer``): offsets, rebalancing, auto-commit."""

    allocation: str = Field("average", min_length=1)  # an allocation strategy plugin by name
    auto_commit: bool = False
    auto_commit_interval_ms: int = Field(5_000, ge=1)
    rebalance_interval_ms: int = Field(1_000, ge=10, le=3_600_000)
    persist_interval_ms: int = Field(5_000, ge=0)
    commit_fsync: bool = False
    max_open_pop_states: int = Field(64, ge=1, le=1 << 20)  # per process; 2 descriptors each


class StoreConfig(_Section):
    store: StoreSection = StoreSection()
    commit_log: CommitLogSection = CommitLogSection()
    consume_queue: ConsumeQueueSection = ConsumeQueueSection()
    flush: FlushSection = FlushSection()
    writer: WriterSection = WriterSection()
    dispatch: DispatchSection = DispatchSection()
    get: GetSection = GetSection()
    index: IndexSection = IndexSection()
    cleanup: CleanupSection = CleanupSection()
    queue_select: QueueSelectSection = QueueSelectSection()
    topics: TopicsSection = TopicsSection()
    plugins: PluginsSection = PluginsSection()
    consumer: ConsumerSection = ConsumerSection()
    server: ServerSection = ServerSection()

    @model_validator(mode="after")
    def _slave_serves_no_clients(self) -> "StoreConfig":
        # A receive is a pop, and pop state lives beside each store: a slave's endpoint would
        # hand out again what the master's pops have in flight (docs/replication.md).
        if self.store.role == "slave" and self.server.grpc_listen is not None:
            raise ValueError(
                f"server.grpc_listen ({self.server.grpc_listen!r}) is for masters: a store with "
                f"store.role 'slave' serves no gRPC clients (its pop state is its own, so its "
                f"receives would hand out again what the master has in flight); point the "
                f"clients at the master, and read a slave through the API, the CLI or Spark")
        return self

    def replace(self, **overrides: Mapping[str, Any]) -> "StoreConfig":
        """A copy with ``{"section": {"key": value}}`` overrides applied and validated."""
        return _build(_deep_merge(self.model_dump(), _renamed(overrides, "overrides")),
                      "overrides")


def parse_hours(text: str) -> frozenset[int]:
    """RocketMQ's ``deleteWhen``: ``"04"`` or ``"01;04;13"``, local hours 0-23."""
    hours = set()
    for token in text.split(";"):
        token = token.strip()
        # isdigit alone admits digits like '²' that int() then refuses.
        if not (token.isascii() and token.isdigit()) or not 0 <= int(token) <= 23:
            raise ValueError(f"hour {token!r} in {text!r} must be 0-23 (hours separated by ';')")
        hours.add(int(token))
    return frozenset(hours)


def parse_listen(text: str) -> tuple[str, int]:
    """``"host:port"`` or ``"[ipv6]:port"`` -> ``(host, port)``; port 0 picks a free one."""
    bracketed = text.startswith("[")
    host, sep, port = (text[1:].partition("]:") if bracketed else text.rpartition(":"))
    if not sep or not host or (":" in host and not bracketed):
        raise ValueError(f"listen address {text!r} must be 'host:port' or '[ipv6]:port'")
    if not (port.isascii() and port.isdigit()) or int(port) > 65535:
        raise ValueError(f"listen address {text!r}: port {port!r} must be 0..65535")
    return host, int(port)


_BYTE_UNITS = {"B": 1, "KB": 10**3, "MB": 10**6, "GB": 10**9, "TB": 10**12,
               "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40}


def parse_bytes(text: str) -> int:
    """``"20GiB"``, ``"500 MB"``, ``"4096B"`` -> bytes (> 0)."""
    number = text.rstrip("BKMGTi ")
    unit = text[len(number):].strip()
    if (not (number.isascii() and number.isdigit()) or unit not in _BYTE_UNITS
            or int(number) <= 0):
        raise ValueError(f"byte amount {text!r} must be a whole number > 0 followed by one of "
                         f"{', '.join(_BYTE_UNITS)} (e.g. '20GiB')")
    return int(number) * _BYTE_UNITS[unit]


def describe_watermark(value: int | str) -> str:
    """``90`` -> ``"over 90% used"``, ``"20GiB"`` -> ``"under 20GiB free"``."""
    return f"over {value}% used" if isinstance(value, int) else f"under {value} free"


def parse_delay_levels(text: str) -> list[int]:
    """``"1s 5s 1m"`` -> ``[1000, 5000, 60000]`` (levels 1..n)."""
    levels = []
    for token in text.split():
        unit = _DELAY_UNITS_MS.get(token[-1:])
        digits = token[:-1]
        if unit is None or not (digits.isascii() and digits.isdigit()):
            raise ValueError(f"delay level {token!r} must be digits followed by s, m, h or d")
        levels.append(int(token[:-1]) * unit)
    if not levels:
        raise ValueError("message_delay_levels must list at least one level")
    return levels


def _deep_merge(base: dict, extra: Mapping[str, Any]) -> dict:
    out = copy.deepcopy(base)
    for key, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _renamed(data: Any, source: str) -> Any:
    """``data`` (one file's or one set of overrides' sections) with the old names of renamed
    keys replaced by the new ones, each warned about (DeprecationWarning, attributed to the
    caller of ``load_config`` or ``replace``). Done before the file and the overrides merge, so
    an override by either name wins over the file. Both names in one mapping must agree."""
    if not isinstance(data, Mapping):
        return data
    out = data
    for (section, old), new in RENAMED_KEYS.items():
        values = out.get(section)
        if not isinstance(values, Mapping) or old not in values:
            continue
        if new in values and values[new] != values[old]:
            raise ConfigError(
                f"invalid configuration in {source}: {section}.{old} is the old name of "
                f"{section}.{new}, and they disagree ({values[old]!r} and {values[new]!r}); "
                f"keep {section}.{new} only")
        warnings.warn(f"configuration key {section}.{old} in {source} was renamed "
                      f"{section}.{new}: the old name still sets it but is deprecated",
                      DeprecationWarning, stacklevel=3)
        moved = {key: value for key, value in values.items() if key != old}
        moved[new] = values[old]
        out = {**out, section: moved}
    return out


def _build(data: Any, source: str) -> StoreConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: the top level must be a mapping of sections, got {data!r}")
    # YAML gives lists; the frozen model stores tuples.
    for section in ("plugins", "topics"):
        if section in data and isinstance(data[section], Mapping):
            data = dict(data)
            data[section] = {k: tuple(v) if isinstance(v, list) else v
                             for k, v in data[section].items()}
    try:
        config = StoreConfig.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors():
            key = ".".join(str(p) for p in err["loc"]) or "(top level)"
            if err["type"] == "extra_forbidden":
                problems.append(f"{key}: unknown key")
            elif err["type"] == "value_error" and len(err["loc"]) == 1:
                # A rule across keys of a section: its message names the keys and values.
                problems.append(err["msg"].removeprefix("Value error, "))
            else:
                problems.append(f"{key}: {err['msg']} (got {err.get('input')!r})")
        raise ConfigError(f"invalid configuration in {source}: " + "; ".join(problems)) from None
    problems = _plugin_problems(config)
    if problems:
        raise PluginConfigError(f"invalid configuration in {source}: " + "; ".join(problems))
    return config


def _plugin_problems(config: StoreConfig) -> list[str]:
    """Check the names the config picks against the plugins it loads, built the way the store
    builds them (same modules, disable list, entry points and environment)."""
    # Imported here: the plugin API's modules import this one (the plugin manager, once built,
    # validates the names a config picks; the config's parsers serve plugins).
    from mqstore.plugin_api.manager import CORE_PARTS, PluginHooks, make_plugin_manager, plugin_names

    p = config.plugins
    known = plugin_names(p.modules)
    problems = [f"plugins.disable: {name!r} {CORE_PARTS[name]}" if name in CORE_PARTS else
                f"plugins.disable: no plugin is named {name!r} (known: {', '.join(known)})"
                for name in dict.fromkeys(p.disable) if name not in known]
    try:
        hooks = PluginHooks(make_plugin_manager(modules=p.modules, disable=p.disable,
                                                load_entry_points=p.load_entry_points))
    except PluginError as exc:
        return [*problems, f"plugins: {exc}"]
    for registry in hooks.selected:
        section, key = registry.setting.split(".")
        name = getattr(getattr(config, section), key)
        if name not in registry:
            problems.append(registry.unknown_message(name))
    return problems


def load_config(path: str | None = None, overrides: Mapping[str, Any] | None = None
                ) -> StoreConfig:
    """Load ``path`` (YAML) or the defaults, merge ``overrides`` on top, validate."""
    data: Any = {}
    source = "defaults"
    if path is not None:
        source = str(path)
        try:
            with open(path, encoding="utf-8") as f:
                data = yaml.safe_load(f)
        except OSError as exc:
            raise ConfigError(f"cannot read config file {path!r}: {exc.strerror}") from None
        except yaml.YAMLError as exc:
            raise ConfigError(f"config file {path!r} is not valid YAML: {exc}") from None
        if data is None:
            data = {}
        data = _renamed(data, source)
    if overrides:
        overrides = _renamed(overrides, "overrides")
        if not isinstance(data, Mapping):
            raise ConfigError(f"{source}: the top level must be a mapping of sections")
        data = _deep_merge(dict(data), overrides)
        source += " + overrides"
    return _build(data, source)

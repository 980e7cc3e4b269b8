"""Store configuration: one frozen section per part of the store, loaded from YAML.

Every key, its unit and its default is listed in ``config/mqstore.yaml``. Loading rejects
unknown keys, wrong types and out-of-range values with the dotted key in the message. The
names a config picks among plugins (``writer.kind``, ``queue_select.selector``,
``flush.policy``, ``cleanup.policy``, ``consumer.allocation``, ``plugins.disable``) are the
plugin API's to check, against the plugins this very config loads
(``plugin_api.manager.build_hooks``): a store's open does it first, with the one plugin
manager it builds, before it touches the directory, and the command line does it when it
loads a file. A key that was renamed (``RENAMED_KEYS``) still loads under its old name, with a
DeprecationWarning naming the new one.
"""

from __future__ import annotations

import copy
import warnings
from typing import Any, Mapping

import yaml
from pydantic import ValidationError, model_validator

from mqstore.config.remoting import check_broker_id
from mqstore.config.sections import (  # noqa: F401 - the sections are this package's API
    MAX_TOPIC_QUEUES, CleanupSection, CommitLogSection, ConsumerSection, ConsumeQueueSection,
    DeclaredTopic, DispatchSection, FlushSection, GetSection, IndexSection, PluginsSection,
    QueueSelectSection, StoreSection, TopicsSection, WriterSection, _Section,
)
from mqstore.config.server import CoordinationSection, ServerSection  # noqa: F401
from mqstore.config.values import (  # noqa: F401 - the value parsers are this package's API
    DEFAULT_DELAY_LEVELS, GiB, JAVA_INT_MAX, describe_watermark, is_loopback_host, parse_bytes,
    parse_delay_levels, parse_hours, parse_listen,
)
from mqstore.errors import ConfigError, PluginConfigError  # noqa: F401 - its old home


# Keys renamed since a release used them: (section, old name) -> new name. A file, an override
# or ``StoreConfig.replace`` that uses an old name means the new one, and is warned about.
RENAMED_KEYS: dict[tuple[str, str], str] = {
    ("flush", "mode"): "policy",  # the flush policy plugin: async | sync
    ("dispatch", "mode"): "worker",  # process | thread, as flush.worker
}


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
    coordination: CoordinationSection = CoordinationSection()

    @model_validator(mode="after")
    def _broker_id_matches_role(self) -> "StoreConfig":
        check_broker_id(self.store.role, self.server.remoting_broker_id)
        return self

    @model_validator(mode="after")
    def _master_knows_its_slaves(self) -> "StoreConfig":
        # A slave listens once promoted: ``promote`` applies the rule then (it did not refuse
        # a slave's configuration before slaves could be promoted, and does not now).
        problem = None if self.store.role == "slave" else master_listen_problem(self.server)
        if problem is not None:
            raise ValueError(problem)
        return self

    def replace(self, **overrides: Mapping[str, Any]) -> "StoreConfig":
        """A copy with ``{"section": {"key": value}}`` overrides applied and validated."""
        return _build(_deep_merge(self.model_dump(), _renamed(overrides, "overrides")),
                      "overrides")


def master_listen_problem(server: ServerSection) -> str | None:
    """Why a master may not listen on ``server.ha_listen`` as configured, or None.

    A master takes unauthenticated slaves from loopback only unless told otherwise: one
    listening beyond loopback, told of no slave, would serve its log (and a sync_master its
    PUT_OK) to any peer, or no remote slave at all. Refused, saying what to set."""
    if (server.ha_listen is None or server.ha_allow or server.ha_secret_file
            or server.ha_tls_cert_file or is_loopback_host(parse_listen(server.ha_listen)[0])):
        return None
    return (f"server.ha_listen ({server.ha_listen!r}) is reachable beyond this host, but "
            f"nothing says which peers are slaves: anyone reaching it could read the commit "
            f"log and, on a sync_master, acknowledge puts no slave holds. Set "
            f"server.ha_allow to the slaves' addresses (RocketMQ's slaves), or "
            f"server.ha_secret_file and/or server.ha_tls_* on master and slaves (mqstore's); "
            f"server.ha_allow ['0.0.0.0/0', '::/0'] admits every peer, knowingly")


def coordination_listen_problem(server: ServerSection, section) -> str | None:
    """Why a node of a coordinated cluster cannot lead as configured, or None."""
    if server.ha_listen is None or parse_listen(server.ha_listen)[1] == 0:
        return (f"coordination.etcd_endpoints is set, so this node may be elected master, but "
                f"server.ha_listen ({server.ha_listen!r}) gives no fixed port for its slaves "
                f"to dial: set it to HOST:PORT on every node")
    host = parse_listen(server.ha_listen)[0].strip("[]")
    if section.ha_address is None and host in ("0.0.0.0", "::", ""):
        return (f"server.ha_listen ({server.ha_listen!r}) listens on every interface: set "
                f"coordination.ha_address to the HOST:PORT the other nodes dial to follow "
                f"this one when it leads")
    return master_listen_problem(server)


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
    return config


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

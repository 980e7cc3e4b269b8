"""The broker's topics as RocketMQ clients, tools and NameServers see them: each topic's
read and write queue counts and perm, and the table a broker registers.

A topic with a config (``config/topics.json``, ``store.topic_config``; docs/topics.md) has its
counts. A topic without one that the store holds queues of (a store written without topic
configs) has the higher of ``queue_select.queues_per_topic`` and its highest queue id + 1 of
both, perm 6. With ``topics.auto_create`` the broker also serves RocketMQ's default topic
``TBW102`` (perm 7: its route is inherited by new topics), as a broker with
autoCreateTopicEnable does; it is never written to the store.

A send to a topic that does not exist creates its config as the broker's
``createTopicInSendMessageMethod`` does: ``min(defaultTopicQueueNums, queues_per_topic)``
queues, perm 6; a heartbeat creates the group's ``%RETRY%`` topic (1 queue, perm 6); a
retry past its maximum creates the group's ``%DLQ%`` topic (1 queue, perm 2).

``data_version`` changes whenever the served table changes (what a NameServer compares).
Only the event loop's thread calls this.
"""

from __future__ import annotations

import time

from mqstore.errors import CorruptStateError
from mqstore.format.topic_config import PERM_INHERIT, PERM_READ_WRITE, TopicConfig
from mqstore.remoting.codes import RemotingError, Resp

DEFAULT_TOPIC = "TBW102"  # TopicValidator.AUTO_CREATE_TOPIC_KEY_TOPIC
RETRY_PREFIX, DLQ_PREFIX = "%RETRY%", "%DLQ%"
TABLE_TTL_S = 1.0  # how stale the served table may be (the store re-reads topics.json as often)
MAX_CACHED_ROUTES = 1 << 16


class Route:
    """One topic's counts as served."""

    __slots__ = ("name", "read", "write", "perm", "sys_flag", "order", "filter_type")

    def __init__(self, name: str, read: int, write: int, perm: int, sys_flag: int = 0,
                 order: bool = False, filter_type: str = "SINGLE_TAG") -> None:
        self.name, self.read, self.write, self.perm = name, read, write, perm
        self.sys_flag, self.order, self.filter_type = sys_flag, order, filter_type

    @classmethod
    def of(cls, config: TopicConfig) -> "Route":
        return cls(config.name, config.read_queue_nums, config.write_queue_nums, config.perm,
                   config.topic_sys_flag, config.order, config.topic_filter_type)

    def config_doc(self) -> dict:
        """RocketMQ's ``TopicConfig`` as fastjson writes it (fields sorted)."""
        return {"order": self.order, "perm": self.perm, "readQueueNums": self.read,
                "topicFilterType": self.filter_type, "topicName": self.name,
                "topicSysFlag": self.sys_flag, "writeQueueNums": self.write}


class BrokerTopics:
    def __init__(self, store, config) -> None:
        self._store = store
        self.auto_create = config.topics.auto_create
        self.default_queues = config.queue_select.queues_per_topic
        self._table: dict[str, Route] | None = None
        self._table_at = 0.0
        self._signature: tuple = ()
        self._routes: dict[str, tuple[Route, float]] = {}
        self.version_counter = 0
        self.version_timestamp = int(time.time() * 1000)

    # -- lookups --------------------------------------------------------------------------
    def _config(self, name: str) -> TopicConfig | None:
        try:
            return self._store.topic_config(name)
        except CorruptStateError as exc:
            raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None

    def route(self, name: str) -> Route | None:
        """The topic's counts; None when the broker does not have it. A topic's answer is
        kept for TABLE_TTL_S (sends and pulls ask it every time)."""
        now = time.monotonic()
        known = self._routes.get(name)
        if known is not None and now - known[1] < TABLE_TTL_S:
            return known[0]
        route = self._lookup(name)
        if route is not None:
            if len(self._routes) >= MAX_CACHED_ROUTES:
                self._routes.clear()
            self._routes[name] = (route, now)
        return route

    def _lookup(self, name: str) -> Route | None:
        config = self._config(name)
        if config is not None:
            return Route.of(config)
        if name == DEFAULT_TOPIC and self.auto_create:
            return Route(name, self.default_queues, self.default_queues,
                         PERM_INHERIT | PERM_READ_WRITE)
        queues = self._store.queue_ids(name)
        if not queues:
            return None
        n = max(self.default_queues, queues[-1] + 1)
        return Route(name, n, n, PERM_READ_WRITE)

    def table(self, fresh: bool = False) -> dict[str, Route]:
        """Every topic served, by name; bumps ``data_version`` when it changed."""
        now = time.monotonic()
        if self._table is not None and not fresh and now - self._table_at < TABLE_TTL_S:
            return self._table
        try:
            configs = self._store.topic_configs()
        except CorruptStateError as exc:
            raise RemotingError(Resp.SYSTEM_ERROR, str(exc)) from None
        table = {name: Route.of(c) for name, c in configs.items()}
        for name in self._store.topics():
            if name not in table:
                route = self.route(name)
                if route is not None:
                    table[name] = route
        if self.auto_create and DEFAULT_TOPIC not in table:
            table[DEFAULT_TOPIC] = self.route(DEFAULT_TOPIC)
        table = dict(sorted(table.items()))
        signature = tuple((r.name, r.read, r.write, r.perm, r.sys_flag, r.order)
                          for r in table.values())
        if signature != self._signature:
            self._signature = signature
            self.version_counter += 1
            self.version_timestamp = int(time.time() * 1000)
        self._table, self._table_at = table, now
        return table

    def data_version(self) -> dict:
        self.table()
        return {"counter": self.version_counter, "timestamp": self.version_timestamp}

    def wrapper_doc(self) -> dict:
        """``TopicConfigSerializeWrapper``: what GET_ALL_TOPIC_CONFIG answers and a
        registration carries."""
        table = self.table()
        return {"dataVersion": self.data_version(),
                "topicConfigTable": {n: r.config_doc() for n, r in table.items()}}

    # -- creation -------------------------------------------------------------------------
    def for_send(self, name: str, default_queues: int | None) -> tuple[Route, bool]:
        """The route of a topic a send names, created when the broker may create it;
        ``(route, created)``. TOPIC_NOT_EXIST otherwise."""
        route = self.route(name)
        if route is not None:
            return route, False
        if not self.auto_create:
            raise RemotingError(Resp.TOPIC_NOT_EXIST, (
                f"topic[{name}] not exist, apply first please! (topics.auto_create is false "
                f"on this broker)"))
        queues = max(1, min(default_queues or self.default_queues, self.default_queues))
        return self.create(name, queues, PERM_READ_WRITE), True

    def create(self, name: str, queues: int, perm: int) -> Route:
        """A config for ``name`` unless it has one (another creator may have been first)."""
        try:
            config = self._store.create_topic(name, queues=queues, perm=perm)
        except ValueError:
            config = self._config(name)
            if config is None:
                raise
        self.changed()
        return Route.of(config)

    def ensure(self, name: str, queues: int, perm: int) -> tuple[Route, bool]:
        route = self.route(name)
        if route is not None:
            return route, False
        return self.create(name, queues, perm), True

    def changed(self) -> None:
        """A topic config changed here: the next lookups read it again."""
        self._table = None
        self._routes.clear()


__all__ = ["BrokerTopics", "Route", "DEFAULT_TOPIC", "RETRY_PREFIX", "DLQ_PREFIX"]

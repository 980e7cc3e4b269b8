"""``mqstore topic`` and ``mqstore group`` on a store directory: what RocketMQ's ``mqadmin``
does to a broker, as plain values (dicts and lists, the commands' JSON).

``StoreAdmin`` works on the directory, without a server:

* topics are created, changed and listed in ``config/topics.json`` under its lock, without
  opening the store: on a closed store, or beside a running writer (which sees the change
  within a second, ``view.topics.RELOAD_INTERVAL_S``);
* a topic is deleted by opening the closed store for writing, its loops as threads of this
  process (``store.topic_removal``): refused while another process has it open for
  writing;
* groups are read and changed through a read-only open, as consumers in other processes are
  (offsets and pop state are shared files under flocks), so beside a running writer too; a
  reset or a delete is refused while instances of the group consume (``InUseError``).

``ServedAdmin`` runs the same operations on the store this process holds open: ``mqstore
serve``'s, for its gRPC endpoint's admin service (``mqstore topic|group ... --server``; the
endpoint is handed one, it never imports this module). Topic changes apply at once; a topic is
not deleted there (``ServedAdmin.topic_delete``).

Roles (``mqstore role``, docs/replication.md "Failover"): ``role_status`` reads a directory's
recorded role and epochs without opening it; ``role_promote`` and ``role_demote`` open a
closed store to change its role (its next start takes it up), and change a served store's
while it runs.

Every method returns plain values (what the commands print, ``--json`` as it is), so another
transport can stand in for this class without a command changing.
"""

from __future__ import annotations

import os
from contextlib import AbstractContextManager, nullcontext

from mqstore.clock import system_clock
from mqstore.config import StoreConfig
from mqstore.consumer.group_configs import GroupConfigs
from mqstore.consumer.names import check_group, check_topic
from mqstore.consumer.service import live_instances, refuse_live
from mqstore.ops import dead_letter_admin
from mqstore.errors import GroupNotFoundError, StoreLockedError, TopicNotFoundError
from mqstore.format.names import check_stored_topic
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR
from mqstore.replication.status_file import read_status
from mqstore.storage.epoch_file import read_epochs
from mqstore.storage.role_file import read_role
from mqstore.store import MessageStore
from mqstore.view.topics import Topics, describe


class StoreAdmin:
    """Topics and groups of the store in ``root``, under ``config``."""

    def __init__(self, root: str, config: StoreConfig) -> None:
        self.root = os.path.abspath(root)
        self.config = config

    # -- topics ----------------------------------------------------------------------------
    def _topics(self) -> Topics:
        return Topics(self.root, self.config)

    def topic_list(self) -> list[dict]:
        """Every topic with a config, and every topic with consume queues but none (its
        config fields None); system topics (``rmq_sys_*``) included, which the command
        leaves out unless asked."""
        configs = self._topics().all()
        stored = _stored_queues(self.root)
        out = []
        for name in sorted(set(configs) | set(stored)):
            config = configs.get(name)
            row = describe(config) if config is not None else {
                "topic": name, "read_queues": None, "write_queues": None, "perm": None,
                "perm_text": None, "order": None, "topic_sys_flag": None,
                "topic_filter_type": None}
            out.append({**row, "stored_queues": stored.get(name, [])})
        return out

    def topic_create(self, name: str, *, queues: int | None = None,
                     read_queues: int | None = None, write_queues: int | None = None,
                     perm: int = 6) -> dict:
        config = self._topics().create(name, queues=queues, read_queues=read_queues,
                                       write_queues=write_queues, perm=perm)
        return describe(config)

    def topic_update(self, name: str, *, queues: int | None = None,
                     read_queues: int | None = None, write_queues: int | None = None,
                     perm: int | None = None) -> dict:
        topics = self._topics()
        before = topics.get(name)
        after = topics.update(name, queues=queues, read_queues=read_queues,
                              write_queues=write_queues, perm=perm)
        return {**describe(after), "before": describe(before) if before is not None else None}

    def topic_delete(self, name: str) -> dict:
        config = self.config.replace(dispatch={"worker": "thread"}, flush={"worker": "thread"})
        try:
            store = MessageStore.open(self.root, config)
        except StoreLockedError as exc:
            raise StoreLockedError(f"a topic is deleted on a closed store: {exc}") from None
        with store:
            removal = store.delete_topic(name)
        declared = any(d.name == name for d in self.config.topics.declare)
        return {"topic": removal.topic,
                "config": describe(removal.config) if removal.config is not None else None,
                "queues": removal.queues, "groups": removal.groups,
                "records_below": removal.records_below, "declared": declared}

    # -- groups ----------------------------------------------------------------------------
    def _read(self) -> AbstractContextManager[MessageStore]:
        return MessageStore.open(self.root, self.config, read_only=True)

    def group_list(self) -> list[dict]:
        with self._read() as store:
            out = []
            for (topic, group), _offsets in sorted(store.consumer_groups().items(),
                                                   key=lambda kv: (kv[0][1], kv[0][0])):
                lags = store.consumer_lag(group, topic)
                out.append({"group": group, "topic": topic, "queues": len(lags),
                            "lag": sum(q.lag for q in lags),
                            "live_instances": live_instances(self.root, group, topic).get(
                                topic, 0)})
            return out

    def group_describe(self, group: str, topic: str | None = None) -> list[dict]:
        with self._read() as store:
            topics = _group_topics(store, group, topic)
            out = []
            for t in topics:
                lags = store.consumer_lag(group, t)
                out.append({
                    "group": group, "topic": t, "lag": sum(q.lag for q in lags),
                    "live_instances": live_instances(self.root, group, t).get(t, 0),
                    "queues": [{"queue_id": q.queue_id, "committed_offset": q.committed_offset,
                                "min_offset": q.min_offset, "max_offset": q.max_offset,
                                "lag": q.lag,
                                "oldest_unconsumed_age_ms": q.oldest_unconsumed_age_ms}
                               for q in lags]})
            return out

    def group_reset(self, group: str, topic: str, *, offset: int | None = None,
                    timestamp_ms: int | None = None, queue_id: int | None = None) -> dict:
        with self._read() as store:
            resets = store.reset_consumer_offsets(group, topic, offset=offset,
                                                  timestamp_ms=timestamp_ms, queue_id=queue_id)
        return {"group": group, "topic": topic, "offset": offset, "timestamp_ms": timestamp_ms,
                "queues": [{"queue_id": r.queue_id, "before": r.before, "after": r.after,
                            "min_offset": r.min_offset, "max_offset": r.max_offset}
                           for r in resets]}

    def group_delete(self, group: str, topic: str | None = None) -> dict:
        with self._read() as store:
            _group_topics(store, group, topic)
            refuse_live(self.root, group, topic, "deleting it")
            gone = store.delete_consumer_group(group, topic)
        return {"group": group, "topics": sorted(t for t, _g in gone)}

    # -- group configs and dead letters ------------------------------------------------------
    def _group_configs(self) -> GroupConfigs:
        return GroupConfigs(self.root, system_clock)

    def group_config(self, group: str) -> dict:
        """``group``'s config (``config/subscriptionGroup.json``, else the defaults)."""
        check_group(group)
        configs = self._group_configs()
        return _config_dict(configs.get(group), group in configs.listed())

    def group_config_set(self, group: str, **fields) -> dict:
        """Change the fields given (not None) of ``group``'s config; the file changes under its
        lock, so beside a running store too (it sees the change within a second)."""
        changes = {k: v for k, v in fields.items() if v is not None}
        if not changes:
            raise ValueError("give at least one field to change (--retry-max-times ...)")
        return _config_dict(self._group_configs().set(group, **changes), True)

    def group_dlq(self, group: str) -> list[dict]:
        with self._read() as store:
            return dead_letter_admin.list_dead_letters(store, group)

    def group_dlq_resend(self, group: str, offsets: list[int] | None = None,
                         ids: list[str] | None = None, every: bool = False) -> dict:
        with self._writable("resend them") as store:
            return dead_letter_admin.resend(store, group, offsets=offsets or (),
                                            ids=ids or (), every=every)

    # -- roles -----------------------------------------------------------------------------
    def role_status(self) -> dict:
        """The role the store starts in (``role.json``, else ``store.role``), its epochs, and
        what its replication last said (``replication.json``, a hint dated ``updated_ms``)."""
        record, problem = read_role(self.root)
        epochs, epoch_problem = read_epochs(self.root)
        return {"role": record.role if record else self.config.store.role,
                "master": record.master if record else self.config.server.ha_master,
                "configured_role": self.config.store.role,
                "recorded": None if record is None else {
                    "since_ms": record.since_ms, "why": record.why,
                    "cut": None if record.cut is None else vars(record.cut)},
                "epoch": epochs[-1].epoch if epochs else 0,
                "epochs": [list(e) for e in epochs],
                "problems": [p for p in (problem, epoch_problem) if p],
                "replication": read_status(self.root)}

    def _writable(self, doing: str = "change its role"):
        config = self.config.replace(dispatch={"worker": "thread"}, flush={"worker": "thread"})
        try:
            return MessageStore.open(self.root, config)
        except StoreLockedError as exc:
            raise StoreLockedError(f"the store is running: {doing} there with --server "
                                   f"({exc})") from None

    def role_promote(self, *, force: bool = False, epoch: int | None = None,
                     role: str | None = None) -> dict:
        with self._writable() as store:
            return store.promote(force=force, epoch=epoch, role=role)

    def role_demote(self, master: str) -> dict:
        with self._writable() as store:
            return store.demote(master)


class ServedAdmin(StoreAdmin):
    """The same operations on ``store``, open for writing in this process (``mqstore
    serve``'s): topics through its own ``view.topics`` (puts follow a change at once), groups
    through the store itself (its pops see a reset at once). Thread-safe as the store's calls
    are."""

    def __init__(self, store: MessageStore) -> None:
        super().__init__(store.root, store.config)
        self._store = store

    def _topics(self) -> Topics:
        return self._store.view.topics

    def _read(self) -> AbstractContextManager[MessageStore]:
        return nullcontext(self._store)

    def group_config(self, group: str) -> dict:
        config = self._store.group_config(group)
        return _config_dict(config, group in self._group_configs().listed())

    def group_config_set(self, group: str, **fields) -> dict:
        changes = {k: v for k, v in fields.items() if v is not None}
        if not changes:
            raise ValueError("give at least one field to change (--retry-max-times ...)")
        return _config_dict(self._store.set_group_config(group, **changes), True)

    def _writable(self, doing: str = "") -> AbstractContextManager[MessageStore]:
        return nullcontext(self._store)

    def role_status(self) -> dict:
        return self._store.role_status()

    def topic_delete(self, name: str) -> dict:
        """Refused (``StoreLockedError``), once the topic is known to exist: a served store's
        consume queues are written by its dispatch worker and followed by readers in other
        processes, which a deletion here would leave holding the removed files
        (docs/topics.md, "Deleting a topic")."""
        check_stored_topic(name)
        store = self._store
        if (store.topic_config(name) is None and not store.queue_ids(name)
                and not any(t == name for t, _g in store.consumer_groups())):
            raise TopicNotFoundError(f"topic {name!r} does not exist in {self.root!r}: no "
                                     f"config, no consume queue, no consumer group")
        raise StoreLockedError(
            f"a topic is deleted on a closed store: {self.root!r} is open in `mqstore serve`, "
            f"whose dispatch worker writes its consume queues; stop serve, then run `mqstore "
            f"topic delete {self.root} {name}`")


def _config_dict(config, listed: bool) -> dict:
    return {"group": config.name, "listed": listed,
            "retry_max_times": config.retry_max_times, "max_attempts": config.max_attempts,
            "retry_queue_nums": config.retry_queue_nums, "consume_enable": config.consume_enable,
            "consume_broadcast_enable": config.consume_broadcast_enable,
            "consume_message_orderly": config.orderly}


def _group_topics(store: MessageStore, group: str, topic: str | None) -> list[str]:
    """The topics ``group`` has offsets or pop state for (of ``topic`` only, if given);
    GroupNotFoundError when none."""
    check_group(group)
    if topic is not None:
        check_topic(topic)
    topics = sorted(t for t, g in store.consumer_groups() if g == group
                    and (topic is None or t == topic))
    if not topics:
        on = f" on topic {topic!r}" if topic is not None else ""
        raise GroupNotFoundError(f"group {group!r} has no offsets or pop state{on} in "
                                 f"{store.root!r}")
    return topics


def _stored_queues(root: str) -> dict[str, list[int]]:
    base = os.path.join(root, CONSUME_QUEUE_DIR)
    out = {}
    try:
        names = os.listdir(base)
    except FileNotFoundError:
        return {}
    for name in names:
        try:
            ids = sorted(int(q) for q in os.listdir(os.path.join(base, name))
                         if q.isascii() and q.isdigit())
        except (FileNotFoundError, NotADirectoryError):
            continue
        if ids:
            out[name] = ids
    return out

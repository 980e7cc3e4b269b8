"""The store's topics as one process sees them: ``config/topics.json`` (RocketMQ's topic
configs) looked up, created, changed and removed, and the put path's answer for each topic.

A store has topic configs once ``config/topics.json`` exists: a topic was created (``mqstore
topic create``, ``store.create_topic``, a first send to a store that has configs), the
deployment declares topics (``topics.declare``), or the directory came from a RocketMQ broker.
Without the file, and with ``topics.auto_create`` on, every topic is open as it always was:
``queue_select.queues_per_topic`` queues to choose from, any queue id. With configs:

* a put to a listed topic picks among its ``writeQueueNums`` queues; a queue id at or past
  that is refused (MESSAGE_ILLEGAL), and a perm without the write bit answers NO_PERMISSION;
* a put to a topic the file does not list creates it (``queues_per_topic`` queues, perm 6)
  when ``topics.auto_create`` is on, RocketMQ's autoCreateTopicEnable, and answers
  TOPIC_NOT_EXIST when it is off.

The first config a store records adopts the topics its consume queues already hold, each with
the higher of ``queues_per_topic`` and its highest queue id + 1, so nothing that was writable is
refused afterwards; a topic created later likewise never gets fewer queues than it has.

The process re-reads the file when it changed, looking at most every RELOAD_INTERVAL_S (a
change by another process: ``mqstore topic`` beside a running store); its own changes apply at
once. A damaged file is never replaced: lookups raise ``CorruptStateError`` naming it, puts
answer SERVICE_NOT_AVAILABLE with that reason, until it is repaired. Thread-safe.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Callable, Mapping, Sequence

from mqstore.clock import system_clock
from mqstore.config import MAX_TOPIC_QUEUES, DeclaredTopic
from mqstore.errors import CorruptStateError, SystemTopicError, TopicNotFoundError
from mqstore.format.names import (
    check_stored_topic, check_topic, is_system_topic, system_topic_refusal,
)
from mqstore.format.topic_config import (
    PERM_READ_WRITE, PERM_WRITE, SETTABLE_PERMS, TopicConfig, TopicTable, empty_table, new_topic,
    perm_text,
)
from mqstore.message import PutStatus
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR
from mqstore.storage.deleted_topics import read_deleted, record_deleted
from mqstore.storage.topic_file import identity, read_table, topics_path, update_table

log = logging.getLogger(__name__)

RELOAD_INTERVAL_S = 1.0  # how stale another process's change to the file may be seen
_UNREAD = ("unread",)


class TopicRefused(Exception):
    """A put's topic refuses it: RocketMQ's status and the reason, for the put to answer."""

    def __init__(self, status: PutStatus, reason: str, topic: str,
                 queues: int | None = None) -> None:
        """``queues``: for a queue id refused, the topic's number of write queues."""
        super().__init__(reason)
        self.status, self.reason, self.topic, self.queues = status, reason, topic, queues


class Topics:
    """The topic configs of the store in ``root`` (open or closed)."""

    def __init__(self, root: str, config, clock: Callable[[], int] = system_clock, *,
                 known_queues: Mapping[tuple[str, int], int] | None = None) -> None:
        """``known_queues``: the queues this process knows messages were put to (the
        writer's queue-offset table, ``append.tail.AppendTail``), beside those whose consume
        queues are on disk already."""
        self.root = root
        self.path = topics_path(root)
        self.auto_create = config.topics.auto_create
        self.default_queues = config.queue_select.queues_per_topic
        self.clock = clock
        self._lock = threading.Lock()
        self._table: TopicTable | None = None
        self._problem: str | None = None
        self._ident: object = _UNREAD
        self._checked = float("-inf")
        self._deleted: dict[str, int] | None = None
        self._known_queues: Mapping[tuple[str, int], int] = (
            known_queues if known_queues is not None else {})

    # -- reading ---------------------------------------------------------------------------
    def table(self, fresh: bool = False) -> TopicTable | None:
        """The document (None: the store has no ``topics.json``), re-read when it changed;
        ``fresh`` looks now rather than within RELOAD_INTERVAL_S."""
        now = time.monotonic()
        if fresh or now - self._checked >= RELOAD_INTERVAL_S:
            with self._lock:
                self._reload_locked(now)
        if self._problem is not None:
            raise CorruptStateError(self._problem)
        return self._table

    def _reload_locked(self, now: float) -> None:
        ident = identity(self.path)
        self._checked = now
        if ident == self._ident:
            return
        try:
            table = read_table(self.path)
        except CorruptStateError as exc:
            self._table, self._problem, self._ident = None, str(exc), ident
            log.error("%s; puts are refused until it is repaired", exc)
            return
        self._table, self._problem, self._ident = table, None, ident

    def reload(self) -> None:
        """Read the file and the deleted topics again now (they were replaced under this
        process: the state mirror installed)."""
        with self._lock:
            self._ident, self._deleted = _UNREAD, None
            self._reload_locked(time.monotonic())

    def _adopt_locked(self, table: TopicTable, ident: tuple | None) -> None:
        """The table now on disk, as this process just read or wrote it (``ident``: the
        file's identity then, taken under the file's lock)."""
        self._table, self._problem = table, None
        self._ident, self._checked = ident, time.monotonic()

    def has_configs(self) -> bool:
        """Whether puts go by topic configs (the file exists, or auto-create is off)."""
        return not self.auto_create or self.table() is not None

    def get(self, name: str) -> TopicConfig | None:
        table = self.table()
        return None if table is None else table.topics.get(name)

    def all(self) -> dict[str, TopicConfig]:
        table = self.table()
        return {} if table is None else dict(sorted(table.topics.items()))

    # -- the put path ------------------------------------------------------------------------
    def write_queues(self, wanted: dict[str, int]) -> dict[str, int] | None:
        """For a put: ``{topic: the highest queue id it names for the topic, -1 for none}``
        -> each topic's number of write queues, creating the topics it may create (only
        once every topic and queue id passed). None when the store has no topic configs
        (every topic: ``queues_per_topic`` queues, any queue id). Raises ``TopicRefused``
        for the first topic that refuses the put, ``CorruptStateError`` for a damaged file."""
        table = self.table()
        if table is None and self.auto_create:
            return None
        known = {} if table is None else table.topics
        out: dict[str, int] = {}
        missing: dict[str, int] = {}
        for name, top in wanted.items():
            config = known.get(name)
            if config is not None:
                out[name] = _writable_queues(config, top)
            elif not self.auto_create:
                raise TopicRefused(
                    PutStatus.TOPIC_NOT_EXIST,
                    f"topic {name!r} does not exist: {self.path} has no config for it and "
                    f"topics.auto_create is false; create it first (mqstore topic create, "
                    f"store.create_topic or topics.declare)", name)
            else:
                queues = self._queues_for_new(name)
                _check_queue_id(name, top, queues, created=True)
                missing[name] = queues
        if missing:
            made = self._create_many({n: new_topic(n, q, q) for n, q in missing.items()},
                                     exist_ok=True)
            for name in missing:  # another process may have been first, with its own counts
                out[name] = _writable_queues(made[name], wanted[name])
        return out

    def write_queues_of(self, name: str, queue_id: int) -> int | None:
        """``write_queues`` for a put of one message (``queue_id`` -1: none named)."""
        table = self.table()
        if table is None and self.auto_create:
            return None
        config = None if table is None else table.topics.get(name)
        if config is not None and config.perm & PERM_WRITE and (
                queue_id < config.write_queue_nums and config.write_queue_nums > 0):
            return config.write_queue_nums  # the usual case, without building a request
        counts = self.write_queues({name: queue_id})
        return None if counts is None else counts[name]

    def lookup(self, name: str, create: bool = False) -> TopicConfig | None:
        """``name``'s config (checked as every read checks a topic), or, with ``create``,
        ``ensure``'s."""
        if create:
            return self.ensure(name)
        check_stored_topic(name)
        return self.get(name)

    def ensure(self, name: str) -> TopicConfig | None:
        """The config of ``name``, created (as a first send creates it) when the store may
        create it: ``topics.auto_create`` on. None when it has none and may not."""
        check_stored_topic(name)
        config = self.get(name)
        if config is not None or not self.auto_create:
            return config
        _check_user_topic(name)  # a name a put could use
        queues = self._queues_for_new(name)
        return self._create_many({name: new_topic(name, queues, queues)}, exist_ok=True)[name]

    # -- changes ---------------------------------------------------------------------------
    def create(self, name: str, *, queues: int | None = None, read_queues: int | None = None,
               write_queues: int | None = None, perm: int = PERM_READ_WRITE) -> TopicConfig:
        """A new topic (``queues`` sets both counts; default ``queues_per_topic``);
        ValueError when it exists or an argument breaks its rule."""
        config = self._checked_new(name, queues, read_queues, write_queues, perm)
        return self._create_many({name: config}, exist_ok=False)[name]

    def update(self, name: str, *, queues: int | None = None, read_queues: int | None = None,
               write_queues: int | None = None, perm: int | None = None) -> TopicConfig:
        """Change a topic's queue counts or perm (what is not given stays);
        ``TopicNotFoundError`` when it has no config."""
        check_stored_topic(name)
        read, write = _counts(queues, read_queues, write_queues)
        if perm is not None:
            _check_perm(perm)
        result: list[TopicConfig] = []

        def change(table: TopicTable | None) -> TopicTable | None:
            old = None if table is None else table.topics.get(name)
            if old is None:
                raise TopicNotFoundError(f"topic {name!r} has no config in {self.path}; "
                                         f"create it with `mqstore topic create`")
            new = old.changed(**{k: v for k, v in (("read_queue_nums", read),
                                                   ("write_queue_nums", write), ("perm", perm))
                                 if v is not None})
            result.append(new)
            if new == old:
                return table
            return table.with_topics({**table.topics, name: new}, self.clock())
        self._change(change)
        return result[0]

    def remove(self, name: str) -> TopicConfig | None:
        """Forget ``name``'s config; returns it (None: it had none)."""
        removed: list[TopicConfig | None] = [None]

        def change(table: TopicTable | None) -> TopicTable | None:
            if table is None or name not in table.topics:
                return table
            topics = dict(table.topics)
            removed[0] = topics.pop(name)
            return table.with_topics(topics, self.clock())
        self._change(change)
        return removed[0]

    def declare(self, declared: Sequence[DeclaredTopic]) -> list[str]:
        """Make every declared topic exist as declared (``topics.declare``; a writable open
        calls it); returns what changed, one line per topic."""
        if not declared:
            return []
        lines: list[str] = []

        def change(table: TopicTable | None) -> TopicTable | None:
            base = table if table is not None else self._adopted()
            topics = dict(base.topics)
            for d in declared:
                read, write = _counts(d.queues if d.queues is not None else self.default_queues,
                                      d.read_queues, d.write_queues)
                old = topics.get(d.name)
                if old is None:
                    topics[d.name] = new_topic(d.name, read, write, d.perm)
                    lines.append(f"created topic {d.name}: {read} read / {write} write "
                                 f"queue(s), perm {d.perm}")
                    continue
                new = old.changed(read_queue_nums=read, write_queue_nums=write, perm=d.perm)
                if new != old:
                    topics[d.name] = new
                    lines.append(f"updated topic {d.name}: {read} read / {write} write "
                                 f"queue(s), perm {d.perm} (was {old.read_queue_nums} / "
                                 f"{old.write_queue_nums}, perm {old.perm})")
            if table is not None and not lines:
                return table
            return base.with_topics(topics, self.clock())
        self._change(change)
        return lines

    def _create_many(self, configs: dict[str, TopicConfig], *, exist_ok: bool
                     ) -> dict[str, TopicConfig]:
        """Add ``configs`` the file does not hold yet; returns every one's config as it is
        now (another process's, when it was first and ``exist_ok``)."""
        out: dict[str, TopicConfig] = {}

        def change(table: TopicTable | None) -> TopicTable | None:
            base = table if table is not None else self._adopted(
                () if exist_ok else configs)  # a topic created on purpose gets its counts
            topics = dict(base.topics)
            for name, config in configs.items():
                if name in topics and not exist_ok:
                    old = topics[name]
                    raise ValueError(f"topic {name!r} exists already ({old.read_queue_nums} "
                                     f"read / {old.write_queue_nums} write queue(s), perm "
                                     f"{old.perm}); change it with `mqstore topic update`")
                out[name] = topics.setdefault(name, config)
            if table is not None and len(topics) == len(table.topics):
                return table
            return base.with_topics(topics, self.clock())
        self._change(change)
        return out

    def _change(self, change: Callable[[TopicTable | None], TopicTable | None]) -> None:
        with self._lock:
            table, ident = update_table(self.path, change)
            if table is not None:
                self._adopt_locked(table, ident)

    def _adopted(self, but: Sequence[str] = ()) -> TopicTable:
        """A new document holding the topics the consume queues already hold (``but``
        those)."""
        topics = {name: new_topic(name, q, q) for name, q in self._queue_topics().items()
                  if name not in but}
        return empty_table().model_copy(update={"topics": topics})

    def _queue_topics(self) -> dict[str, int]:
        """``{topic: queues it needs}`` for every topic the store has queues of."""
        base = os.path.join(self.root, CONSUME_QUEUE_DIR)
        names = set(_entries(base)) | {t for t, _q in list(self._known_queues)}
        out = {}
        for name in sorted(names):
            try:
                check_stored_topic(name)
            except ValueError:
                continue  # not a directory a store makes
            if is_system_topic(name):
                continue  # the store's own: never a config of its own
            out[name] = self._queues_for_new(name)
        return out

    def _queues_for_new(self, name: str) -> int:
        """The queues a topic gets when created without a count: never fewer than it has."""
        ids = [int(q) for q in _entries(os.path.join(self.root, CONSUME_QUEUE_DIR, name))
               if q.isascii() and q.isdigit()]
        ids += [q for t, q in list(self._known_queues) if t == name]
        return max([self.default_queues, *(q + 1 for q in ids)])

    def _checked_new(self, name, queues, read_queues, write_queues, perm) -> TopicConfig:
        _check_user_topic(name)
        read, write = _counts(queues if queues is not None else self.default_queues,
                              read_queues, write_queues)
        _check_perm(perm)
        return new_topic(name, read, write, perm)

    # -- deleted topics ---------------------------------------------------------------------
    def dispatch_floors(self) -> dict[str, int]:
        """``{deleted topic: commit-log offset}``: dispatch gives records of the topic below
        it no unit (``storage.deleted_topics``). Read once: topics are deleted only by the
        store that writes, in this process (``store.topic_removal``)."""
        if self._deleted is None:
            try:
                self._deleted = read_deleted(self.root)
            except CorruptStateError as exc:
                log.error("%s; dispatch goes on without it", exc)
                self._deleted = {}
        return self._deleted

    def record_deleted(self, name: str, below: int) -> None:
        self._deleted = record_deleted(self.root, name, below)


def _check_user_topic(name: str) -> None:
    """A topic a user may create: the put rule's characters, and no system topic."""
    check_topic(name)
    if is_system_topic(name):
        raise SystemTopicError(system_topic_refusal(name, "create"))


def _entries(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _writable_queues(config: TopicConfig, top: int) -> int:
    if not config.writable or config.write_queue_nums == 0:
        why = (f"its perm is {config.perm} ({config.perm_text}), without the write bit "
               f"{PERM_WRITE}" if not config.writable else "it has 0 write queues")
        raise TopicRefused(PutStatus.NO_PERMISSION, f"topic {config.name!r} takes no "
                           f"messages: {why}", config.name)
    _check_queue_id(config.name, top, config.write_queue_nums, created=False)
    return config.write_queue_nums


def _check_queue_id(name: str, queue_id: int, queues: int, *, created: bool) -> None:
    if queue_id >= queues:
        has = "would be created with" if created else "has"
        raise TopicRefused(PutStatus.MESSAGE_ILLEGAL,
                           f"queue_id {queue_id} is not a write queue of topic {name!r}: it "
                           f"{has} {queues} write queue(s), ids 0..{queues - 1}", name, queues)


def _counts(queues: int | None, read_queues: int | None, write_queues: int | None
            ) -> tuple[int | None, int | None]:
    """(read, write) queue counts from ``queues`` (both) and the two overrides, checked."""
    for what, value in (("queues", queues), ("read_queues", read_queues),
                        ("write_queues", write_queues)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 1 <= value <= MAX_TOPIC_QUEUES):
            raise ValueError(f"{what} {value!r} must be an int in [1, {MAX_TOPIC_QUEUES}]")
    return (read_queues if read_queues is not None else queues,
            write_queues if write_queues is not None else queues)


def _check_perm(perm: object) -> None:
    if isinstance(perm, bool) or perm not in SETTABLE_PERMS:
        raise ValueError(f"perm {perm!r} must be 2 (write), 4 (read) or 6 (read and write)")


def describe(config: TopicConfig) -> dict:
    """A topic's config as plain values (for printing and JSON)."""
    return {"topic": config.name, "read_queues": config.read_queue_nums,
            "write_queues": config.write_queue_nums, "perm": config.perm,
            "perm_text": perm_text(config.perm), "order": config.order,
            "topic_sys_flag": config.topic_sys_flag,
            "topic_filter_type": config.topic_filter_type}

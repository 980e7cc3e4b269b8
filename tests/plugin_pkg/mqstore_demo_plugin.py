"""A third-party mqstore plugin: one strategy of each kind, written against ``mqstore.plugin_api.contracts``.

What it registers (no name clashes with the built-ins):

=================  =====================  ===========================================
kind               name                   selected by
=================  =====================  ===========================================
writer             ``demo_counting``      ``writer.kind: demo_counting``
filter             ``REGEX``              ``store.get(..., expression_type="REGEX")``
queue selector     ``first_byte``         ``queue_select.selector: first_byte``
dispatcher         ``demo_tag_counter``   always runs (in the dispatch loop's process)
flush policy       ``every_interval``     ``flush.policy: every_interval``
cleanup policy     ``max_age``            ``cleanup.policy: max_age``
``after_append``   put counter            always runs (in the store process)
=================  =====================  ===========================================

* ``demo_counting``: a plain writer (``contracts.Writer``): copies each block of records into
  the mapped segment, as the built-in ``mmap`` does, and counts in ``WRITTEN`` (this process:
  the store process) the copies, their bytes and the segments it saw open.
* ``REGEX``: ``expression="color=^r"`` matches the messages whose ``color`` property matches
  the pattern (``re.search``). It has no tag-code shortcut, so ``match_units`` passes every
  unit and ``match_message`` decides.
* ``first_byte``: queue = first body byte % queue count; an empty body has none, so this
  selector refuses it (pass ``queue_id``, or ``queue_ids`` with a ``MessageBatch``).
* ``demo_tag_counter``: counts the consumable messages of each tag (untagged messages,
  prepared and rolled-back transaction halves are not counted) in ``demo_tag_counts.json``
  under the store root, replaced atomically after each batch that brought new records. Built
  only for the ``writer`` role: the dispatch worker process, or the store process with
  ``dispatch.worker: thread``. ``read_tag_counts(root)`` reads the file from anywhere. It
  declares ``RESUMES``: a lost or stale file is rebuilt from the records still stored.
* ``every_interval``: asynchronous, but every ``flush.interval_ms`` pass forces whatever is
  pending (``least_pages`` 0) instead of waiting for ``flush.least_pages`` dirty pages.
* ``max_age``: at any hour, deletes the segments whose newest record is older than
  ``MQSTORE_DEMO_MAX_AGE_MS`` milliseconds (default: ``cleanup.file_reserved_hours``). Above
  ``cleanup.disk_forcibly_ratio`` (with ``cleanup.clean_forcibly``) the oldest go whatever
  their age; above ``cleanup.disk_warning_ratio`` puts are refused until use is back under
  ``cleanup.disk_forcibly_ratio``, as with the built-in ``rocketmq`` policy.
"""

from __future__ import annotations

import json
import logging
import os
import re
from typing import TYPE_CHECKING

from mqstore.plugin_api import (
    RESUMES, WRITER, CleanupDecision, Dispatcher, FlushSchedule, PutStatus, Role, StoreView,
    StringHash, WritableSegment, Writer, WriterContext, hookimpl,
)

if TYPE_CHECKING:
    from mqstore.plugin_api import Flusher, StoreConfig

log = logging.getLogger("mqstore_demo_plugin")

#: ``after_append`` totals for this process: hook calls, and messages those calls covered.
CALLS = {"calls": 0, "messages": 0}


#: The ``demo_counting`` writer's totals for this process: copies (``write`` calls), the bytes
#: they copied, and segments that opened (``before_roll`` calls).
WRITTEN = {"writes": 0, "bytes": 0, "rolls": 0}


# -- writer: demo_counting --------------------------------------------------------------------
class CountingWriter(Writer):
    """``contracts.Writer``, built by ``factory(ctx: WriterContext)`` in the store process.

    A plain writer: what ``write`` copies is readable once it returns. Subclasses
    ``contracts.Writer`` for ``write_blank`` (a blank is written as any block) and ``close``.
    """

    def __init__(self, ctx: WriterContext) -> None:
        pass

    def write(self, segment: WritableSegment, data: bytes | memoryview) -> int:
        WRITTEN["writes"] += 1  # under the put lock: no other put runs meanwhile
        WRITTEN["bytes"] += len(data)
        return segment.write(data)

    def before_roll(self) -> None:
        WRITTEN["rolls"] += 1


@hookimpl
def register_writers(registry):
    registry.add("demo_counting", CountingWriter)


# -- filter: REGEX ----------------------------------------------------------------------------
class PropertyRegexFilter:
    """``contracts.Filter``, built by ``factory(expression, string_hash)``."""

    def __init__(self, expression: str | None, string_hash: StringHash) -> None:
        name, sep, pattern = (expression or "").partition("=")
        if not sep or not name.strip():
            raise ValueError(f"REGEX expression {expression!r} must look like NAME=PATTERN")
        self.name = name.strip()
        self.pattern = re.compile(pattern)

    def match_units(self, tags_codes) -> None:
        return None  # no tag-code shortcut: every unit is a candidate

    def match_message(self, message) -> bool:
        value = message.properties.get(self.name)
        return value is not None and self.pattern.search(value) is not None


@hookimpl
def register_filters(registry):
    registry.add("REGEX", PropertyRegexFilter)


# -- queue selector: first_byte ---------------------------------------------------------------
class FirstByteSelector:
    """``contracts.QueueSelector``, built by ``factory(config, string_hash)``."""

    def __init__(self, config: "StoreConfig", string_hash: StringHash) -> None:
        pass

    def select(self, message, queue_count: int) -> int:
        body = message.body
        if not body:
            raise ValueError(
                f"queue selector 'first_byte' needs a non-empty body (message to topic "
                f"{message.topic!r}); pass queue_id, or queue_ids with a MessageBatch")
        return body[0] % queue_count


@hookimpl
def register_queue_selectors(registry):
    registry.add("first_byte", FirstByteSelector)


# -- dispatcher: demo_tag_counter -------------------------------------------------------------
TAG_COUNTS_FILE = "demo_tag_counts.json"
_TX_MASK = 0b1100  # RocketMQ's MessageSysFlag transaction bits
_TX_NOT, _TX_COMMIT = 0b0000, 0b1000  # (prepared 0b0100 and rolled back 0b1100 are not consumed)


def read_tag_counts(root: str | os.PathLike) -> dict:
    """The counter's file: ``{"tags": {tag: count}, "next": offset, "last": [offset, time]}``
    (``next``: every record below it is counted; ``last``: the newest counted record)."""
    with open(os.path.join(root, TAG_COUNTS_FILE), encoding="utf-8") as f:
        return json.load(f)


def _tag_of(properties: bytes) -> str | None:
    """The TAGS property of an encoded properties block (``name\\x01value\\x02``...)."""
    tag = None
    for item in properties.split(b"\x02"):
        name, sep, value = item.partition(b"\x01")
        if name == b"TAGS" and sep and value:
            tag = value.decode("utf-8", errors="replace")  # a later duplicate wins, as in Java
    return tag


class TagCounter(Dispatcher):
    """Subclasses ``contracts.Dispatcher`` for its ``close`` (nothing to do: the file is
    replaced after every batch).

    ``dispatch`` is idempotent: records below ``next`` are skipped, so a retried batch, a
    restarted worker or recovery's re-dispatch never counts a record twice. ``RESUMES``:
    when the file is missing, unreadable, or names a newest record the commit log no longer
    holds (a crash cut the log shorter), the counts restart empty and ``resume_offset`` asks
    for every stored record again (the store starts at its first stored byte).
    """

    capabilities = frozenset({RESUMES})

    def __init__(self, view: StoreView) -> None:
        self.path = os.path.join(view.root, TAG_COUNTS_FILE)
        self.tags: dict[str, int] = {}
        self.next = 0
        self.last: list[int] | None = None
        state = self._load()
        if state is None:
            return
        if not self._still_stored(view, state["last"]):
            log.warning("%s counts a record the commit log no longer holds (at %d); tag "
                        "counts are rebuilt", self.path, state["last"][0])
            return
        self.tags, self.next, self.last = state["tags"], state["next"], state["last"]

    @classmethod
    def build(cls, view: StoreView, role: Role) -> "TagCounter | None":
        """``contracts.DispatcherFactory``: only the process that writes the store's derived
        files counts; followers and readers read the file (``read_tag_counts``)."""
        return cls(view) if role == WRITER else None

    def _load(self) -> dict | None:
        try:
            with open(self.path, encoding="utf-8") as f:
                state = json.load(f)
            return {"tags": {str(k): int(v) for k, v in state["tags"].items()},
                    "next": int(state["next"]),
                    "last": None if state["last"] is None else [int(x) for x in state["last"]]}
        except FileNotFoundError:
            return None
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning("%s is unreadable (%s); tag counts are rebuilt", self.path, exc)
            return None

    @staticmethod
    def _still_stored(view: StoreView, last: list[int] | None) -> bool:
        if last is None:
            return True
        offset, store_time = last
        if offset < view.commit_log.min_offset:
            return True  # deleted by cleanup: what follows it is what needs counting
        try:
            message = view.message_at(offset)
        except Exception:  # damaged: recount
            return False
        return message is not None and message.store_timestamp == store_time

    def resume_offset(self) -> int:
        return self.next

    def dispatch(self, batch) -> None:
        if batch.end <= self.next:
            return  # seen already
        tags = dict(self.tags)  # committed only once the file is replaced: a failed write
        last = self.last        # retries the batch from the same counts
        phys = batch.phys_offsets.tolist()
        sysflags = batch.sysflags.tolist()
        for i, offset in enumerate(phys):
            if offset < self.next:
                continue
            last = [offset, int(batch.store_timestamps[i])]
            if (sysflags[i] & _TX_MASK) not in (_TX_NOT, _TX_COMMIT):
                continue
            tag = _tag_of(batch.properties[i])
            if tag is not None:
                tags[tag] = tags.get(tag, 0) + 1
        self._write({"tags": dict(sorted(tags.items())), "next": batch.end, "last": last})
        self.tags, self.next, self.last = tags, batch.end, last

    def _write(self, state: dict) -> None:
        """Replace the file atomically: readers see the old counts or the new, never half."""
        tmp = self.path + ".tmp"  # one writer at a time: the dispatch loop's process
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(state, f)
        os.replace(tmp, self.path)


@hookimpl
def register_dispatchers(registry):
    registry.add("demo_tag_counter", TagCounter.build)


# -- flush policy: every_interval -------------------------------------------------------------
class EveryIntervalFlush:
    """``contracts.FlushPolicyFactory`` (the class: ``EveryIntervalFlush(config, flusher)``
    builds the ``contracts.FlushPolicy``; ``schedule`` is read in the flush loop's process)."""

    visible_after_flush = False  # consumers see what is written, as with async

    def __init__(self, config: "StoreConfig", flusher: "Flusher") -> None:
        pass

    @staticmethod
    def schedule(config: "StoreConfig") -> FlushSchedule:
        interval_s = config.flush.interval_ms / 1000.0
        return FlushSchedule(interval_s, 0, interval_s)  # least_pages 0: whatever is pending

    def complete_put(self, end_offset: int, wait: bool) -> PutStatus:
        return PutStatus.PUT_OK  # a put never waits; the loop forces within one interval


@hookimpl
def register_flush_policies(registry):
    registry.add("every_interval", EveryIntervalFlush)


# -- cleanup policy: max_age ------------------------------------------------------------------
MAX_AGE_ENV = "MQSTORE_DEMO_MAX_AGE_MS"
HOUR_MS = 3_600_000


class MaxAgeCleanup:
    """``contracts.CleanupPolicy``, built by ``factory(config)`` in the store process."""

    def __init__(self, config: "StoreConfig") -> None:
        cfg = config.cleanup
        raw = os.environ.get(MAX_AGE_ENV, "").strip()
        try:
            self.max_age_ms = int(raw) if raw else int(cfg.file_reserved_hours * HOUR_MS)
        except ValueError:
            raise ValueError(f"{MAX_AGE_ENV}={raw!r} must be whole milliseconds") from None
        if self.max_age_ms <= 0:
            raise ValueError(f"{MAX_AGE_ENV}={raw!r} must be > 0 (0 would mean: delete "
                             f"whatever the age)")
        self.full_above = cfg.disk_warning_ratio / 100
        self.forcibly_above = cfg.disk_forcibly_ratio / 100
        self.clean_forcibly = cfg.clean_forcibly

    def decide(self, now_ms: int, disk_used: float) -> CleanupDecision:
        if disk_used < 0:  # unknown: leave the flag as it is
            return CleanupDecision(True, self.max_age_ms, None)
        over_forcibly = disk_used > self.forcibly_above
        if disk_used > self.full_above:
            disk_full: bool | None = True
        elif over_forcibly:
            disk_full = None  # DISK_FULL stays until use is back under the forcibly ratio
        else:
            disk_full = False
        reserved_ms = 0 if over_forcibly and self.clean_forcibly else self.max_age_ms
        return CleanupDecision(True, reserved_ms, disk_full)


@hookimpl
def register_cleanup_policies(registry):
    registry.add("max_age", MaxAgeCleanup)


# -- after_append: a put counter --------------------------------------------------------------
@hookimpl
def after_append(result):
    CALLS["calls"] += 1
    CALLS["messages"] += len(result)

"""The Reader: pulls, lookups by offset, id, key and time, queue offsets.

Reads never take the put lock. In a process that does not write the consume queues (beside a
dispatch worker, or read-only) the reader follows them: it maps new files as they appear and
reads units only up to what the writer has published.
"""

from __future__ import annotations

import logging
import os
import threading

import numpy as np

from mqstore.format import names
from mqstore.plugin_api.contracts import PRECOMPUTES, capabilities_of
from mqstore.errors import CorruptRecordError, StoreClosedError
from mqstore.plugin_api.filtering import MATCH_ALL
from mqstore.format.cq_unit import CQ_UNIT_SIZE
from mqstore.format.properties import KEY_SEPARATOR
from mqstore.format.record import parse_offset_msg_id
from mqstore.read import served_rows
from mqstore.format.cq_unit import EXT_ADDRESS_MAX
from mqstore.message import GetResult, StoredMessage
from mqstore.view.checked_read import read_message
from mqstore.read.pull import PullRequest, get_messages, scan_queue
from mqstore.read.plain_pull import get_plain
from mqstore.message import ReadBatch
from mqstore.running_flags import NOT_READABLE
from mqstore.storage.consume_queue import CONSUME_QUEUE_DIR, ConsumeQueue
from mqstore.read import time_cache
from mqstore.read.time_search import LOWER, UPPER, probing_offset_by_time, store_time_at

log = logging.getLogger(__name__)
INT64_MIN, INT64_MAX = names.INT64_MIN, names.INT64_MAX


def check_queue(topic: object, queue_id: object) -> None:
    """The put path's rules for a queue a read names (``format.names``): its topic, as stored
    (``check_stored_topic``), and its queue id."""
    names.check_stored_topic(topic)
    names.check_queue_id(queue_id)


class Reader:
    def __init__(self, state, view, limits, dispatchers, follow_limit) -> None:
        """``state``: the store's open/closed state and running flags; ``view``: this
        process's ``DirectoryView``; ``follow_limit()``: how far consume-queue views may
        advance, or None when this process writes them (the dispatch worker's published
        position; read-only, the end up to which the commit log checks out)."""
        self.state = state
        self.view = view
        self.root = view.root
        self.read_only = state.read_only
        self.commit_log = view.commit_log
        self.consume_queues = view.consume_queues
        self.subscriptions = view.subscriptions
        self._limits = limits
        self._bulk_limits = limits.bulk_limits()
        self.dispatchers = dispatchers
        self._follow_limit = follow_limit
        self._seen_limit: dict = {}  # the limit each followed queue was last refreshed to
        self._follow_lock = threading.Lock()

    # -- following a writer ----------------------------------------------------------------
    def follow(self, follow_limit) -> None:
        """Follow the consume queues up to ``follow_limit()`` from now on (the store process,
        once its dispatch worker publishes how far the queues are written)."""
        self._follow_limit = follow_limit

    def queue(self, topic: str, queue_id: int):
        """The consume queue of a topic/queue in this process (None if it has none), refreshed
        to what the writer has published when another process writes it."""
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        limit = self._follow_limit()
        if limit is None:
            return cq
        if not self.read_only and cq is not None and self._seen_limit.get(key) == limit:
            return cq  # nothing published since the last look
        # One refresh at a time: a look from a window another thread has already moved past
        # would set a file's written position back.
        with self._follow_lock:
            cq = self.consume_queues.get(key)
            if cq is None:
                # A directory without files holds no queue (recovery emptied it, or the
                # writer is creating it): as in the writer's own table.
                if not self._names_in(os.path.join(self.root, CONSUME_QUEUE_DIR, topic,
                                                   str(queue_id))):
                    return None
                # No load: refresh maps the files as they come, so one deleted or still being
                # created while we look is simply looked at again.
                cq = ConsumeQueue(self.root, topic, queue_id, None, read_only=True,
                                  budget=self.view.mapped)
                cq.follow()
                self.consume_queues[key] = cq
                self._seen_limit.pop(key, None)
            if self.read_only:
                # Dispatch writes units after the records they name, so units appear while the
                # log stands still: every look checks (an idle one reads a single unit).
                cq.refresh(limit, self.commit_log)
                cq.follow_min_offset(self.commit_log.min_offset)
            elif self._seen_limit.get(key) != limit:
                # The worker publishes its position after writing the units below it.
                cq.refresh(limit)
                if key not in self._seen_limit:  # first look: cleanup may have deleted
                    cq.follow_min_offset(self.commit_log.min_offset)  # its first units' records
                self._seen_limit[key] = limit
        return cq

    def discover_queues(self, topic: str | None = None) -> None:
        """Look up the queues another process's writer created since the last look (of
        ``topic`` only: one directory, not the store's every topic)."""
        if self._follow_limit() is None:
            return
        base = os.path.join(self.root, CONSUME_QUEUE_DIR)
        for t in self._names_in(base) if topic is None else [topic]:
            for qname in self._names_in(os.path.join(base, t)):
                if qname.isdigit() and (t, int(qname)) not in self.consume_queues:
                    self.queue(t, int(qname))

    @staticmethod
    def _names_in(directory: str) -> list[str]:
        """The entries of a directory the writer may be creating or deleting right now."""
        try:
            return os.listdir(directory)
        except (FileNotFoundError, NotADirectoryError):
            return []

    # -- reads -----------------------------------------------------------------------------
    def _check_open(self) -> None:
        if self.state.closed:
            raise StoreClosedError(f"store {self.root!r} is closed")

    def get(self, group: str, topic: str, queue_id: int, offset: int, max_msgs: int = 32, *,
            expression: str | None = None, expression_type: str = "TAG",
            max_total_bytes: int | None = None) -> GetResult | None:
        """Pull up to ``max_msgs`` messages of ``topic``/``queue_id`` from queue ``offset``.

        Returns None when the store is not readable (RocketMQ's null result).
        """
        if self.state.closed:
            raise StoreClosedError(f"store {self.root!r} is closed")
        if self.state.running_flags & NOT_READABLE:
            return None
        plain = (expression is None and max_total_bytes is None and type(max_msgs) is int
                 and max_msgs > 0 and type(offset) is int and type(group) is str
                 and type(queue_id) is int and 0 <= queue_id <= names.INT32_MAX
                 and names.check_stored_topic(topic))
        if plain:
            # A consumer's plain pull, its arguments plainly valid: no request to build.
            cq = self.queue(topic, queue_id)
            got = get_plain(self.commit_log, cq, offset, max_msgs, self._limits)
            if got is not None:
                return got
        req = self._request(group, topic, queue_id, offset, max_msgs, expression,
                            expression_type, max_total_bytes)
        if not plain:  # looked up after the arguments are checked
            cq = self.queue(topic, queue_id)
        return get_messages(self.commit_log, cq, req, self._limits)

    def read(self, topic: str, queue_id: int, offset: int, max_msgs: int = 1024, *,
             expression: str | None = None, expression_type: str = "TAG",
             group: str | None = None, max_total_bytes: int | None = None,
             verify: bool = True) -> ReadBatch | None:
        """Up to ``max_msgs`` messages of ``topic``/``queue_id`` from queue ``offset``, as
        columns (a ``ReadBatch``): the rows ``get`` would return, by the same rules (status,
        next offset, batch limits, filters, damaged records passed over), without building a
        message object per row. ``group`` names the consumer group whose registered SQL92
        subscription may skip records by bitmap. ``verify=False`` serves bodies without
        checking their CRC (every other check stays). None when the store is not readable.
        """
        if self.state.closed:
            raise StoreClosedError(f"store {self.root!r} is closed")
        if self.state.running_flags & NOT_READABLE:
            return None
        req = self._request(group if group is not None else "", topic, queue_id, offset,
                            max_msgs, expression, expression_type, max_total_bytes, verify)
        scan = scan_queue(self.commit_log, self.queue(topic, queue_id), req,
                          self._bulk_limits)
        if isinstance(scan, GetResult):
            return ReadBatch(scan.status, scan.next_begin_offset, scan.min_offset,
                             scan.max_offset, _message_at=self._message_or_none)
        r = scan.finish()
        return ReadBatch(r.status, r.next_begin_offset, r.min_offset, r.max_offset,
                         filtered_count=r.filtered_count, corrupt=r.corrupt,
                         suggest_pulling_from_slave=r.suggest_pulling_from_slave,
                         _message_at=self._message_or_none,
                         **served_rows.columns(scan.parts, self._tag_codes(topic, queue_id)))

    def _tag_codes(self, topic: str, queue_id: int):
        """The rows' tag codes from their units' (extension addresses resolved)."""
        def resolve(codes: np.ndarray) -> np.ndarray:
            is_ext = codes <= EXT_ADDRESS_MAX
            if not is_ext.any():
                return codes
            ext = self.view.consume_queue_ext(topic, queue_id)
            codes = codes.astype(np.int64)
            if ext is not None:
                present, real, _times, _bitmaps = ext.resolve(codes[is_ext])
                codes[is_ext] = np.where(present, real, 0)
            else:
                codes[is_ext] = 0
            return codes
        return resolve

    def _request(self, group, topic, queue_id, offset, max_msgs, expression, expression_type,
                 max_total_bytes, verify: bool = True) -> PullRequest:
        if not isinstance(group, str):
            raise ValueError(f"group {group!r} must be a string")
        check_queue(topic, queue_id)
        offset = names.check_int("offset", offset, INT64_MIN, INT64_MAX)
        max_msgs = names.check_int("max_msgs", max_msgs, 0, names.INT32_MAX)
        if max_total_bytes is not None:
            names.check_int("max_total_bytes", max_total_bytes, 0, INT64_MAX)
        if not isinstance(verify, (bool, np.bool_)):
            raise ValueError(f"verify {verify!r} must be True or False")
        if expression is None:
            flt = MATCH_ALL
        else:
            flt = self.view.compile_filter(expression, expression_type)
        bitmap = None
        if expression is not None and group and PRECOMPUTES in capabilities_of(flt):
            bitmap = self._registered_bitmap(group, topic, expression, expression_type)
        view = self.view
        return PullRequest(offset, max_msgs, flt, max_total_bytes,
                           lambda: view.consume_queue_ext(topic, queue_id), bitmap,
                           bool(verify))

    def _registered_bitmap(self, group, topic, expression, expression_type):
        """(bloom positions, registered at) of the group's subscription, when it is this one."""
        subs = self.subscriptions
        subs.reload()
        entry = subs.lookup(group, topic)
        if (entry is None or entry["expression"] != expression
                or entry["type"].upper() != expression_type.upper()):
            return None
        return subs.positions(entry), entry["registered_at"]

    # -- subscriptions with precomputed bitmaps ----------------------------------------------
    def register_subscription(self, group: str, topic: str, expression: str,
                              expression_type: str = "SQL92") -> None:
        """Register a consumer group's subscription so dispatch pre-computes its filter
        bitmap for every new message of ``topic`` (pulls then skip non-matching messages
        without reading them). Messages stored earlier are still filtered exactly. The filter
        type must declare ``PRECOMPUTES`` (SQL92 does)."""
        self._check_open()
        if self.read_only:
            raise PermissionError(f"store {self.root!r} is open read-only")
        if not isinstance(group, str) or not group:
            raise ValueError(f"group {group!r} must be a non-empty string")
        names.check_topic(topic)
        # Refuses a bad expression before saving it.
        flt = self.view.compile_filter(expression, expression_type)
        if PRECOMPUTES not in capabilities_of(flt):
            raise ValueError(f"expression_type {expression_type!r}: its filter does not "
                             f"precompute bitmaps; only such subscriptions are registered")
        self.subscriptions.register(group, topic, expression, self.view.clock(),
                                    expression_type.upper())

    def unregister_subscription(self, group: str, topic: str) -> bool:
        self._check_open()
        return self.subscriptions.unregister(group, topic)


    def message_at(self, phys_offset: int) -> StoredMessage | None:
        """The message whose record starts at ``phys_offset``; None when no record starts
        there; CorruptRecordError when one does but is damaged (never wrong bytes)."""
        self._check_open()
        if type(phys_offset) is not int or not 0 <= phys_offset <= INT64_MAX:  # cheap when fine
            phys_offset = names.check_int("phys_offset", phys_offset, 0, INT64_MAX)
        return read_message(self.commit_log, phys_offset)

    def _message_or_none(self, phys_offset: int) -> StoredMessage | None:
        """``message_at`` for lookups that go on past a damaged record (after logging it).
        The offset comes from the store's own files (an index entry, an id), so it is not
        checked as an argument: a damaged one names no record."""
        self._check_open()
        try:
            return read_message(self.commit_log, phys_offset)
        except CorruptRecordError as exc:
            log.warning("lookup passes over a damaged record: %s", exc)
            return None

    def message_by_id(self, msg_id: str) -> StoredMessage | None:
        self._check_open()
        host, offset = parse_offset_msg_id(msg_id)
        msg = read_message(self.commit_log, offset)
        return msg if msg is not None and msg.record.store_host == host else None

    def offset_by_time(self, topic: str, queue_id: int, timestamp_ms: int,
                       boundary: str = LOWER) -> int:
        if self.state.closed:
            raise StoreClosedError(f"store {self.root!r} is closed")
        # Plainly valid arguments (the usual case) pass without the general checks, which
        # cost a search by time a sixth of its time.
        if not (type(queue_id) is int and 0 <= queue_id <= names.INT32_MAX
                and type(timestamp_ms) is int and INT64_MIN <= timestamp_ms <= INT64_MAX
                and type(boundary) is str and (boundary == LOWER or boundary == UPPER)):
            check_queue(topic, queue_id)
            timestamp_ms = names.check_int("timestamp_ms", timestamp_ms, INT64_MIN, INT64_MAX)
            if not isinstance(boundary, str) or boundary not in (LOWER, UPPER):
                raise ValueError(f"boundary {boundary!r} must be 'lower' or 'upper'")
        names.check_stored_topic(topic)
        cq = self.queue(topic, queue_id)
        # time_search.offset_by_time, without its frame.
        found = time_cache.search(self.commit_log, cq, timestamp_ms, boundary == UPPER)
        return found if found is not None else probing_offset_by_time(
            self.commit_log, cq, timestamp_ms, boundary)

    def min_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        check_queue(topic, queue_id)
        cq = self.queue(topic, queue_id)
        return cq.min_offset if cq is not None else 0

    def max_offset(self, topic: str, queue_id: int) -> int:
        self._check_open()
        check_queue(topic, queue_id)
        cq = self.queue(topic, queue_id)
        return cq.max_offset if cq is not None else 0

    def earliest_message_time(self, topic: str, queue_id: int) -> int:
        self._check_open()
        check_queue(topic, queue_id)
        cq = self.queue(topic, queue_id)
        if cq is None or cq.max_offset == cq.min_offset:
            return -1
        seg = cq.segments.find(cq.min_logic_offset)
        unit = cq.units_of(seg)[(cq.min_logic_offset - seg.start) // CQ_UNIT_SIZE]
        return store_time_at(self.commit_log, int(unit["phys_offset"]))

    def topics(self, *, include_system: bool = False) -> list[str]:
        self._check_open()
        self.discover_queues()
        return sorted({t for t, _q in self.consume_queues
                       if include_system or not names.is_system_topic(t)})

    def queue_ids(self, topic: str) -> list[int]:
        self._check_open()
        names.check_stored_topic(topic)
        self.discover_queues(topic)
        return sorted(q for t, q in self.consume_queues if t == topic)

    @property
    def min_phys_offset(self) -> int:
        self._check_open()
        return self.commit_log.min_offset

    @property
    def max_phys_offset(self) -> int:
        self._check_open()
        return self.commit_log.max_offset


    # -- key index -------------------------------------------------------------------------
    def key_index(self):
        """The dispatcher answering key lookups (``LOOKS_UP_KEYS``) in this process."""
        index = self.dispatchers.key_lookup()
        if index is None:
            raise RuntimeError(f"store {self.root!r} has no key index (index.enabled is false)")
        return index

    def query_by_key(self, topic: str, key: str, max_num: int = 32, begin_ms: int = 0,
                     end_ms: int | None = None) -> list[StoredMessage]:
        """Messages of ``topic`` carrying ``key`` (a KEYS token or the UNIQ_KEY), stored within
        ``[begin_ms, end_ms]``: the ``max_num`` newest, in ascending commit-log order.

        Unlike RocketMQ, every result really carries the key (no hash-collision leaks), the
        window is exact to the millisecond, and each message appears once.
        """
        self._check_open()
        names.check_stored_topic(topic)
        if not isinstance(key, str) or not key or KEY_SEPARATOR in key:
            raise ValueError(f"key {key!r} must be a non-empty string without spaces "
                             f"(KEYS tokens are separated by spaces)")
        max_num = names.check_int("max_num", max_num, 0, names.INT32_MAX)
        begin_ms = names.check_int("begin_ms", begin_ms, INT64_MIN, INT64_MAX)
        end_ms = INT64_MAX if end_ms is None else names.check_int("end_ms", end_ms,
                                                                     INT64_MIN, INT64_MAX)
        if begin_ms > end_ms:
            raise ValueError(f"begin_ms {begin_ms} is after end_ms {end_ms}")
        found: list[StoredMessage] = []
        if max_num == 0:
            return found
        seen: set[int] = set()
        for phys in self.key_index().candidates(topic, key, begin_ms, end_ms):
            if phys in seen:
                continue
            seen.add(phys)
            msg = self._message_or_none(phys)
            if (msg is None or msg.topic != topic
                    or not begin_ms <= msg.store_timestamp <= end_ms
                    or (key not in msg.keys and msg.uniq_key != key)):
                continue
            found.append(msg)
            if len(found) == max_num:
                break
        found.sort(key=lambda m: m.phys_offset)
        return found

    def query_by_unique_key(self, topic: str, uniq_key: str) -> StoredMessage | None:
        """The message whose UNIQ_KEY is ``uniq_key`` (the first stored, if a producer
        retried), or None."""
        self._check_open()
        names.check_stored_topic(topic)
        if not isinstance(uniq_key, str) or not uniq_key or KEY_SEPARATOR in uniq_key:
            raise ValueError(f"uniq_key {uniq_key!r} must be a non-empty string without spaces")
        best = None
        for phys in self.key_index().candidates(topic, uniq_key, 0, INT64_MAX):
            msg = self._message_or_none(phys)
            if msg is not None and msg.topic == topic and msg.uniq_key == uniq_key and (
                    best is None or msg.store_timestamp < best.store_timestamp
                    or (msg.store_timestamp == best.store_timestamp
                        and msg.phys_offset < best.phys_offset)):
                best = msg
        return best

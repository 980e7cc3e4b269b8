"""DirectoryView: the one implementation of ``contracts.StoreView``.

Every process that opens a store directory (the store process, its dispatch worker, read-only
stores) builds one view over its own maps of the files, and hands it to the dispatchers it
builds, with that process's role. The view owns the table of consume queues and their
extensions in that process, and the budget of their files it keeps mapped
(``consume_queue.max_mapped_files``: NOTE [ Mapped budget ] in ``storage.mapped_budget``).
"""

from __future__ import annotations

import logging
import threading

from mqstore.plugin_api.filtering import FilterCache
from mqstore.hashing import string_hasher
from mqstore.view.checked_read import read_message
from mqstore.storage.consume_queue import ConsumeQueue
from mqstore.storage.cq_ext import open_ext
from mqstore.storage.mapped_budget import MappedBudget
from mqstore.view.subscriptions import Subscriptions
from mqstore.view.topics import Topics

log = logging.getLogger(__name__)


class DirectoryView:
    def __init__(self, root: str, config, *, clock, hash_kind: str, commit_log, checkpoint,
                 recovery_report, cq_file_bytes: int, consume_queues: dict, filters,
                 writes_queues: bool, manifest=None, known_queues=None,
                 mapped: MappedBudget | None = None) -> None:
        """``writes_queues``: this process builds the consume queues (creates them and their
        extensions); ``manifest`` (a ``ManifestKeeper``) learns of new queues;
        ``known_queues``: the writer's queue-offset table (``view.topics.Topics``); ``mapped``:
        the budget the queues were loaded under (``load_consume_queues``), else a new one."""
        self.root = root
        self.config = config
        self.clock = clock
        self.hash_kind = hash_kind
        self.string_hash = string_hasher(hash_kind)
        self.commit_log = commit_log
        self.checkpoint = checkpoint
        self.recovery_report = recovery_report
        self.subscriptions = Subscriptions(root)
        self.topics = Topics(root, config, clock, known_queues=known_queues)
        self.consume_queues: dict = consume_queues
        self.mapped = mapped or MappedBudget(config.consume_queue.max_mapped_files)
        for cq in consume_queues.values():
            cq.govern(self.mapped)
        self.consume_queue_exts: dict = {}
        self.writes_queues = writes_queues
        self.manifest = manifest
        self.filters = FilterCache(filters, self.string_hash)
        self._cq_file_bytes = cq_file_bytes
        self._lock = threading.Lock()

    def consume_queue(self, topic: str, queue_id: int, create: bool = False):
        key = (topic, queue_id)
        cq = self.consume_queues.get(key)
        if cq is None and create and self.writes_queues:
            with self._lock:
                cq = self.consume_queues.get(key)
                if cq is None:
                    cq = ConsumeQueue(self.root, topic, queue_id, self._cq_file_bytes,
                                      on_warning=log.warning, budget=self.mapped)
                    self.consume_queues[key] = cq
                    if self.manifest is not None:
                        self.manifest.mark()
        return cq

    def consume_queue_ext(self, topic: str, queue_id: int, create: bool = False):
        key = (topic, queue_id)
        ext = self.consume_queue_exts.get(key)
        if ext is None:
            with self._lock:
                ext = self.consume_queue_exts.get(key)
                if ext is None:
                    ext = open_ext(self.root, topic, queue_id,
                                   self.config.consume_queue.ext_file_bytes,
                                   read_only=not self.writes_queues,
                                   create=create and self.writes_queues)
                    if ext is not None:
                        self.consume_queue_exts[key] = ext
        return ext

    def hold_floors(self, floors: dict) -> None:
        """Give every queue fillers up to its floor (``ConsumeQueue.hold_offsets``), creating
        the queues that are gone; for the writer of the consume queues, once dispatch has
        caught up with the log as it was opened."""
        for (topic, queue_id), floor in sorted(floors.items()):
            cq = self.consume_queue(topic, queue_id, create=floor > 0)
            if cq is not None:
                cq.hold_offsets(floor)
        if self.manifest is not None:
            self.manifest.write_marked(self.consume_queues)

    def message_at(self, phys_offset: int):
        return read_message(self.commit_log, phys_offset)

    def compile_filter(self, expression: str | None, expression_type: str):
        return self.filters.compile(expression, expression_type)

    def flush_queues(self) -> None:
        for cq in list(self.consume_queues.values()):
            cq.flush()
        for ext in list(self.consume_queue_exts.values()):
            ext.flush()

    def close(self) -> None:
        for ext in self.consume_queue_exts.values():
            ext.close()
        self.consume_queue_exts.clear()
        for cq in self.consume_queues.values():
            cq.close()

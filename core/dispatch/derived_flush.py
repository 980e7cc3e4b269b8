"""The once-a-second flush of what dispatch derives, by whoever owns it (the dispatch worker,
or the store process in thread mode): the consume queues and their ext files, every
dispatcher's ``persist``, the queue manifest, then ``mqstore.queued``
(``storage.queue_progress``): how far all of that now covers the commit log.

The mark written is the last record dispatched before the files were forced whose bytes the
commit log had flushed by the time the mark is written. Under sync flush dispatch never runs
ahead of the flushed end, so it is the last record dispatched; under async flush it trails by
about a flush interval, because a record in the page cache only may be lost with the power
while the units derived from it are not, and recovery would then start its walk past bytes
that are gone.
"""

from __future__ import annotations

import logging
from collections import deque
from typing import Callable

from mqstore.storage.queue_progress import QUEUED_FILE, DispatchMark, write_queued

log = logging.getLogger(__name__)
PENDING_MARKS = 64  # one a flush: a minute of marks waiting for the commit log's flush


class DerivedFlush:
    def __init__(self, root: str, view, dispatchers, manifest,
                 last_mark: Callable[[], DispatchMark | None],
                 flushed: Callable[[], int]) -> None:
        self.root = root
        self.view = view
        self.dispatchers = dispatchers
        self.manifest = manifest
        self.last_mark = last_mark
        self.flushed = flushed
        self._pending: deque[DispatchMark] = deque(maxlen=PENDING_MARKS)
        self._written: DispatchMark | None = None

    def __call__(self) -> None:
        mark = self.last_mark()  # before forcing: its units are in the maps already
        self.view.flush_queues()
        self.dispatchers.persist()
        self.manifest.update(self.view.consume_queues)
        if mark is not None and (not self._pending or self._pending[-1] != mark):
            self._pending.append(mark)
        self._record(self.flushed())

    def _record(self, flushed: int) -> None:
        durable = None
        while self._pending and self._pending[0].end <= flushed:
            durable = self._pending.popleft()
        if durable is None or durable == self._written:
            return
        try:
            write_queued(self.root, durable)
        except OSError as exc:  # a full disk: recovery falls back to an older mark; try later
            self._pending.appendleft(durable)
            log.warning("%s not written (%s); it is tried again", QUEUED_FILE, exc)
            return
        self._written = durable

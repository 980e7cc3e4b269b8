"""Pop-consumer state: where each queue's pops stand and which messages are in flight.

In memory (``PopState``), per queue: the next offset never popped, and the messages in flight
(popped, not yet acknowledged), each with its attempt, the store-clock ms it becomes visible
again and its delivery number (receipt handles carry it), plus a heap of deadlines so a pop
finds what ran out without walking every message in flight. A queue's consumed offset (for
lag and retention) is its lowest offset in flight, or its next offset when none is.

On disk, NOTE [ Pop journal ] (``pop_journal``): a checkpoint of this state plus the records
appended since. The checkpoint, ``consumer/pop/<topic>@<group>.json``::

    {"version": 2,
     "generation": 3,           # the journal generation that continues this checkpoint
     "delivery": 17,            # the last delivery number handed out
     "rotate": 2,               # the queue the next pop starts with (pops spread over queues)
     "queues": {"0": {"offset": 12,      # next queue offset never popped
                      "inflight": {"10": [attempt, visible_at_ms, delivery], ...},
                      "dead": {"10": log_from}}}}   # dead-lettering begun (``dead_letters``)

Version 1 (the file the state was before the journal, rewritten whole by every change) is the
same without ``generation``, and is read as generation 0. Every shape is validated (pydantic,
strict): a file that breaks a rule is refused with ``CorruptStateError`` naming it and the rule.
"""

from __future__ import annotations

import heapq
import os
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mqstore.errors import CorruptStateError
from mqstore.format.pop_record import DEAD, DONE, INFLIGHT, NEXT

POP_DIR = os.path.join("consumer", "pop")
SUFFIX = ".json"
JOURNAL_SUFFIX = ".journal"
VERSION = 2
DELIVERY_CLOCK_SHIFT = 20  # delivery numbers start at store-clock ms << 20 (see next_delivery)
_HEAP_SLACK = 4096

_Key = Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,17})$")]
_Count = Annotated[int, Field(ge=0, lt=1 << 62)]  # room above for the next numbers in int64


class _QueueDoc(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    offset: _Count
    inflight: dict[_Key, tuple[Annotated[int, Field(ge=1, lt=1 << 31)], _Count, _Count]] = {}
    dead: dict[_Key, _Count] = {}

    @model_validator(mode="after")
    def _inflight_below_offset(self):
        above = [o for o in self.inflight if int(o) >= self.offset]
        if above:
            raise ValueError(f"offsets {above[:3]} are in flight but not below the queue's next "
                             f"offset {self.offset}")
        loose = [o for o in self.dead if o not in self.inflight]
        if loose:
            raise ValueError(f"offsets {loose[:3]} are being dead-lettered but not in flight")
        return self


class CheckpointDoc(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    version: Literal[1, 2]
    generation: _Count = 0
    delivery: _Count = 0
    rotate: Annotated[int, Field(ge=0, lt=1 << 32)] = 0
    queues: dict[Annotated[str, Field(pattern=r"^(0|[1-9][0-9]{0,9})$")], _QueueDoc] = {}

    @model_validator(mode="after")
    def _rules(self):
        if self.version == 2 and "generation" not in self.model_fields_set:
            raise ValueError("version 2 needs a generation")
        too_big = [q for q in self.queues if int(q) >= 1 << 31]
        if too_big:
            raise ValueError(f"queue ids {too_big[:3]} are beyond 2**31-1")
        return self


def pop_state_path(root: str, topic: str, group: str) -> str:
    """The checkpoint; the journal is beside it (``journal_path``)."""
    return os.path.join(root, POP_DIR, f"{topic}@{group}{SUFFIX}")


def journal_path(root: str, topic: str, group: str) -> str:
    return os.path.join(root, POP_DIR, f"{topic}@{group}{JOURNAL_SUFFIX}")


def parse_checkpoint(path: str, data: bytes) -> tuple["PopState", int]:
    """The state and generation a checkpoint holds, or ``CorruptStateError`` naming the file
    and every rule it breaks (up to five)."""
    try:
        doc = CheckpointDoc.model_validate_json(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'document'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)[:5])
        raise CorruptStateError(f"{path} is not pop state of the expected shape ({problems}); "
                                f"it is left as it is: repair it, or forget the group with "
                                f"delete_consumer_group") from None
    state = PopState()
    state.delivery, state.rotate = doc.delivery, doc.rotate
    for q, entry in doc.queues.items():
        state.next[int(q)] = entry.offset
        if entry.inflight:
            state.inflight[int(q)] = {int(o): v for o, v in entry.inflight.items()}
        for o, log_from in entry.dead.items():
            state.dead[(int(q), int(o))] = log_from
    state.rebuild_heap()
    return state, doc.generation


class PopState:
    """One topic and group's pop state. Not thread-safe: ``pop_journal`` serializes access."""

    __slots__ = ("delivery", "rotate", "next", "inflight", "dead", "_heap", "_live")

    def __init__(self) -> None:
        self.delivery = 0
        self.rotate = 0
        self.next: dict[int, int] = {}
        self.inflight: dict[int, dict[int, tuple[int, int, int]]] = {}
        # (queue, offset) -> the commit log's end before its dead letter was put (DEAD)
        self.dead: dict[tuple[int, int], int] = {}
        self._heap: list[tuple[int, int, int, int]] = []  # (visible_at, queue, offset, delivery)
        self._live = 0

    # -- changes: only through records (NOTE [ Pop journal ]) ------------------------------
    def apply(self, rows: list, rotate: int, delivery: int) -> None:
        """Apply one record's entries (``ENTRY`` rows as tuples)."""
        inflight, heap = self.inflight, self._heap
        for kind, q, o, visible_at, d, attempt, _zero in rows:
            if kind == INFLIGHT:
                table = inflight.get(q)
                if table is None:
                    table = inflight[q] = {}
                if o not in table:
                    self._live += 1
                table[o] = (attempt, visible_at, d)
                heapq.heappush(heap, (visible_at, q, o, d))
            elif kind == DONE:
                table = inflight.get(q)
                now = table.get(o) if table else None
                if now is not None and (d < 0 or now[2] == d):
                    del table[o]
                    self._live -= 1
                    self.dead.pop((q, o), None)
            elif kind == DEAD:
                now = inflight.get(q, {}).get(o)
                if now is not None and now[2] == d:
                    self.dead[(q, o)] = visible_at
            elif kind == NEXT:
                self.next[q] = o
        self.rotate = rotate
        if delivery > self.delivery:
            self.delivery = delivery
        if len(heap) > 2 * self._live + _HEAP_SLACK:
            self.rebuild_heap()  # acknowledged deliveries leave their deadlines behind

    def rebuild_heap(self) -> None:
        self._heap = [(v[1], q, o, v[2]) for q, table in self.inflight.items()
                      for o, v in table.items()]
        heapq.heapify(self._heap)
        self._live = len(self._heap)

    # -- questions ------------------------------------------------------------------------
    def current(self, q: int, o: int, delivery: int) -> bool:
        now = self.inflight.get(q, {}).get(o)
        return now is not None and now[2] == delivery

    def next_delivery(self, now_ms: int) -> int:
        """The next delivery number: above every one handed out, and above the store clock
        shifted left, so numbers stay unique even when the state lost its newest records (a
        damaged journal cut back, a power loss without ``commit_fsync``)."""
        return max(self.delivery + 1, now_ms << DELIVERY_CLOCK_SHIFT)

    def take_due(self, now_ms: int, limit: int) -> list[tuple[int, int, int, int]]:
        """Up to ``limit`` in-flight messages whose time ran out, earliest deadline first, as
        ``(queue, offset, attempt, delivery)``, taken off the heap (``requeue`` puts them back
        when the record that redelivers them is not written)."""
        heap, out = self._heap, []
        while heap and len(out) < limit and heap[0][0] <= now_ms:
            visible_at, q, o, d = heapq.heappop(heap)
            now = self.inflight.get(q, {}).get(o)
            if now is not None and now[2] == d:
                out.append((q, o, now[0], d))
        return out

    def requeue(self, taken: list[tuple[int, int, int, int]]) -> None:
        for q, o, _attempt, d in taken:
            now = self.inflight.get(q, {}).get(o)
            if now is not None and now[2] == d:
                heapq.heappush(self._heap, (now[1], q, o, d))

    def next_due(self) -> int | None:
        """The earliest deadline in flight (store-clock ms), or None."""
        heap = self._heap
        while heap:
            visible_at, q, o, d = heap[0]
            if self.current(q, o, d):
                return visible_at
            heapq.heappop(heap)
        return None

    def consumed_offsets(self) -> dict[int, int]:
        """Each queue's first offset not yet acknowledged."""
        out = {}
        for q, nxt in self.next.items():
            table = self.inflight.get(q)
            out[q] = min(min(table), nxt) if table else nxt
        return out

    def to_doc(self, generation: int) -> dict:
        return {"version": VERSION, "generation": generation, "delivery": self.delivery,
                "rotate": self.rotate,
                "queues": {str(q): {"offset": nxt, "inflight": {
                    str(o): list(v) for o, v in sorted(self.inflight.get(q, {}).items())},
                    **self._dead_doc(q)}
                    for q, nxt in sorted(self.next.items())}}

    def _dead_doc(self, q: int) -> dict:
        dead = {str(o): f for (dq, o), f in sorted(self.dead.items()) if dq == q}
        return {"dead": dead} if dead else {}


def pop_groups(root: str) -> list[tuple[str, str]]:
    """Every ``(topic, group)`` with a pop checkpoint or journal."""
    try:
        names = os.listdir(os.path.join(root, POP_DIR))
    except FileNotFoundError:
        return []
    out = set()
    for name in names:
        for suffix in (SUFFIX, JOURNAL_SUFFIX):
            if name.endswith(suffix):
                topic, sep, group = name[:-len(suffix)].rpartition("@")
                if sep:
                    out.add((topic, group))
    return sorted(out)

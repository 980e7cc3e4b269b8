"""Pop-consumer state: where each queue's pops stand and which messages are in flight.

One locked JSON file per topic and group (NOTE [ Locked JSON files ]),
``<root>/consumer/pop/<topic>@<group>.json``::

    {"version": 1,
     "delivery": 17,            # the last delivery number handed out (receipt handles carry one)
     "rotate": 2,               # the queue the next pop starts with (pops spread over queues)
     "queues": {"0": {"offset": 12,      # next queue offset never popped
                      "inflight": {"10": [attempt, visible_at_ms, delivery], ...}}}}

A message is in flight from its pop until its ack; ``visible_at_ms`` (store clock) is when it
may be delivered again, with ``attempt`` + 1 and a new delivery number. Every pop, ack and
change of invisible time is one read-modify-write of the file, so the state outlives the
process that changed it (a SIGKILL included) and pops from several processes never hand out one
message twice at once. A queue's consumed offset (for lag and retention) is its lowest offset in
flight, or ``offset`` when none is.
"""

from __future__ import annotations

import os

from mqstore.consumer.locked_json import LockedJson

POP_DIR = os.path.join("consumer", "pop")
SUFFIX = ".json"
VERSION = 1


def pop_state_path(root: str, topic: str, group: str) -> str:
    return os.path.join(root, POP_DIR, f"{topic}@{group}{SUFFIX}")


def empty_state() -> dict:
    return {"version": VERSION, "delivery": 0, "rotate": 0, "queues": {}}


def open_state(root: str, topic: str, group: str, *, fsync: bool = False) -> LockedJson:
    return LockedJson(pop_state_path(root, topic, group), empty=empty_state, fsync=fsync)


def consumed_offsets(state: dict) -> dict[int, int]:
    """Each queue's first offset not yet acknowledged."""
    out = {}
    for q, entry in (state.get("queues") or {}).items():
        inflight = entry.get("inflight") or {}
        out[int(q)] = min([int(o) for o in inflight] + [int(entry.get("offset", 0))])
    return out


def pop_groups(root: str) -> list[tuple[str, str]]:
    """Every ``(topic, group)`` with a pop state file."""
    try:
        names = os.listdir(os.path.join(root, POP_DIR))
    except FileNotFoundError:
        return []
    out = []
    for name in names:
        if name.endswith(SUFFIX):
            topic, sep, group = name[:-len(SUFFIX)].rpartition("@")
            if sep:
                out.append((topic, group))
    return sorted(out)

"""Subscriptions registered with the store, so dispatch can pre-compute filter bitmaps.

Only filter types that declare ``contracts.PRECOMPUTES`` (SQL92's) are registered. Entries
written before the ``type`` field existed are SQL92.

Kept in ``<root>/subscriptions.json`` (written atomically); the dispatch worker re-reads the
file when it changes. Each entry records when it was registered: messages stored before that
carry no trustworthy bit for it and are checked against their properties instead.

A damaged file (not UTF-8, not JSON, or not a list of entries) never stops the store: it is
logged with its path and problem (also kept in ``problem``) and read as empty. That is safe
because the bitmaps are only a shortcut: without an entry, pulls check every message's
properties, so they still return exactly the matching messages. What must not happen is losing
the registrations in it without a trace, so the next register/unregister, before writing a new
file, keeps the damaged one as ``subscriptions.json.damaged.<mtime_ns>`` and logs that.
"""

from __future__ import annotations

import json
import logging
import os

from mqstore.format.cq_ext import bloom_positions, subscription_key
from mqstore.storage.durable_file import replace_file

SUBSCRIPTIONS_FILE = "subscriptions.json"
DEFAULT_TYPE = "SQL92"
# registered_at is the store clock's value: an int in ms, though a custom clock may give floats.
_FIELDS = (("group", (str,), "a string"), ("topic", (str,), "a string"),
           ("expression", (str,), "a string"), ("registered_at", (int, float), "a number"))

log = logging.getLogger(__name__)


def read_entries(path: str) -> tuple[list[dict], str | None]:
    """``(entries, None)`` for a good file, ``([], problem)`` for a damaged one."""
    with open(path, "rb") as f:
        raw = f.read()
    try:
        data = json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return [], f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})"
    except json.JSONDecodeError as exc:
        return [], (f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}, column "
                    f"{exc.colno})")
    problem = _check_entries(data)
    if problem:
        return [], f"{path}: {problem}"
    for entry in data:
        entry.setdefault("type", DEFAULT_TYPE)
    return data, None


def _check_entries(data) -> str | None:
    if not isinstance(data, list):
        return f"holds a {type(data).__name__}, not a list of subscriptions"
    for i, entry in enumerate(data):
        if not isinstance(entry, dict):
            return f"entry {i} is a {type(entry).__name__}, not an object"
        for name, kinds, what in _FIELDS:
            value = entry.get(name)
            if not isinstance(value, kinds) or isinstance(value, bool):
                return f"entry {i}: {name!r} is {value!r:.80}, not {what}"
        if not isinstance(entry.get("type", DEFAULT_TYPE), str):
            return f"entry {i}: 'type' is {entry['type']!r:.80}, not a string"
    return None


class Subscriptions:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, SUBSCRIPTIONS_FILE)
        self._stamp = None
        self.entries: list[dict] = []
        self.problem: str | None = None  # why the file on disk is ignored, if it is
        self.reload()

    def reload(self) -> bool:
        """Re-read the file if it changed; True when it did."""
        try:
            st = os.stat(self.path)
            stamp = (st.st_mtime_ns, st.st_size)
        except FileNotFoundError:
            stamp = None
        if stamp == self._stamp:
            return False
        self._stamp = stamp
        try:
            self.entries, self.problem = read_entries(self.path) if stamp else ([], None)
        except FileNotFoundError:  # removed since the stat
            self._stamp, self.entries, self.problem = None, [], None
        else:
            if self.problem is not None:  # logged once per change of the file
                log.error("subscriptions ignored, the file is damaged: %s; pulls filter every "
                          "message exactly until the groups register again", self.problem)
        return True

    def _keep_damaged(self) -> None:
        """Move a damaged file aside before it is replaced, so its registrations can be
        recovered by hand."""
        if self.problem is None or not os.path.exists(self.path):
            return
        aside = f"{self.path}.damaged.{os.stat(self.path).st_mtime_ns}"
        os.replace(self.path, aside)
        log.warning("kept the damaged %s as %s (%s); its registrations are not carried over",
                    self.path, aside, self.problem)
        self.problem = None

    def _save(self) -> None:
        self._keep_damaged()
        replace_file(self.path, json.dumps(self.entries, indent=1, sort_keys=True).encode(),
                     fsync=True)
        self.reload()

    def register(self, group: str, topic: str, expression: str, registered_at: int,
                 expression_type: str = DEFAULT_TYPE) -> None:
        self.entries = [e for e in self.entries if (e["group"], e["topic"]) != (group, topic)]
        self.entries.append({"group": group, "topic": topic, "expression": expression,
                             "type": expression_type, "registered_at": registered_at})
        self._save()

    def unregister(self, group: str, topic: str) -> bool:
        kept = [e for e in self.entries if (e["group"], e["topic"]) != (group, topic)]
        found = len(kept) != len(self.entries)
        self.entries = kept
        self._save()
        return found

    def for_topic(self, topic: str) -> list[dict]:
        return [e for e in self.entries if e["topic"] == topic]

    def lookup(self, group: str, topic: str) -> dict | None:
        for e in self.entries:
            if e["group"] == group and e["topic"] == topic:
                return e
        return None

    @staticmethod
    def positions(entry: dict) -> list[int]:
        return bloom_positions(subscription_key(entry["group"], entry["topic"]))

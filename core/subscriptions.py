"""SQL92 subscriptions registered with the store, so dispatch can pre-compute filter bitmaps.

Kept in ``<root>/subscriptions.json`` (written atomically); the dispatch worker re-reads the
file when it changes. Each entry records when it was registered: messages stored before that
carry no trustworthy bit for it and are checked against their properties instead.
"""

from __future__ import annotations

import json
import os

from mqstore.format.cq_ext import bloom_positions, subscription_key

SUBSCRIPTIONS_FILE = "subscriptions.json"


class Subscriptions:
    def __init__(self, root: str) -> None:
        self.path = os.path.join(root, SUBSCRIPTIONS_FILE)
        self._stamp = None
        self.entries: list[dict] = []
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
        if stamp is None:
            self.entries = []
        else:
            with open(self.path, encoding="utf-8") as f:
                self.entries = json.load(f)
        return True

    def _save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(self.entries, f, indent=1, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        self.reload()

    def register(self, group: str, topic: str, expression: str, registered_at: int) -> None:
        self.entries = [e for e in self.entries if (e["group"], e["topic"]) != (group, topic)]
        self.entries.append({"group": group, "topic": topic, "expression": expression,
                             "registered_at": registered_at})
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

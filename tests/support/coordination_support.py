"""Helpers of the coordination tests: fast settings, callbacks that record, and a node in a
process of its own (``coordination_proc.py``)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading

from mqstore.coordination import CoordinationSettings
from paths import SUPPORT


def fast(endpoints, cluster: str, node: str, **changes) -> CoordinationSettings:
    """TTL 2 s (etcd's minimum under its default election timeout), renewals every 0.2 s."""
    base = CoordinationSettings(endpoints=tuple(endpoints), cluster=cluster, node=node, ttl_s=2,
                                renew_s=0.2, retry_s=0.4, margin_s=0.5)
    return dataclasses.replace(base, **changes)


class Recorder:
    """Callbacks that record (kind, value) in order; ``kinds(k)`` lists one kind's values."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object]] = []
        self.lock = threading.Lock()

    def __call__(self, kind: str):
        def record(value=None):
            with self.lock:
                self.events.append((kind, value))
        return record

    def kinds(self, kind: str) -> list:
        with self.lock:
            return [v for k, v in self.events if k == kind]


class NodeProc:
    """``coordination_proc.py`` run as a child; ``events`` is what it printed so far."""

    def __init__(self, settings: CoordinationSettings, offset: int) -> None:
        args = {**dataclasses.asdict(settings), "offset": offset}
        args["endpoints"] = list(settings.endpoints)
        self.proc = subprocess.Popen(
            [sys.executable, str(SUPPORT / "coordination_proc.py"), json.dumps(args)],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        self.events: list[dict] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.events.append(json.loads(line))

    def of(self, kind: str) -> list[dict]:
        return [e for e in list(self.events) if e["event"] == kind]

"""Helpers shared by the bench_*.py scripts (imported as a sibling module, not from mqstore).

The benchmarks run against whatever ``mqstore`` is importable: the working tree's editable
install, or an older revision exported by ``benchmarks/compare.py``. They therefore use only
the store's public API, and spell the few configuration keys that were renamed in either way.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from mqstore import load_config

# section -> {key as spelled now: key as spelled before}; tried in both directions.
RENAMED_KEYS = {
    "dispatch": {"worker": "mode"},
    "flush": {"policy": "mode"},
}


def _respell(overrides: Mapping[str, Any], old_to_new: bool) -> dict:
    out = {}
    for section, values in overrides.items():
        names = RENAMED_KEYS.get(section, {})
        if old_to_new:
            names = {old: new for new, old in names.items()}
        out[section] = ({names.get(k, k): v for k, v in values.items()}
                        if isinstance(values, Mapping) else values)
    return out


def load_config_compat(overrides: Mapping[str, Any]):
    """``load_config(overrides=...)`` that also accepts the other spelling of a renamed key
    (``dispatch.worker``/``dispatch.mode``, ``flush.policy``/``flush.mode``): the overrides
    as given first, then each respelling; the first error is raised when none loads."""
    try:
        return load_config(overrides=overrides)
    except ValueError as first:  # ConfigError is a ValueError in every revision
        for old_to_new in (False, True):
            alt = _respell(overrides, old_to_new)
            if alt != overrides:
                try:
                    return load_config(overrides=alt)
                except ValueError:
                    pass
        raise first


def emit_json(bench: str, metrics: list[tuple[str, float, str, str]], **extra: Any) -> None:
    """One machine-readable line for benchmarks/compare.py:
    ``BENCH-JSON {"bench": ..., "metrics": [[name, value, unit, "higher"|"lower"], ...]}``
    where the last field says which direction is better."""
    import mqstore
    record = {"bench": bench, "mqstore": mqstore.__file__,
              "metrics": [[n, float(v), u, b] for n, v, u, b in metrics], **extra}
    print("BENCH-JSON " + json.dumps(record), flush=True)


def fill(store, topic: str, count: int, body_bytes: int, chunk: int, queues: int) -> None:
    """``count`` messages of ``body_bytes`` into ``topic``, ``chunk`` a ``put_batch``, the
    chunks spread over queues 0..``queues`` - 1 in turn; returns once they are dispatched."""
    from mqstore import MessageBatch

    body = b"x" * body_bytes
    for i in range(0, count, chunk):
        n = min(chunk, count - i)
        store.put_batch(MessageBatch(topic=topic, bodies=[body] * n,
                                     queue_ids=(i // chunk) % queues))
    store.wait_dispatched(120)


def ha_config(role: str, segment_bytes: int, **server) -> dict:
    """The overrides of a ``mqstore serve`` node of a master-slave pair (the replication
    benchmarks): ``role``, ``segment_bytes`` commit-log segments, heartbeats every 0.5 s,
    metrics on a free port, and ``server`` keys."""
    return {"commit_log": {"segment_bytes": segment_bytes},
            "plugins": {"load_entry_points": False},
            "store": {"role": role, "ha_heartbeat_interval_ms": 500,
                      "ha_housekeeping_interval_ms": 10000},
            "server": {"metrics_listen": "127.0.0.1:0", **server}}

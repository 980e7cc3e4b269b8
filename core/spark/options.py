"""Reader and writer options: parsed once, checked against their rules, errors naming both.

Spark hands options over as strings with lower-cased keys; they are parsed into frozen
dataclasses (picklable: they travel with the reader and writer objects to every worker).
Offsets follow Spark's Kafka source: ``earliest``, ``latest`` or JSON per topic and queue,
``{"orders": {"0": 23, "1": -2}}``, where -2 means earliest and -1 latest.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Mapping

EARLIEST = -2
LATEST = -1
INT32_MAX = (1 << 31) - 1
DEFAULT_MAX_MESSAGES_PER_PARTITION = 1_000_000

_READ = {"path": "path", "topics": "topics", "queue_ids": "queue_ids",
         "startingoffsets": "startingOffsets", "endingoffsets": "endingOffsets",
         "startingtimestamp": "startingTimestamp", "endingtimestamp": "endingTimestamp",
         "expression": "expression", "expressiontype": "expressionType",
         "minpartitions": "minPartitions", "maxmessagesperpartition": "maxMessagesPerPartition",
         "maxmessagespertrigger": "maxMessagesPerTrigger", "verifychecksums": "verifyChecksums",
         "config": "config"}
_BATCH_ONLY = {"endingoffsets", "endingtimestamp"}
_STREAM_ONLY = {"maxmessagespertrigger"}
_WRITE = {"path": "path", "config": "config", "stagingdir": "stagingDir", "sinkid": "sinkId",
          "checkpointlocation": "checkpointLocation"}


class OptionError(ValueError):
    """An option whose value breaks its rule; the message names both."""


@dataclass(frozen=True)
class OffsetSpec:
    """Where reading starts or ends: every queue's earliest or latest offset, or per queue
    (``per_queue[topic][queue_id]``, EARLIEST/LATEST allowed; unnamed queues take ``default``)."""

    default: int  # EARLIEST or LATEST
    per_queue: Mapping[str, Mapping[int, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class ReadOptions:
    paths: tuple[str, ...]
    topics: tuple[str, ...] | None
    queue_ids: frozenset[int] | None
    starting: OffsetSpec
    ending: OffsetSpec
    starting_timestamp: int | None
    ending_timestamp: int | None
    expression: str | None
    expression_type: str
    min_partitions: int | None
    max_messages_per_partition: int
    max_messages_per_trigger: int | None
    verify_checksums: bool
    config: str | None


@dataclass(frozen=True)
class WriteOptions:
    path: str
    config: str | None
    staging_dir: str
    sink_id: str | None  # streaming writes: what the sink ledger is kept under


def _lower(options: Mapping[str, str], allowed: Mapping[str, str], what: str) -> dict:
    opts = {str(k).lower(): v for k, v in options.items()}
    unknown = sorted(set(opts) - set(allowed))
    if unknown:
        raise OptionError(f"unknown {what} option(s) {unknown}; the options are "
                          f"{sorted(allowed.values())}")
    return opts


def parse_read_options(options: Mapping[str, str], *, streaming: bool) -> ReadOptions:
    opts = _lower(options, _READ, "mqstore read")
    misplaced = opts.keys() & (_BATCH_ONLY if streaming else _STREAM_ONLY)
    if misplaced:
        name = _READ[sorted(misplaced)[0]]
        kind = "a streaming" if streaming else "a batch"
        raise OptionError(f"option {name} does not apply to {kind} read")
    for first, second in (("startingoffsets", "startingtimestamp"),
                          ("endingoffsets", "endingtimestamp")):
        if first in opts and second in opts:
            raise OptionError(f"give {_READ[first]} or {_READ[second]}, not both")
    starting = _offsets(opts, "startingoffsets", LATEST if streaming else EARLIEST,
                        forbid=None if streaming else LATEST)
    ending = _offsets(opts, "endingoffsets", LATEST, forbid=EARLIEST)
    expr_type = opts.get("expressiontype", "TAG").upper()
    if expr_type not in ("TAG", "SQL92"):
        raise OptionError(f"option expressionType {opts['expressiontype']!r} must be TAG or "
                          f"SQL92")
    expression = opts.get("expression")
    if expression is not None and not expression.strip():
        raise OptionError("option expression is empty; leave it out to read every message")
    return ReadOptions(
        paths=_paths(opts.get("path")),
        topics=_names(opts, "topics"),
        queue_ids=_queue_ids(opts.get("queue_ids")),
        starting=starting, ending=ending,
        starting_timestamp=_int(opts, "startingtimestamp", 0),
        ending_timestamp=_int(opts, "endingtimestamp", 0),
        expression=expression, expression_type=expr_type,
        min_partitions=_int(opts, "minpartitions", 1),
        max_messages_per_partition=_int(opts, "maxmessagesperpartition", 1)
        or DEFAULT_MAX_MESSAGES_PER_PARTITION,
        max_messages_per_trigger=_int(opts, "maxmessagespertrigger", 1),
        verify_checksums=_bool(opts, "verifychecksums", True),
        config=opts.get("config"),
    )


def parse_write_options(options: Mapping[str, str]) -> WriteOptions:
    opts = _lower(options, _WRITE, "mqstore write")
    paths = _paths(opts.get("path"))
    if len(paths) != 1 or any(c in paths[0] for c in "*?["):
        raise OptionError(f"option path {opts.get('path')!r} must name one store directory "
                          f"to write to (no list, no glob)")
    root = os.path.abspath(paths[0])
    staging = opts.get("stagingdir") or os.path.join(root, "spark-staging")
    sink = opts.get("sinkid")
    if sink is not None and (not sink or not all(c.isalnum() or c in "-_." for c in sink)):
        raise OptionError(f"option sinkId {sink!r} must be a non-empty name of letters, "
                          f"digits, '-', '_' or '.'")
    if sink is None and opts.get("checkpointlocation"):
        sink = _sink_id_of(opts["checkpointlocation"])
    return WriteOptions(path=root, config=opts.get("config"), staging_dir=staging,
                        sink_id=sink)


def _sink_id_of(checkpoint: str) -> str:
    """A streaming sink's identity: its query's checkpoint, which survives restarts."""
    import hashlib
    return "ckpt-" + hashlib.sha256(os.path.abspath(checkpoint).encode()).hexdigest()[:24]


def _paths(value: str | None) -> tuple[str, ...]:
    if value is None or not value.strip():
        raise OptionError("option path is required: a store directory, several separated by "
                          "commas, or a glob")
    parts = tuple(p.strip() for p in value.split(","))
    if not all(parts):
        raise OptionError(f"option path {value!r} has an empty entry between commas")
    return parts


def _names(opts: dict, key: str) -> tuple[str, ...] | None:
    value = opts.get(key)
    if value is None:
        return None
    names = tuple(dict.fromkeys(n.strip() for n in value.split(",")))
    if not all(names):
        raise OptionError(f"option {_READ[key]} {value!r} has an empty name between commas")
    return names


def _queue_ids(value: str | None) -> frozenset[int] | None:
    if value is None:
        return None
    out = set()
    for part in value.split(","):
        part = part.strip()
        if not (part.isascii() and part.isdigit()) or int(part) > INT32_MAX:
            raise OptionError(f"option queue_ids {value!r}: {part!r} is not a queue id "
                              f"(an integer 0..{INT32_MAX})")
        out.add(int(part))
    return frozenset(out)


def _int(opts: dict, key: str, minimum: int) -> int | None:
    value = opts.get(key)
    if value is None:
        return None
    text = value.strip()
    digits = text[1:] if text[:1] == "-" else text
    if not (digits.isascii() and digits.isdigit()) or int(text) < minimum:
        raise OptionError(f"option {_READ.get(key, key)} {value!r} must be an integer "
                          f">= {minimum}")
    return int(text)


def _bool(opts: dict, key: str, default: bool) -> bool:
    value = opts.get(key)
    if value is None:
        return default
    if value.strip().lower() not in ("true", "false"):
        raise OptionError(f"option {_READ[key]} {value!r} must be true or false")
    return value.strip().lower() == "true"


def _offsets(opts: dict, key: str, default: int, forbid: int | None) -> OffsetSpec:
    name = _READ[key]
    value = opts.get(key)
    if value is None:
        return OffsetSpec(default)
    word = value.strip().lower()
    named = {"earliest": EARLIEST, "latest": LATEST}
    if word in named:
        if named[word] == forbid:
            raise OptionError(f"option {name} {value!r} is not allowed here: it would read "
                              f"nothing")
        return OffsetSpec(named[word])
    try:
        data = json.loads(value)
    except ValueError:
        data = None
    if not isinstance(data, dict) or not data:
        raise OptionError(f"option {name} {value!r} must be earliest, latest or JSON per "
                          f"topic and queue such as {{\"orders\": {{\"0\": 23, \"1\": -2}}}}")
    per_queue = {}
    for topic, queues in data.items():
        if not topic or not isinstance(queues, dict) or not queues:
            raise OptionError(f"option {name}: topic {topic!r} must map queue ids to "
                              f"offsets, e.g. {{\"0\": 23}}")
        table = {}
        for q, off in queues.items():
            if not (q.isascii() and q.isdigit()) or int(q) > INT32_MAX:
                raise OptionError(f"option {name}: topic {topic!r} has queue id {q!r}, not an "
                                  f"integer 0..{INT32_MAX}")
            if isinstance(off, bool) or not isinstance(off, int) or off < EARLIEST:
                raise OptionError(f"option {name}: topic {topic!r} queue {q} has offset "
                                  f"{off!r}; an offset is an integer >= 0, or -2 (earliest) "
                                  f"or -1 (latest)")
            if off == forbid:
                raise OptionError(f"option {name}: topic {topic!r} queue {q} has offset "
                                  f"{off}, which is not allowed here (it would read nothing)")
            table[int(q)] = off
        per_queue[topic] = table
    return OffsetSpec(default, per_queue)


__all__ = ["EARLIEST", "LATEST", "OffsetSpec", "OptionError", "ReadOptions", "WriteOptions",
           "parse_read_options", "parse_write_options"]

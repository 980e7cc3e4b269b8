"""Filters a batch read takes over from Spark, applied exactly.

A filter the reader accepts leaves Spark's plan, so the rows must be exactly those Spark would
have kept. Accepted: topic, store and queue id (=, IN; queue ids also <, <=, >, >=), queue
offset ranges, store-timestamp ranges and tags (=, IN, IS NOT NULL), plus IS NOT NULL on
columns that are never null. What each does:

    topic, store, queue_id   which (store, topic, queue) partitions exist at all
    queue_offset             narrows each partition's offset range
    store_timestamp          narrows the range through the time search (store times never go
                             backwards in a queue), and every row served is checked again
    tags                     a TAG expression for the store's filter (tag codes, then the real
                             string), and every row served is compared by string again (or
                             checked for a tag at all, for IS NOT NULL)

Anything else (OR, NOT, LIKE, other columns, values of another type) goes back to Spark.

Spark's plan (``explain()``) keeps only the filters it still applies; the reader logs which it
took, one INFO line per planned read on the ``mqstore.spark.pushdown`` logger, in Spark's
pushdown worker. That logger says INFO itself: Spark's Python worker logging
(``spark.sql.pyspark.worker.logging.enabled``, read back with
``spark.tvf.python_worker_logs()``) collects the workers' records at the root logger's
WARNING otherwise, and the workers run nothing else that logs there.

NOTE [ Pushdown with the conf off ]
Spark 4.3 plans a reader that overrides ``pushFilters`` only when
``spark.sql.python.filterPushdown.enabled`` is true (its default is false); with the conf off
it refuses every query of such a reader (DATA_SOURCE_PUSHDOWN_DISABLED), on the grounds that
the reader might rely on filters it never got. This reader does not: pushdown only narrows
what it reads, and the rows are right with every filter left to Spark. So ``pushFilters`` is
offered through ``PushFilters``, a descriptor whose bound callable reports the base method as
its ``__func__``: that is what Spark's override check compares, so with the conf off the
reader plans like one without pushdown and Spark evaluates every filter; with the conf on,
Spark's pushdown worker calls it as usual. tests/spark/test_pushdown.py runs the same queries
both ways.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, replace

from pyspark.sql.datasource import (
    DataSourceReader, EqualNullSafe, EqualTo, GreaterThan, GreaterThanOrEqual, In, IsNotNull,
    IsNull, LessThan, LessThanOrEqual, Not, StringContains, StringEndsWith, StringStartsWith,
)

from mqstore.spark.schema import NEVER_NULL

log = logging.getLogger(__name__)
log.setLevel(logging.INFO)  # see the module's docstring

_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.timezone.utc)
_US = dt.timedelta(microseconds=1)
_UNBOUNDED = (None, None)


@dataclass(frozen=True)
class Pushed:
    """What the accepted filters allow, ANDed together. None: no limit from filters."""

    topics: frozenset[str] | None = None
    stores: frozenset[str] | None = None
    queue_ids: frozenset[int] | None = None
    queue_id_range: tuple = _UNBOUNDED  # [lo, hi): ints or None
    offset_range: tuple = _UNBOUNDED  # [lo, hi) queue offsets
    time_range: tuple = _UNBOUNDED  # [lo, hi) store time, ms
    tags: frozenset[str] | None = None
    tags_present: bool = False  # tags IS NOT NULL

    def allows_store(self, root: str) -> bool:
        return self.stores is None or root in self.stores

    def allows_topic(self, topic: str) -> bool:
        return self.topics is None or topic in self.topics

    def allows_queue(self, queue_id: int) -> bool:
        lo, hi = self.queue_id_range
        return ((self.queue_ids is None or queue_id in self.queue_ids)
                and (lo is None or queue_id >= lo) and (hi is None or queue_id < hi))

    def tag_expression(self) -> str | None:
        """The TAG expression selecting ``tags``, or None when it cannot be spelled as one (a
        tag holding "||", or blanks at its ends that the expression would trim)."""
        if self.tags is None:
            return None
        if not self.tags or any("||" in t or t != t.strip() or not t for t in self.tags):
            return None
        return " || ".join(sorted(self.tags))


def _meet(a, b, combine):
    return b if a is None else (a if b is None else combine(a, b))


def _narrow(rng: tuple, lo, hi) -> tuple:
    return (_meet(rng[0], lo, max), _meet(rng[1], hi, min))


def _micros(value) -> int | None:
    """A pushed timestamp as microseconds since the epoch; None for anything but an aware
    datetime (a naive one has no instant Spark and the store would agree on)."""
    if not isinstance(value, dt.datetime) or value.tzinfo is None:
        return None
    return (value - _EPOCH) // _US


def _int_value(value) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _bounds(f, value) -> tuple | None:
    """[lo, hi) on an integer scale for a comparison or equality with ``value``."""
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return value, value + 1
    if isinstance(f, GreaterThan):
        return value + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return value, None
    if isinstance(f, LessThan):
        return None, value
    if isinstance(f, LessThanOrEqual):
        return None, value + 1
    return None


def _ms_bounds(f, micros: int) -> tuple | None:
    """A comparison of ``store_timestamp`` (whole milliseconds, as microseconds) with an
    instant in microseconds, as [lo, hi) in milliseconds."""
    floor_ms, ceil_ms = micros // 1000, -(-micros // 1000)
    if isinstance(f, (EqualTo, EqualNullSafe)):
        return (floor_ms, floor_ms + 1) if micros % 1000 == 0 else (0, 0)
    if isinstance(f, GreaterThan):
        return floor_ms + 1, None
    if isinstance(f, GreaterThanOrEqual):
        return ceil_ms, None
    if isinstance(f, LessThan):
        return None, ceil_ms
    if isinstance(f, LessThanOrEqual):
        return None, floor_ms + 1
    return None


def _strings(f) -> frozenset[str] | None:
    values = f.value if isinstance(f, In) else [f.value]
    if not values or not all(isinstance(v, str) for v in values):
        return None
    return frozenset(values)


def accept(pushed: Pushed, f) -> Pushed | None:
    """``pushed`` with filter ``f`` added, or None when ``f`` must stay with Spark."""
    path = getattr(f, "attribute", None)
    if not isinstance(path, tuple) or len(path) != 1:
        return None
    col = path[0]
    if isinstance(f, IsNotNull):
        if col == "tags":
            return replace(pushed, tags_present=True)
        return pushed if col in NEVER_NULL else None
    sets = {"topic": "topics", "store": "stores", "tags": "tags"}
    if col in sets and isinstance(f, (EqualTo, EqualNullSafe, In)):
        values = _strings(f)
        if values is None:
            return None
        name = sets[col]
        return replace(pushed, **{name: _meet(getattr(pushed, name), values, frozenset.__and__)})
    if col == "queue_id" and isinstance(f, In):
        values = [_int_value(v) for v in f.value]
        if not values or None in values:
            return None
        return replace(pushed, queue_ids=_meet(pushed.queue_ids, frozenset(values),
                                               frozenset.__and__))
    if col in ("queue_id", "queue_offset"):
        value = _int_value(getattr(f, "value", None))
        bounds = None if value is None else _bounds(f, value)
        if bounds is None:
            return None
        field = "queue_id_range" if col == "queue_id" else "offset_range"
        return replace(pushed, **{field: _narrow(getattr(pushed, field), *bounds)})
    if col == "store_timestamp":
        micros = _micros(getattr(f, "value", None))
        bounds = None if micros is None else _ms_bounds(f, micros)
        if bounds is None:
            return None
        return replace(pushed, time_range=_narrow(pushed.time_range, *bounds))
    return None


_OPERATORS = {EqualTo: "=", EqualNullSafe: "<=>", GreaterThan: ">", GreaterThanOrEqual: ">=",
              LessThan: "<", LessThanOrEqual: "<="}
_PATTERNS = {StringStartsWith: "{}%", StringEndsWith: "%{}", StringContains: "%{}%"}


def describe(f) -> str:
    """A pushed filter as SQL, e.g. ``queue_offset >= 10`` or ``tags IN ('a', 'b')``."""
    if isinstance(f, Not):
        return f"NOT ({describe(f.child)})"
    col = ".".join(getattr(f, "attribute", ()) or ("?",))
    if type(f) in _OPERATORS:
        return f"{col} {_OPERATORS[type(f)]} {_literal(f.value)}"
    if isinstance(f, In):
        return f"{col} IN ({', '.join(_literal(v) for v in f.value)})"
    if isinstance(f, (IsNull, IsNotNull)):
        return f"{col} IS {'' if isinstance(f, IsNull) else 'NOT '}NULL"
    if type(f) in _PATTERNS:
        return f"{col} LIKE {_literal(_PATTERNS[type(f)].format(f.value))}"
    return repr(f)


def _literal(value) -> str:
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    if isinstance(value, dt.datetime):
        return f"TIMESTAMP '{value.isoformat()}'"
    if isinstance(value, (bytes, bytearray)):
        return f"X'{value.hex().upper()}'"
    return repr(value)


def log_pushdown(paths, taken: list, left: list) -> None:
    """One line: which filters a read of ``paths`` took over, which Spark still applies."""
    log.info("read of %s: pushed to the store: %s; left to Spark: %s", ", ".join(paths),
             ", ".join(map(describe, taken)) or "none", ", ".join(map(describe, left)) or "none")


class PushFilters:
    """``pushFilters`` in the form Spark's override check does not count (see NOTE
    [ Pushdown with the conf off ]); calls ``reader.push_filters``."""

    def __get__(self, reader, owner=None):
        if reader is None:
            return DataSourceReader.pushFilters
        return _BoundPushFilters(reader)


class _BoundPushFilters:
    __slots__ = ("reader",)
    # What Spark reads to decide whether pushFilters is overridden.
    __func__ = staticmethod(DataSourceReader.pushFilters)

    def __init__(self, reader) -> None:
        self.reader = reader

    def __call__(self, filters):
        return self.reader.push_filters(filters)


__all__ = ["PushFilters", "Pushed", "accept", "describe", "log_pushdown"]

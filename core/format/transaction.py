"""RocketMQ's transactional messages in the record format (``TransactionalMessageBridge``,
``TransactionalMessageUtil``, ``EndTransactionProcessor`` of 4.9.8).

A half message is kept in ``RMQ_SYS_TRANS_HALF_TOPIC`` queue 0 with sysflag 0 (the broker
clears the producer's PREPARED bits); ``TRAN_MSG=true``, ``PGROUP``, ``REAL_TOPIC`` and
``REAL_QID`` say what it is and where it goes. A commit writes the real message (sysflag
COMMIT, ``preparedTransactionOffset`` = the half record's commit-log offset, the half's
properties text unchanged) and an op record; a rollback only the op record. An op record is a
message of ``RMQ_SYS_TRANS_OP_HALF_TOPIC`` queue 0, tag ``d``, whose body is the half queue
offset it closes in ASCII decimal (RocketMQ 5 writes several, comma separated). A check-back
re-appends the half, ``TRANSACTION_CHECK_TIMES`` incremented, before the producer is asked.

The broker rebuilds the properties text from a Java ``HashMap`` each time it rewrites a
message, so the order of its names is the map's iteration order; ``java_map_order`` computes
it, which is how mqstore's half records and re-appended halves read byte for byte as 4.9.8's.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping

from mqstore.hashing import java_string_hash

HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
OP_TOPIC = "RMQ_SYS_TRANS_OP_HALF_TOPIC"
CHECK_MAX_TOPIC = "TRANS_CHECK_MAX_TIME_TOPIC"  # where a half checked too often goes
SYSTEM_GROUP = "CID_RMQ_SYS_TRANS"  # whose consumer offsets are the checker's progress
REMOVE_TAG = "d"  # an op record's tag: the half it names is done
REMOVE_TAG_CODE = 100  # java_string_hash("d")

PROPERTY_TRANSACTION_PREPARED = "TRAN_MSG"
PROPERTY_PRODUCER_GROUP = "PGROUP"
PROPERTY_CHECK_TIMES = "TRANSACTION_CHECK_TIMES"
PROPERTY_CHECK_IMMUNITY_S = "CHECK_IMMUNITY_TIME_IN_SECONDS"
PROPERTY_TRANSACTION_ID = "__transactionId__"

SYSFLAG_NOT_TYPE = 0x0
SYSFLAG_PREPARED = 0x4
SYSFLAG_COMMIT = 0x8
SYSFLAG_ROLLBACK = 0xC
SYSFLAG_TX_MASK = 0xC

_INITIAL_CAPACITY = 16  # java.util.HashMap's defaults
_LOAD_FACTOR = 0.75
OP_PROPERTIES_TEXT = "WAIT\x01true\x02TAGS\x01d"  # the op record's, as 4.9.8 stores them


def is_half(props: Mapping[str, str]) -> bool:
    """Whether a producer sent this message as a transaction's half (``TRAN_MSG=true``)."""
    return props.get(PROPERTY_TRANSACTION_PREPARED, "").lower() == "true"


@functools.lru_cache(maxsize=4096)  # the same few names, message after message
def _bucket_hash(name: str) -> int:
    h = java_string_hash(name) & 0xFFFFFFFF
    return h ^ (h >> 16)


def java_map_order(names: Iterable[str]) -> list[str]:
    """The iteration order of a ``java.util.HashMap`` into which ``names`` were put in this
    order (each once; a repeated name keeps its first place): bucket by bucket, a bucket's
    entries in the order they arrived (a resize keeps it). Buckets long enough to become trees
    (8 names of one bucket) do not occur in properties texts and are not modelled."""
    seen: dict[str, None] = dict.fromkeys(names)
    capacity = _INITIAL_CAPACITY
    while len(seen) > capacity * _LOAD_FACTOR:
        capacity *= 2
    mask = capacity - 1
    return sorted(seen, key=lambda name: _bucket_hash(name) & mask)  # stable: arrival order


def java_properties_text(props: Mapping[str, str], order_from: Iterable[str] = ()) -> str:
    """4.9.8's ``messageProperties2String`` of a map built from ``order_from`` (the names of
    the text it was decoded from) and then ``props``' other names: no trailing separator."""
    names = java_map_order([*(n for n in order_from if n in props), *props])
    return "\x02".join(f"{name}\x01{props[name]}" for name in names)


def half_properties(props: Mapping[str, str], real_topic: str, real_queue_id: int
                    ) -> dict[str, str]:
    """A half message's properties: the producer's, plus where it goes once committed."""
    out = dict(props)
    out["REAL_TOPIC"] = real_topic
    out["REAL_QID"] = str(real_queue_id)
    return out


def check_times(props: Mapping[str, str]) -> int:
    """How often the half was checked back (0: never, or a value that is not a count)."""
    text = props.get(PROPERTY_CHECK_TIMES, "")
    return int(text) if text.isdecimal() and text.isascii() and len(text) < 10 else 0


def op_body(half_queue_offsets: Iterable[int]) -> bytes:
    """An op record's body: the half queue offsets it closes."""
    return ",".join(str(int(o)) for o in half_queue_offsets).encode("ascii")


def op_offsets(body: bytes) -> list[int]:
    """The half queue offsets an op record closes; ValueError naming the body that is not a
    list of decimal offsets."""
    out = []
    for token in bytes(body).split(b","):
        token = token.strip()
        if not token.isdigit() or len(token) > 19:
            raise ValueError(f"op record body {bytes(body)[:64]!r} is not a list of half "
                             f"queue offsets (decimal, comma separated)")
        out.append(int(token))
    return out

"""``config/delayOffset.json``: RocketMQ's schedule progress, as its broker writes it.

    {
    	"offsetTable":{1:10,3:13
    	}
    }

``offsetTable`` maps a delay level (1..) to the next offset of its queue in
``SCHEDULE_TOPIC_XXXX`` (queue ``level - 1``) the schedule will deliver; a level that has
delivered nothing has no entry. The text is fastjson's pretty format (tabs, integer keys
unquoted), which RocketMQ 4.x and 5.x read, and every key they write (5.x's ``dataVersion``) is
kept as it is.

mqstore adds one key, ``mqstoreCountedBelow``: every copy the schedule delivered that lies
below this commit-log offset is counted in ``offsetTable``, so a restart looks for uncounted
copies only from there on (NOTE [ Exactly-once delivery ] in ``runtime.schedule``). fastjson
ignores a key its class lacks, so RocketMQ reads the file unchanged; a file without the key (a
RocketMQ broker's) is trusted as it is, as RocketMQ trusts it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from mqstore.format import remoting_json

TABLE = "offsetTable"
COUNTED_BELOW = "mqstoreCountedBelow"
MAX_LEVEL = 1 << 16  # far more levels than anyone configures: a larger key is damage
INT64_MAX = (1 << 63) - 1


@dataclass
class DelayOffsets:
    """``table``: level -> next queue offset; ``counted_below``: mqstore's bound (None when
    the file has none); ``extra``: the other keys, kept as they were."""

    table: dict[int, int] = field(default_factory=dict)
    counted_below: int | None = None
    extra: dict = field(default_factory=dict)


def decode(text: str) -> DelayOffsets:
    """The document of ``text``; ValueError naming what is wrong (not fastjson's JSON, no
    ``offsetTable``, a level or offset that is not a non-negative int)."""
    doc = remoting_json.loads(text)
    if not isinstance(doc, dict) or not isinstance(doc.get(TABLE), dict):
        raise ValueError(f"delay offsets: expected an object with an {TABLE!r} object, got "
                         f"{text[:80]!r}")
    table: dict[int, int] = {}
    for key, offset in doc[TABLE].items():
        level = _int(key)
        if level is None or not 1 <= level <= MAX_LEVEL:
            raise ValueError(f"delay offsets: level {key!r} must be an integer 1..{MAX_LEVEL}")
        if isinstance(offset, bool) or not isinstance(offset, int) or not 0 <= offset <= INT64_MAX:
            raise ValueError(f"delay offsets: level {level} offset {offset!r} must be an "
                             f"integer >= 0")
        table[level] = offset
    counted = doc.get(COUNTED_BELOW)
    if counted is not None and (isinstance(counted, bool) or not isinstance(counted, int)
                                or counted < 0):
        raise ValueError(f"delay offsets: {COUNTED_BELOW} {counted!r} must be an integer >= 0")
    extra = {k: v for k, v in doc.items() if k not in (TABLE, COUNTED_BELOW)}
    return DelayOffsets(table, counted, extra)


def _int(key) -> int | None:
    if isinstance(key, int) and not isinstance(key, bool):
        return key
    if isinstance(key, str) and key.isdecimal() and key.isascii():
        return int(key)
    return None


def encode(doc: DelayOffsets) -> str:
    """fastjson's pretty text of ``doc``: keys sorted as fastjson sorts a bean's fields,
    levels in increasing order, each on the table's one line."""
    fields = dict(doc.extra)
    if doc.counted_below is not None:
        fields[COUNTED_BELOW] = int(doc.counted_below)
    fields[TABLE] = None  # placeholder, written below
    lines = []
    for name in sorted(fields):
        if name == TABLE:
            entries = ",".join(f"{level}:{int(doc.table[level])}" for level in sorted(doc.table))
            lines.append(f'\t"{TABLE}":{{{entries}\n\t}}' if entries else f'\t"{TABLE}":{{}}')
        else:
            lines.append(f"\t{remoting_json.dumps(name)}:{remoting_json.dumps(fields[name])}")
    return "{\n" + ",\n".join(lines) + "\n}"

"""Queue offset floors: a queue's offsets go on after the highest one it ever gave out.

NOTE [ Offset floors ]
Recovery rebuilds consume queues from the commit log, and a put takes the next offset after
the queue's last unit. When the newest records of a queue are gone (the newest segment
deleted, cut short or zeroed, bit rot at the tail quarantined, ``check --fix`` rebuilding from
a log that lost them), the log alone would end the queue below offsets it gave out and
acknowledged, and new messages would take them again: a consumer that committed past them
skips the new messages, and ``get`` at an acknowledged offset serves another message.

So every durable record of how far a queue went is a floor the open restores:

- the queue manifest (``storage.queue_manifest``): each queue's end when it was last written
  (at every clean stop; its entries never go down);
- the clean-shutdown marker (``storage.clean_marker``), trusted or not: each queue's end at
  the last clean close (the open removed the file, and read it first);
- the consume queue itself: its valid units before recovery cut the units of records that
  are gone (``recovery.recover``);
- committed consumer offsets (``consumer.offsets``): a group commits the offset after the
  last message it read. A commit may name any offset (a group may seek past the end), so it
  counts only up to what the bytes the log lost could have held: the queue's end by the other
  records, plus one message per MIN_RECORD_BYTES lost.

The open settles the floors into the manifest (durably, before recovery cuts a unit, and
before dispatch starts); the writer of the consume queues, once it has dispatched every
record the log held at the open, gives each queue filler units up to its floor
(``ConsumeQueue.hold_offsets``), as dispatch already does for the offsets of quarantined
records in between. The report lists the offsets the open found without a message
(``RecoveryReport.queue_offsets_lost``). A store without a single commit-log segment starts
over (spec behaviour 57): no floor, and the manifest is emptied.
"""

from __future__ import annotations

from mqstore.consumer.offsets import ConsumerOffsets
from mqstore.dispatch.loop import DispatchLoop, TagsCoder
from mqstore.errors import CorruptRecordError
from mqstore.format.record_columns import MIN_RECORD_BYTES

Key = tuple[str, int]


def recorded(entries: dict, marker: dict | None, durable: int) -> dict[Key, int]:
    """Each queue's end by the queue manifest's ``entries`` (``read_entries``) and a
    clean-shutdown marker's, where the record of its last unit ended at or below
    ``durable`` (``recovery.durable_end``): past it lies a torn tail, whose put was never
    acknowledged (and whose offsets are given out again)."""
    floors: dict[Key, int] = {}

    def note(key: Key, end: int, phys: int) -> None:
        if phys <= durable:  # -1: no record stands for the end (fillers hold it)
            floors[key] = max(floors.get(key, 0), end)

    for key, (_first, end, phys) in entries.items():
        note(key, end, phys)
    for name, (end, phys, _files) in ((marker or {}).get("queues") or {}).items():
        topic, _, queue_id = name.rpartition("/")
        if topic and queue_id.isdigit():
            note((topic, int(queue_id)), end, phys)  # decoded: ints
    return floors


def lost_bytes(report, checkpoint, marker: dict | None) -> int:
    """Commit-log bytes the open found gone: below the end the checkpoint or a clean close
    recorded and past where the log now ends, and quarantined."""
    recorded_end = max(checkpoint.confirm_phy_offset, checkpoint.appended_offset,
                       marker["end"] if marker is not None else 0)  # decoded: an int
    gone = max(0, recorded_end - report.commit_log_end)
    return gone + sum(q.length for q in report.quarantined)


def claimed(root: str) -> tuple[dict[Key, int], str | None]:
    """The highest committed offset of any group in each queue, and a problem (None if
    fine): the offsets are evidence, not required, so a file that cannot be read is noted."""
    try:
        table = ConsumerOffsets(root).table()
    except Exception as exc:  # any damage: the open goes on without this evidence
        return {}, (f"committed consumer offsets not read as evidence of queue ends "
                    f"({type(exc).__name__}: {exc})")
    claims: dict[Key, int] = {}
    for (topic, _group), offsets in table.items():
        for queue_id, offset in offsets.items():
            if queue_id >= 0 and offset > 0:
                key = (topic, queue_id)
                claims[key] = max(claims.get(key, 0), offset)
    return claims, None


def add_claims(floors: dict[Key, int], claims: dict[Key, int], held: dict[Key, int],
               lost: int) -> list[str]:
    """Raise ``floors`` by committed offsets, each up to the queue's end by the other records
    (``floors``; ``held``: what the queues hold and what the log gives them back) plus
    what ``lost`` bytes could have held; returns notes on the offsets cut to that."""
    most = lost // MIN_RECORD_BYTES
    notes = []
    for key, offset in sorted(claims.items()):
        base = max(floors.get(key, 0), held.get(key, 0))
        if offset <= base:
            continue
        if offset > base + most:
            notes.append(f"queue {key[0]}/{key[1]}: a group committed offset {offset}, past "
                         f"its end {base} by more than {lost} lost commit-log bytes could "
                         f"hold; its offsets go on from {base + most}")
        floors[key] = min(offset, base + most)
    return notes


class _Ends:
    """A dispatcher that only notes each queue's highest offset."""

    def __init__(self) -> None:
        self.ends: dict[Key, int] = {}

    def dispatch(self, batch) -> None:
        ends = self.ends
        for key, offset in zip(zip(batch.topics, batch.queue_ids.tolist()),
                               batch.queue_offsets.tolist()):
            if ends.get(key, 0) <= offset:
                ends[key] = offset + 1


def queue_ends(commit_log, begin: int, end: int) -> dict[Key, int]:
    """Each queue's end by its records in ``[begin, end)``, read as dispatch reads them
    (recovery mended the range); what it read before damage stops it, if any does."""
    ends = _Ends()
    loop = DispatchLoop(commit_log, ends, TagsCoder(lambda _tags: 0, ()), lambda: end,
                        max(begin, commit_log.min_offset))
    try:
        loop.run_until(end)
    except CorruptRecordError:
        pass
    return ends.ends

"""``Appender.put_copies``: records prepared whole (``append.delays.copy_of``), written as
one put under the put lock, one block per commit-log segment they occupy."""

from __future__ import annotations

import numpy as np

from mqstore.append import encoding
from mqstore.append.placement import Refused, blocks_of, queue_keys, rank_within_group


class Copies:
    """``put_copies``: records prepared whole (``Prepared``), one block per segment."""

    @staticmethod
    def append(app: Appender, items: list) -> tuple[int, tuple]:
        """The last record's end, and ``(queue ids, queue offsets, commit-log offsets, sizes,
        store time)``, each array one entry per item."""
        if len(items) == 1:
            return Copies.append_one(app, items[0])
        sizes = np.fromiter((p.size for p in items), dtype=np.int64, count=len(items))
        qids = np.fromiter((p.queue_id for p in items), dtype=np.int64, count=len(items))
        for size in sizes.tolist():
            if size > app._limit:
                raise Refused(f"a record of {size} bytes does not fit a commit-log segment")
        ends = np.cumsum(sizes)
        blocks = blocks_of(ends, app._limit)
        keys, inverse = queue_keys([p.topic for p in items], qids)
        counts = np.bincount(inverse, minlength=len(keys))
        phys = np.empty(len(items), dtype=np.int64)
        qoffs = np.empty(len(items), dtype=np.int64)
        crc = app.put_ctx.record_crc

        def encode(_app, _plan, segs, bases, now):
            qoffs[:] = np.asarray(bases, dtype=np.int64)[inverse] + rank_within_group(
                inverse, len(keys))
            records = []
            for (start, stop), seg in zip(blocks, segs):
                pos = seg.start + seg.wrote
                parts = []
                for i in range(start, stop):
                    p = items[i]
                    phys[i] = pos
                    parts.append(encoding.encode_single(p, app.store_host, p.queue_id,
                                                        int(qoffs[i]), pos, now, crc))
                    pos += p.size
                records.append(b"".join(parts))
            return records, int(phys[0])

        block_bytes = [int(ends[stop - 1] - (ends[start - 1] if start else 0))
                       for start, stop in blocks]
        _bases, _first, now = app._append(block_bytes, keys, counts.tolist(), len(items),
                                          encode)
        return int(phys[-1] + sizes[-1]), (qids, qoffs, phys, sizes, now)

    @staticmethod
    def append_one(app: Appender, p) -> tuple[int, tuple]:
        """``append`` for one record: what the columns of a batch would say of it, without
        them (on one record numpy's fixed costs are most of a put's)."""
        if p.size > app._limit:
            raise Refused(f"a record of {p.size} bytes does not fit a commit-log segment")
        crc = app.put_ctx.record_crc

        def encode(_app, _plan, segs, bases, now):
            seg = segs[0]
            pos = seg.start + seg.wrote
            return [encoding.encode_single(p, app.store_host, p.queue_id, bases[0], pos, now,
                                           crc)], pos

        bases, phys, now = app._append([p.size], [(p.topic, p.queue_id)], _ONE, 1, encode)
        return phys + p.size, (np.array([p.queue_id], dtype=np.int64),
                               np.array([bases[0]], dtype=np.int64),
                               np.array([phys], dtype=np.int64),
                               np.array([p.size], dtype=np.int64), now)


_ONE = [1]  # one record's count for its queue (read, never changed)

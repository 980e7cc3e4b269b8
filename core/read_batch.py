"""What ``MessageStore.read`` returns: a queue's messages as columns.

Every column is a numpy array with one row per message, in queue order; the bodies are one
buffer with n + 1 int32 offsets starting at 0: the data and offsets buffers of an Arrow binary
array, as they are. The full message of a row is decoded when it is asked for.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mqstore.message import GetStatus, StoredMessage

_EMPTY64 = np.empty(0, dtype=np.int64)
_EMPTY32 = np.empty(0, dtype=np.int32)


@dataclass(eq=False)
class ReadBatch:
    """Up to ``max_msgs`` messages of one queue, with ``get``'s status and next offset."""

    status: GetStatus
    next_begin_offset: int
    min_offset: int
    max_offset: int
    queue_offsets: np.ndarray = field(default_factory=lambda: _EMPTY64)
    phys_offsets: np.ndarray = field(default_factory=lambda: _EMPTY64)
    sizes: np.ndarray = field(default_factory=lambda: _EMPTY32)
    store_timestamps: np.ndarray = field(default_factory=lambda: _EMPTY64)
    born_timestamps: np.ndarray = field(default_factory=lambda: _EMPTY64)
    tags_codes: np.ndarray = field(default_factory=lambda: _EMPTY64)
    flags: np.ndarray = field(default_factory=lambda: _EMPTY32)
    sys_flags: np.ndarray = field(default_factory=lambda: _EMPTY32)
    reconsume_times: np.ndarray = field(default_factory=lambda: _EMPTY32)
    body_crcs: np.ndarray = field(default_factory=lambda: _EMPTY32)
    bodies: bytes = b""
    body_offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int32))
    filtered_count: int = 0
    # Queue offsets passed over because what they point at cannot be served (as in GetResult).
    corrupt: list = field(default_factory=list)
    suggest_pulling_from_slave: bool = False
    _message_at: object = field(default=None, repr=False)

    def __len__(self) -> int:
        return len(self.queue_offsets)

    def body(self, i: int) -> bytes:
        o = self.body_offsets
        return self.bodies[o[i]:o[i + 1]]

    def message(self, i: int) -> StoredMessage:
        """Row ``i`` as a full message (every stored field), decoded now."""
        if not -len(self) <= i < len(self):
            raise IndexError(f"row {i} of a batch of {len(self)}")
        msg = self._message_at(int(self.phys_offsets[i]))
        if msg is None:
            raise LookupError(f"the record of row {i} (commit-log offset "
                              f"{int(self.phys_offsets[i])}) was removed since the read")
        return msg

    def __iter__(self):
        return (self.message(i) for i in range(len(self)))

    def __getitem__(self, i: int) -> StoredMessage:
        return self.message(i)

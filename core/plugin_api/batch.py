"""What dispatch hands every dispatcher: a batch of commit-log records as columns."""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from typing import Sequence

import numpy as np


@dataclass(frozen=True)
class DispatchBatch:
    """Records ``[begin, end)`` of the commit log, one column per field, in log order."""

    begin: int
    end: int
    phys_offsets: np.ndarray  # int64
    sizes: np.ndarray  # int32
    queue_ids: np.ndarray  # int32
    queue_offsets: np.ndarray  # int64
    tags_codes: np.ndarray  # int64
    store_timestamps: np.ndarray  # int64
    sysflags: np.ndarray  # int32
    topics: Sequence[str]
    properties: Sequence[bytes]  # encoded properties strings

    def __len__(self) -> int:
        return len(self.phys_offsets)

    @classmethod
    def concat(cls, begin: int, end: int, parts: list[dict]) -> "DispatchBatch":
        def col(name: str, dtype: type) -> np.ndarray:
            arrays = [p[name] for p in parts]
            return (arrays[0] if len(arrays) == 1 else np.concatenate(arrays)).astype(
                dtype, copy=False)

        def joined(name: str) -> list:  # one part per segment touched: usually just one
            return parts[0][name] if len(parts) == 1 else list(
                chain.from_iterable(p[name] for p in parts))
        return cls(
            begin, end, col("phys_offset", np.int64), col("size", np.int32),
            col("queue_id", np.int32), col("queue_offset", np.int64), col("tags_code", np.int64),
            col("store_timestamp", np.int64), col("sysflag", np.int32),
            joined("topics"), joined("properties"),
        )


__all__ = ["DispatchBatch"]

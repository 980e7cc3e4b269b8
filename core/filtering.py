"""Subscription filters: the contract filter plugins implement.

A filter factory compiles an expression once; ``store.get`` then asks the compiled filter two
questions, cheapest first:

- ``match_units(tags_codes)``: a boolean mask over a whole window of consume-queue tag codes
  (numpy), or ``None`` when every unit passes. Must never reject a message that matches.
- ``match_message(message)``: the exact answer for one candidate, read from the commit log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from mqstore.message import StoredMessage


class CompiledFilter(Protocol):
    def match_units(self, tags_codes: np.ndarray) -> np.ndarray | None: ...

    def match_message(self, message: "StoredMessage") -> bool: ...


class MatchAll:
    """The filter of a pull without a subscription."""

    def match_units(self, tags_codes: np.ndarray) -> None:
        return None

    def match_message(self, message: "StoredMessage") -> bool:
        return True


MATCH_ALL = MatchAll()

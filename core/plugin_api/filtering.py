"""Compiled subscription filters (``contracts.Filter``): the match-all filter and the cache
of compiled expressions."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Callable

import numpy as np

from mqstore.plugin_api.contracts import CapabilityError, check_capabilities
from mqstore.errors import PluginError

if TYPE_CHECKING:
    from mqstore.message import StoredMessage
    from mqstore.plugin_api.contracts import Filter
    from mqstore.plugin_api.registry import Registry

FILTER_CACHE_SIZE = 100


class MatchAll:
    """The filter of a pull without a subscription."""

    def match_units(self, tags_codes: np.ndarray) -> None:
        return None

    def match_message(self, message: "StoredMessage") -> bool:
        return True


MATCH_ALL = MatchAll()


class FilterCache:
    """The last FILTER_CACHE_SIZE compiled expressions, by (type, expression). Thread-safe:
    an expression may be compiled on one thread (the gRPC endpoint compiles off its event
    loop) while others look theirs up; it is compiled outside the lock."""

    def __init__(self, factories: Registry, string_hash: Callable[[str], int]) -> None:
        self.factories = factories  # the filters Registry
        self.string_hash = string_hash
        self._cache: OrderedDict = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, expression: str | None, expression_type: str) -> Filter:
        if not isinstance(expression_type, str):
            raise ValueError(f"expression_type {expression_type!r} must be a string naming a "
                             f"filter type (e.g. 'TAG', 'SQL92')")
        if expression is not None and not isinstance(expression, str):
            raise ValueError(f"expression {expression!r} must be a string")
        key = (expression_type.upper(), expression)
        with self._lock:
            flt = self._cache.get(key)
            if flt is not None:
                self._cache.move_to_end(key)
                return flt
        flt = self.factories.get(expression_type)(expression, self.string_hash)
        try:
            check_capabilities(flt, f"filter {expression_type!r}")
        except CapabilityError as exc:
            raise PluginError(str(exc)) from None
        with self._lock:
            self._cache[key] = flt
            if len(self._cache) > FILTER_CACHE_SIZE:
                self._cache.popitem(last=False)
        return flt

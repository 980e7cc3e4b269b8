"""A third-party mqstore plugin: a ``REGEX`` filter on one property value, and a put counter.

``store.get(..., expression="color=^r", expression_type="REGEX")`` returns the messages whose
``color`` property matches the pattern (``re.search``). The filter has no tag-code shortcut, so
``match_units`` passes every unit and ``match_message`` decides.
"""

from __future__ import annotations

import re

from mqstore import hookimpl

#: ``after_append`` totals for this process: hook calls, and messages those calls covered.
CALLS = {"calls": 0, "messages": 0}


class PropertyRegexFilter:
    def __init__(self, expression: str, string_hash) -> None:
        name, sep, pattern = expression.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"REGEX expression {expression!r} must look like NAME=PATTERN")
        self.name = name.strip()
        self.pattern = re.compile(pattern)

    def match_units(self, tags_codes) -> None:
        return None

    def match_message(self, message) -> bool:
        value = message.properties.get(self.name)
        return value is not None and self.pattern.search(value) is not None


@hookimpl
def register_filters(registry):
    registry.add("REGEX", PropertyRegexFilter)


@hookimpl
def after_append(result):
    CALLS["calls"] += 1
    CALLS["messages"] += len(result)

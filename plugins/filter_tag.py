"""Tag filter (``expression_type="TAG"``): ``TagA || TagB`` subscriptions.

Parsing follows RocketMQ's FilterAPI: ``None``, ``""`` or ``"*"`` match everything; otherwise
the expression is split on ``||``, each tag trimmed and empty ones dropped. A window of units is
pre-filtered by comparing the low 32 bits of each tags code with the tag hashes (numpy), then
each candidate's real TAGS string is compared, so colliding tags (``Aa``/``BB``) never leak.
"""

from __future__ import annotations

import numpy as np

from mqstore.plugin_api import MATCH_ALL, hookimpl

SUB_ALL = "*"


class TagFilter:
    def __init__(self, expression: str, string_hash) -> None:
        self.tags = frozenset(t.strip() for t in expression.split("||") if t.strip())
        self.codes = np.array(sorted({string_hash(t) for t in self.tags}), dtype=np.int32)

    def match_units(self, tags_codes: np.ndarray) -> np.ndarray:
        return np.isin(tags_codes.astype(np.int32), self.codes)

    def match_message(self, message) -> bool:
        return message.tags in self.tags


def compile_tag_filter(expression: str | None, string_hash):
    if expression is None or expression == SUB_ALL or expression == "":
        return MATCH_ALL
    return TagFilter(expression, string_hash)


@hookimpl(trylast=True)
def register_filters(registry):
    registry.add("TAG", compile_tag_filter)

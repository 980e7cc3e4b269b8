"""SQL92 property filter (``expression_type="SQL92"``): RocketMQ's message selector.

The expression is compiled once by :mod:`mqstore.plugins.sql92` (which also caches the last
100 expressions, failures included) and evaluated against each candidate's property map.
Properties are not in the consume queue, so ``match_units`` returns None and every unit is read.
A bad expression raises :class:`mqstore.plugins.sql92.FilterSyntaxError` from ``store.get``.
"""

from __future__ import annotations

from mqstore.plugin_api import hookimpl
from mqstore.plugins.sql92 import FilterSyntaxError, Sql92Expression, compile_expression

__all__ = ["compile_sql92", "register_filters", "FilterSyntaxError", "Sql92Expression"]


def compile_sql92(expression: str, string_hash=None) -> Sql92Expression:
    """Filter factory: the compiled expression is itself a compiled filter."""
    return compile_expression(expression)


@hookimpl(trylast=True)
def register_filters(registry):
    registry.add("SQL92", compile_sql92)

"""Work is bounded on hostile input: SQL92 chains and sizes, index-file chains, a garbled
subscriptions file. Deep but legal input works; beyond a limit it is refused with an error
naming the rule and the limit; nothing is ever a silent non-match or an endless walk. Time
bounds count this thread's CPU time (``time.thread_time``): a loaded machine stretches the wall
clock, not the work."""

from __future__ import annotations

import json
import logging
import struct
import sys
import time

import pytest

from mqstore import Message
from mqstore.format import index_layout as L
from mqstore.plugins import sql92
from mqstore.plugins.sql92 import (
    MAX_EXPRESSION_CHARS, MAX_NESTING_DEPTH, MAX_PARENTHESES_DEPTH, EvaluationError,
    FilterLimitError, FilterSyntaxError, compile_expression, compile_uncached, parse_double, parse_int,
)
from mqstore.storage.index_file import IndexFile
from mqstore.view.subscriptions import SUBSCRIPTIONS_FILE, Subscriptions

SQL92_PLUGIN = {"plugins": {"modules": ["mqstore.plugins.filter_sql92"]}}
LONG_MAX = (1 << 63) - 1
S = 1_795_324_267_531


@pytest.fixture(autouse=True)
def fresh_cache():
    sql92.clear_cache()
    yield
    sql92.clear_cache()


def alternating(levels: int) -> str:
    """``((a0 = '1' OR x) AND y) OR ...``: AND and OR alternate, so nothing flattens and the
    expression nests ``levels`` logic operators deep (plus the comparisons at the leaves)."""
    expr = "a0 = '1'"
    for i in range(levels):
        expr = f"({expr}) {'AND' if i % 2 == 0 else 'OR'} a{i % 3} = '{i % 2}'"
    return expr


def limit_error(expression: str) -> FilterLimitError:
    with pytest.raises(FilterLimitError) as info:
        compile_uncached(expression)
    return info.value


# -- SQL92: long chains work ---------------------------------------------------------------

def test_long_and_or_chains_evaluate_correctly():
    props = {f"a{i}": str(i) for i in range(10)}
    every = " AND ".join(f"a{i % 10} = '{i % 10}'" for i in range(1000))
    assert compile_expression(every).matches(props) is True
    assert compile_expression(every + " AND a3 = 'x'").matches(props) is False
    assert compile_expression(every + " AND missing = 'x'").evaluate(props) is None
    some = " OR ".join(f"a{i % 10} = 'no'" for i in range(1000))
    assert compile_expression(some).matches(props) is False
    assert compile_expression(some + " OR a7 = '7'").matches(props) is True
    assert compile_expression(some + " OR missing = 'x'").evaluate(props) is None
    ten_thousand = " AND ".join(["a1 = '1'"] * 9_999 + ["a2 = '2' OR a3 = 'x'"])
    assert compile_expression(ten_thousand).matches(props) is True
    assert compile_expression(ten_thousand).evaluate_many([props, {}]) == [True, False]


def test_parenthesised_chains_flatten_from_either_side():
    props = {"a": "1", "b": "2"}
    right = "(a = '1' AND " * 1000 + "b = '2'" + ")" * 1000
    left = "(" * 1000 + "a = '1'" + "".join(" AND b = '2')" for _ in range(1000))
    for expr in (right, left, right.replace("AND", "OR"), left.replace("AND", "OR")):
        assert compile_uncached(expr).evaluate(props) is True
    assert compile_uncached(right.replace("b = '2'", "b = '3'")).evaluate(props) is False


def test_parentheses_nested_too_deep_are_refused_before_the_parse():
    deepest = "(" * MAX_PARENTHESES_DEPTH + "a = '1'" + ")" * MAX_PARENTHESES_DEPTH
    assert compile_uncached(deepest).evaluate({"a": "1"}) is True
    # A hundred thousand of them are refused at the first one too deep, not parsed (which
    # takes seconds): the limit names itself and where.
    err = limit_error("(" * 100_000 + "a = '1'" + ")" * 100_000)
    assert (err.rule, err.limit, err.column) == ("parenthesis depth", MAX_PARENTHESES_DEPTH,
                                                 MAX_PARENTHESES_DEPTH + 1)
    # Inside strings and comments they are text, not nesting.
    quoted = "a IN ('" + "(" * 2000 + "') -- " + "(" * 2000 + "\n"
    assert compile_uncached(quoted).evaluate({"a": "(" * 2000}) is True


def test_chain_short_circuits_left_to_right_as_nested_pairs_do():
    # The conversion error on the right is never reached once the left side decides.
    assert compile_uncached("a = '1' OR a > 5 OR b = 'x'").evaluate({"a": "1"}) is True
    assert compile_uncached("a = '2' AND a > 5 AND b = 'x'").evaluate({"a": "1"}) is False
    with pytest.raises(EvaluationError):
        compile_uncached("b IS NULL AND a > 5 AND a = '1'").evaluate({"a": "x"})
    assert compile_uncached("b = '1' AND a = '1' AND c = '1'").evaluate({"a": "1"}) is None
    assert compile_uncached("b = '1' AND a = '2' AND c = '1'").evaluate({"a": "1"}) is False


@pytest.mark.parametrize("n", [999, 1000, 1001, 20_000])
def test_runs_of_not_fold(n):
    props = {"a": "1"}
    want = n % 2 == 0
    assert compile_uncached("NOT " * n + "(a = '1')").evaluate(props) is want
    assert compile_uncached("NOT " * n + "(a = '2')").evaluate(props) is (not want)
    assert compile_uncached("NOT " * n + "(b = '1')").evaluate(props) is None
    assert compile_uncached("NOT " * n + "TRUE").evaluate(props) is want


def test_runs_of_unary_minus_work_to_the_limit_then_are_refused():
    n = MAX_NESTING_DEPTH - 2  # the comparison and its other operand take the rest
    assert compile_uncached("- " * n + "5 = 5").evaluate({}) is True
    assert compile_uncached("- " * (n - 1) + "5.5 = -5.5").evaluate({}) is True
    assert compile_uncached("(" + "- " * n + "'x') IS NULL").evaluate({}) is True
    assert limit_error("- " * 1000 + "5 = 5").rule == "nesting depth"


def test_deepest_allowed_nesting_evaluates_within_a_small_stack():
    levels = MAX_NESTING_DEPTH - 2  # the leaves add a comparison and a property
    expr = compile_uncached(alternating(levels))
    props = {"a0": "1", "a1": "1", "a2": "0"}
    want = expr.evaluate(props)

    def depth():
        frame, n = sys._getframe(), 0
        while frame is not None:
            frame, n = frame.f_back, n + 1
        return n

    old = sys.getrecursionlimit()
    sys.setrecursionlimit(depth() + MAX_NESTING_DEPTH + 20)
    try:
        assert expr.evaluate(props) is want
        assert expr.matches(props) is (want is True)
    finally:
        sys.setrecursionlimit(old)


# -- SQL92: limits refuse clearly, at compile time ----------------------------------------

def test_nesting_beyond_the_limit_is_refused_naming_rule_and_limit():
    compile_uncached(alternating(MAX_NESTING_DEPTH - 2))
    err = limit_error(alternating(MAX_NESTING_DEPTH))
    assert isinstance(err, ValueError) and isinstance(err, FilterSyntaxError)
    assert (err.rule, err.limit) == ("nesting depth", MAX_NESTING_DEPTH)
    assert f"nesting depth limit of {MAX_NESTING_DEPTH}" in str(err)
    assert err.line == 1 and err.column is not None
    err = limit_error("a" + " = a" * 1000)  # comparisons do not chain: (a = a) = a ...
    assert err.rule == "nesting depth"


def test_expression_length_is_limited_before_any_work():
    huge = "a = '" + "x" * 10_000_000 + "'"
    start = time.thread_time()
    for compile_ in (compile_uncached, compile_expression, compile_expression):
        with pytest.raises(FilterLimitError) as info:
            compile_(huge)
    assert time.thread_time() - start < 1
    err = info.value
    assert (err.rule, err.limit) == ("expression length", MAX_EXPRESSION_CHARS)
    assert "10000006 characters long" in str(err) and str(MAX_EXPRESSION_CHARS) in str(err)
    assert len(str(err)) < 500  # names the expression by its start and length
    assert err.expression is huge
    assert huge not in sql92._cache  # a refused giant never becomes a cache key


def test_the_longest_allowed_literal_compiles_quickly():
    expr = "a = '" + "x" * (MAX_EXPRESSION_CHARS - 6) + "'"
    assert len(expr) == MAX_EXPRESSION_CHARS
    start = time.thread_time()
    compiled = compile_uncached(expr)
    assert time.thread_time() - start < 2
    assert compiled.matches({"a": "x" * (MAX_EXPRESSION_CHARS - 6)})
    assert not compiled.matches({"a": "x"})


def test_quote_runs_and_open_comments_lex_in_linear_time():
    start = time.thread_time()
    assert compile_uncached("a = '" + "''" * 100_000 + "'").matches({"a": "'" * 100_000})
    with pytest.raises(FilterSyntaxError) as info:
        compile_uncached("a = '" + "''" * 100_000)  # unterminated: reported at its quote
    assert (info.value.reason, info.value.column) == ("unexpected character \"'\"", 5)
    with pytest.raises(FilterSyntaxError):
        compile_uncached("a = 1 /* " + "*" * 200_000)
    with pytest.raises(FilterSyntaxError):
        compile_uncached("a = " + "1" * 200_000 + "x")
    assert time.thread_time() - start < 2


def test_huge_numeric_literals_are_compile_errors():
    assert "does not fit in a long" in str(compile_error("a = " + "9" * 5000))
    assert "greater than Double.MAX_VALUE" in str(compile_error("a = " + "9" * 5000 + ".5"))
    assert compile_uncached("a = 9223372036854775807").evaluate({"a": "9223372036854775807"})


def compile_error(expression: str) -> FilterSyntaxError:
    with pytest.raises(FilterSyntaxError) as info:
        compile_uncached(expression)
    assert len(str(info.value)) < 600
    return info.value


def test_store_refuses_over_limit_expressions_at_get_and_register(make_store):
    store = make_store(SQL92_PLUGIN)
    store.put(Message("T", b"x", properties={"a0": "1"}, queue_id=0))
    store.wait_dispatched()
    deep = alternating(MAX_NESTING_DEPTH)
    with pytest.raises(FilterLimitError, match="nesting depth limit"):
        store.get("g", "T", 0, 0, 32, expression=deep, expression_type="SQL92")
    with pytest.raises(FilterLimitError, match="nesting depth limit"):
        store.register_subscription("g", "T", deep)
    chain = " AND ".join(["a0 = '1'"] * 1000)
    store.register_subscription("g", "T", chain)
    r = store.get("g", "T", 0, 0, 32, expression=chain, expression_type="SQL92")
    assert [m.queue_offset for m in r.messages] == [0]


# -- SQL92: evaluation errors that hide bugs are not swallowed ----------------------------

def test_matches_only_swallows_conversion_failures():
    expr = compile_uncached("a > 5")
    assert expr.matches({"a": "x"}) is False  # Integer.valueOf fails: no match
    assert expr.matches(None) is False and expr.matches("a=6") is False

    def broken(props):
        raise RecursionError("maximum recursion depth exceeded")

    expr._fn = broken
    with pytest.raises(RecursionError):
        expr.matches({"a": "6"})
    with pytest.raises(RecursionError):
        expr.evaluate_many([{"a": "6"}])
    with pytest.raises(Exception) as info:  # property values must be strings: a list is a bug
        compile_uncached("a = b").matches({"a": [1], "b": "x"})
    assert not isinstance(info.value, EvaluationError)


def test_number_parsing_of_huge_property_values_is_linear_and_exact():
    start = time.thread_time()
    for text in ("1" * 30_000 + "x", "0x" + "1" * 30_000 + "q", "." + "5" * 30_000 + "e"):
        with pytest.raises(EvaluationError):
            parse_double(text)
    assert time.thread_time() - start < 1
    assert parse_int("0" * 5000 + "7") == 7  # Java accepts any number of leading zeros
    assert parse_int("-" + "0" * 5000 + "7") == -7
    assert parse_int("\u0660" * 5000 + "\u0667") == 7  # and zeros of any script
    with pytest.raises(EvaluationError, match="out of int range"):
        parse_int("1" * 5000)
    expr = compile_expression("a > 5")
    assert expr.matches({"a": "0" * 5000 + "7"}) is True
    assert expr.matches({"a": "9" * 5000}) is False


# -- index files: every walk is bounded ----------------------------------------------------

def write_index(path, slots, entries, puts):
    f = IndexFile.create(str(path), slots, entries)
    for key_hash, phys in puts:
        assert f.put_key(key_hash, phys, S)
    f.close()


def patch(path, at, fmt, value):
    raw = bytearray(path.read_bytes())
    struct.pack_into(fmt, raw, at, value)
    path.write_bytes(bytes(raw))


def test_a_chain_cycle_stops_at_the_first_link_that_does_not_go_back(tmp_path, caplog):
    path = tmp_path / "i"
    write_index(path, 4, 8, [(1, 0), (1, 10), (1, 20)])
    patch(path, L.entry_position(4, 1) + 16, ">i", 3)  # entry 1 -> entry 3: a cycle
    f = IndexFile.load(str(path), slots=4, read_only=True)
    try:
        with caplog.at_level(logging.WARNING, logger="mqstore.storage.index_file"):
            assert f.select(1, 1 << 31, 0, LONG_MAX) == [(20, S), (10, S), (0, S)]
            assert f.select(1, 1 << 31, 0, LONG_MAX) == [(20, S), (10, S), (0, S)]
        warnings = [r for r in caplog.records if r.name == "mqstore.storage.index_file"]
        assert len(warnings) == 1  # once per file
        assert str(path) in warnings[0].getMessage()
        assert "entry 1: prevIndex 3 is not in [0, 1)" in warnings[0].getMessage()
    finally:
        f.close()


def test_a_huge_header_count_cannot_steer_reads_off_the_file(tmp_path):
    path = tmp_path / "i"
    write_index(path, 4, 8, [(1, 0), (1, 10), (5, 20)])
    patch(path, L.INDEX_COUNT_AT, ">i", (1 << 31) - 1)
    patch(path, L.slot_position(1), ">i", 1_000_000)  # far past the 8 entries
    patch(path, L.slot_position(2), ">i", 8)  # one past the last entry
    f = IndexFile.load(str(path), slots=4, read_only=True)
    try:
        f.reload_header()
        assert f.index_count == (1 << 31) - 1
        assert f.select(1, 1 << 31, 0, LONG_MAX) == []
        assert f.select(2, 1 << 31, 0, LONG_MAX) == []
        assert f.select(3, 1 << 31, 0, LONG_MAX) == []
    finally:
        f.close()


def test_every_entry_linking_forward_costs_one_step(tmp_path, caplog):
    entries = 4096
    path = tmp_path / "i"
    write_index(path, 1, entries, [(7, n) for n in range(entries - 1)])
    raw = bytearray(path.read_bytes())
    for n in range(1, entries):  # every entry links to the newest: each walk is a loop
        struct.pack_into(">i", raw, L.entry_position(1, n) + 16, entries - 1)
    struct.pack_into(">i", raw, L.INDEX_COUNT_AT, (1 << 31) - 1)
    path.write_bytes(bytes(raw))
    f = IndexFile.load(str(path), slots=1, read_only=True)
    try:
        start = time.thread_time()
        with caplog.at_level(logging.WARNING, logger="mqstore.storage.index_file"):
            assert f.select(7, 1 << 31, 0, LONG_MAX) == [(entries - 2, S)]
        assert time.thread_time() - start < 1
    finally:
        f.close()


def test_a_long_valid_chain_is_walked_in_full(tmp_path):
    entries = 4096
    path = tmp_path / "i"
    write_index(path, 1, entries, [(7, n) for n in range(entries - 1)])
    f = IndexFile.load(str(path), slots=1, read_only=True)
    try:
        got = f.select(7, 1 << 31, 0, LONG_MAX)
        assert got == [(n, S) for n in reversed(range(entries - 1))]
        assert f.verify() is None
    finally:
        f.close()


def test_raw_reads_outside_the_file_are_value_errors(tmp_path):
    path = tmp_path / "i"
    write_index(path, 4, 8, [(1, 0)])
    f = IndexFile.load(str(path), slots=4, read_only=True)
    try:
        with pytest.raises(ValueError, match="entry 8 is outside"):
            f.read_entry(8)
        with pytest.raises(ValueError, match="slot -1 is outside"):
            f.slot_value(-1)
    finally:
        f.close()
    with pytest.raises(ValueError, match="needs 40 bytes"):
        L.unpack_header(bytes(39))


# -- subscriptions.json: damage is reported, never fatal, never silently lost --------------

@pytest.mark.parametrize("content, problem", [
    (b"{not json", "not valid JSON (Expecting property name enclosed in double quotes at "
                   "line 1, column 2)"),
    (b"\xff\xfe[]", "not UTF-8"),
    (b'{"group": "G"}', "holds a dict, not a list of subscriptions"),
    (b'[{"group": "G", "topic": "T", "expression": "a > 1"}]',
     "entry 0: 'registered_at' is None, not a number"),
    (b'[["G"]]', "entry 0 is a list, not an object"),
])
def test_damaged_subscriptions_file_reads_as_empty_and_names_path_and_problem(
        tmp_path, caplog, content, problem):
    path = tmp_path / SUBSCRIPTIONS_FILE
    path.write_bytes(content)
    with caplog.at_level(logging.ERROR, logger="mqstore.view.subscriptions"):
        subs = Subscriptions(str(tmp_path))
    assert subs.entries == [] and subs.lookup("G", "T") is None
    assert subs.problem.startswith(f"{path}: ") and problem in subs.problem
    assert any(str(path) in r.getMessage() and problem in r.getMessage()
               for r in caplog.records)


def test_registering_keeps_the_damaged_file_aside(tmp_path, caplog):
    path = tmp_path / SUBSCRIPTIONS_FILE
    path.write_bytes(b'[{"group": "OLD", "topic": "T", "expression": "a > 1", "regis')
    subs = Subscriptions(str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="mqstore.view.subscriptions"):
        subs.register("G", "T", "a > 2", 5)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(SUBSCRIPTIONS_FILE + ".damaged.")]
    assert len(aside) == 1 and b'"OLD"' in aside[0].read_bytes()
    assert any(str(aside[0]) in r.getMessage() for r in caplog.records)
    assert json.loads(path.read_text()) == [
        {"group": "G", "topic": "T", "expression": "a > 2", "type": "SQL92", "registered_at": 5}]
    assert subs.problem is None and Subscriptions(str(tmp_path)).lookup("G", "T") is not None


def test_store_opens_and_filters_exactly_over_a_garbled_subscriptions_file(make_store,
                                                                           store_dir):
    store = make_store(SQL92_PLUGIN)
    store.register_subscription("G", "T", "a > 5")
    store.close()
    (store_dir / SUBSCRIPTIONS_FILE).write_bytes(b"\x00garbage")
    store = make_store(SQL92_PLUGIN)
    assert "not valid JSON" in store.subscriptions.problem
    for i in range(10):
        store.put(Message("T", b"x", properties={"a": str(i)}, queue_id=0))
    store.wait_dispatched()
    r = store.get("G", "T", 0, 0, 32, expression="a > 5", expression_type="SQL92")
    assert [m.queue_offset for m in r.messages] == [6, 7, 8, 9]

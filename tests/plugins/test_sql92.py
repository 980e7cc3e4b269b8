"""SQL92 property filter (spec section 11, acceptance behaviours 72-80) and its store plugin."""

from __future__ import annotations

import pytest

from mqstore import GetStatus, Message, PutStatus
from mqstore.errors import MQStoreError, PluginError
from mqstore.plugins import filter_sql92, sql92
from mqstore.plugins.sql92 import (
    EvaluationError, FilterSyntaxError, Long, Sql92Expression, compile_expression,
    compile_uncached,
)

SQL92_PLUGIN = {"plugins": {"modules": ["mqstore.plugins.filter_sql92"]}}


@pytest.fixture(autouse=True)
def fresh_cache():
    sql92.clear_cache()
    yield
    sql92.clear_cache()


def matches(expression: str, props: dict) -> bool:
    return compile_expression(expression).matches(props)


def value(expression: str, props: dict):
    return compile_expression(expression).evaluate(props)


def syntax_error(expression: str) -> FilterSyntaxError:
    with pytest.raises(FilterSyntaxError) as info:
        compile_uncached(expression)
    return info.value


# -- behaviours 72-80 ----------------------------------------------------------------------

def test_b72_greater_than_integer_literal():
    assert matches("a > 5", {"a": "10"}) is True
    assert matches("a > 5", {"a": "abc"}) is False
    assert matches("a > 5", {}) is False
    assert matches("a > 5", {"a": "5.5"}) is False  # Integer.valueOf("5.5") fails
    assert matches("a > 5.0", {"a": "5.5"}) is True


def test_b73_equal_and_not_equal_string():
    assert matches("a = 'x'", {"a": "x"}) is True
    assert matches("a = 'x'", {}) is False
    assert matches("a <> 'x'", {}) is False
    assert matches("a <> 'x'", {"a": "y"}) is True


def test_b74_is_null_and_is_not_null():
    assert matches("a IS NULL", {}) is True
    assert matches("a IS NULL", {"a": "v"}) is False
    assert matches("a IS NOT NULL", {"a": "v"}) is True
    assert matches("a IS NOT NULL", {}) is False


def test_b75_in_and_not_in():
    assert matches("a IN ('x','y')", {"a": "y"}) is True
    assert matches("a NOT IN ('x')", {}) is False
    assert matches("a NOT IN ('x')", {"a": "z"}) is True


def test_b76_between():
    assert matches("a BETWEEN 1 AND 3", {"a": "2"}) is True
    assert matches("a BETWEEN 1 AND 3", {"a": "4"}) is False
    err = syntax_error("a BETWEEN 3 AND 1")
    assert (err.line, err.column, err.offset) == (1, 11, 10)
    assert err.reason == "BETWEEN low value 3 is greater than high value 1"


def test_b77_compile_errors_and_not_binding():
    assert syntax_error("a > 'x'").reason == "'x' (constant) cannot be compared with '>'"
    assert syntax_error("a = NULL").reason == "NULL cannot be compared with '='; use IS [NOT] NULL"
    expr = compile_expression("NOT a = 1")  # (NOT a) = 1
    assert expr.matches({"a": "2"}) is False
    assert expr.evaluate({"a": "2"}) is False
    assert expr.evaluate({}) is None


def test_b78_boolean_literal_and_bare_property():
    assert matches("a = TRUE", {"a": "true"}) is True
    assert matches("a", {"a": "true"}) is False


def test_b79_tags_and_contains():
    assert matches("TAGS = 'TagA' AND b CONTAINS 'bc'", {"TAGS": "TagA", "b": "abcd"}) is True
    assert matches("b NOT CONTAINS 'z'", {}) is False


def test_b80_keyword_case_and_property_case():
    expr = compile_expression("a is not null and b in ('1')")
    assert expr.matches({"a": "x", "b": "1"}) is True
    assert expr.matches({"a": "x", "b": "2"}) is False
    assert matches("A = '1'", {"a": "1"}) is False
    assert matches("A = '1'", {"A": "1"}) is True


# -- comparison operators ------------------------------------------------------------------

@pytest.mark.parametrize("expression, a, expected", [
    ("a > 5", "6", True), ("a > 5", "5", False), ("a > 5", "-7", False),
    ("a >= 5", "5", True), ("a >= 5", "4", False),
    ("a < 5", "4", True), ("a < 5", "5", False),
    ("a <= 5", "5", True), ("a <= 5", "6", False),
    ("a = 5", "5", True), ("a = 5", "6", False), ("a = 5", "+5", True), ("a = 5", "005", True),
    ("a <> 5", "6", True), ("a <> 5", "5", False),
    ("5 < a", "6", True), ("5 < a", "5", False), ("5 = a", "5", True),
    ("a > -1", "0", True), ("a = -5", "-5", True), ("a = +5", "5", True), ("a = - -5", "5", True),
    ("a > 1.5", "2", True), ("a < 1.5", "1.25", True), ("a = 5.0", "5", True),
])
def test_comparison_operators(expression, a, expected):
    assert value(expression, {"a": a}) is expected
    assert matches(expression, {"a": a}) is expected


@pytest.mark.parametrize("expression", ["a > 5", "a >= 5", "a < 5", "a <= 5", "5 < a"])
def test_ordering_with_missing_property_is_unknown(expression):
    assert value(expression, {}) is None
    assert value(expression, {"b": "1"}) is None


def test_two_string_properties_compare_as_doubles():
    assert value("a > b", {"a": "10", "b": "9.5"}) is True
    assert value("a <= b", {"a": "1e1", "b": "10"}) is True
    assert value("a < b", {"a": "2", "b": "10"}) is True  # not lexicographic
    assert value("a > b", {"a": "2"}) is None
    with pytest.raises(EvaluationError):
        value("a > b", {"a": "x", "b": "1"})
    assert matches("a > b", {"a": "x", "b": "1"}) is False


def test_equality_null_rules():
    assert value("a = b", {}) is True  # both null
    assert value("a = b", {"b": "1"}) is None  # left null
    assert value("a = b", {"a": "1"}) is False  # right null
    assert value("a = b", {"a": "1", "b": "1"}) is True
    assert value("'x' = a", {}) is False
    assert value("'x' <> a", {}) is True  # NOT FALSE
    assert matches("'x' <> a", {}) is True
    assert value("a <> b", {}) is False


def test_equality_conversion_errors_do_not_match():
    for props in ({"a": "5.0"}, {"a": "abc"}, {"a": " 5"}, {"a": "1_000"}, {"a": "3000000000"}):
        with pytest.raises(EvaluationError):
            value("a = 5", props)
        assert matches("a = 5", props) is False
        assert matches("a <> 5", props) is False


def test_java_integer_parser_accepts_unicode_digits():
    assert value("a = 3", {"a": "\u0663"}) is True  # ARABIC-INDIC DIGIT THREE
    assert value("a = 1000", {"a": "1\u0660\u0660\u0660"}) is True
    assert matches("a = 0", {"a": "\U0001d7ce"}) is False  # outside the BMP: two Java chars


def test_java_double_parser_rules():
    assert value("a = 0.5", {"a": " 0.5\t"}) is True  # String.trim()
    assert value("a = 1.5", {"a": "1.5f"}) is True
    assert value("a = 1.5", {"a": "1.5D"}) is True
    assert value("a = 2.0", {"a": "0x1p1"}) is True
    assert value("a > 5.0", {"a": "NaN"}) is True  # Double.compareTo puts NaN above all
    assert value("a = 5.0", {"a": "NaN"}) is False
    assert value("a > 1e308", {"a": "Infinity"}) is True
    assert value("a < 1e308", {"a": "-Infinity"}) is True
    assert value("a > 1.5", {"a": "1e400"}) is True
    for bad in ("1_0", "nan", "inf", "", "1.5x", "0x10"):
        assert matches("a = 1.5", {"a": bad}) is False


# -- numeric literals ----------------------------------------------------------------------

def test_decimal_literals_are_integer_or_long():
    assert compile_expression("2147483647 = 2147483647").evaluate({}) is True
    assert value("a = 2147483647", {"a": "2147483647"}) is True
    assert value("a = 2147483648", {"a": "2147483648"}) is True  # Long literal, Long parser
    assert value("a > 2147483648", {"a": "3000000000"}) is True
    assert matches("a > 5", {"a": "3000000000"}) is False  # Integer parser overflows
    assert value("a = 9223372036854775807", {"a": "9223372036854775807"}) is True
    assert matches("a < 9223372036854775807", {"a": "9223372036854775808"}) is False
    assert value("a = -2147483648", {"a": "-2147483648"}) is True
    assert value("a = 5L", {"a": "5"}) is True
    assert value("a = 3000000000l", {"a": "3000000000"}) is True


def test_numeric_widening_between_constants():
    assert value("1 = 1.0", {}) is True
    assert value("2147483648 > 1", {}) is True
    assert value("1 < 2147483648", {}) is True
    assert value("1 < 1.5", {}) is True
    assert value("9007199254740993 = 9007199254740992.0", {}) is True  # long -> double rounds


def test_compare_helper_types():
    assert sql92.compare(5, Long(5)) == 0
    assert sql92.compare(Long(7), 5) == 1
    assert sql92.compare(1, 1.5) == -1
    assert sql92.compare("5", 5) == 0
    assert sql92.compare(True, 1) == -1
    assert sql92.compare(1, True) == -1
    assert sql92.compare("yes", False) == 0
    assert sql92.compare_doubles(-0.0, 0.0) == -1
    assert sql92.compare_doubles(float("nan"), float("nan")) == 0
    with pytest.raises(EvaluationError):
        sql92.compare(True, "true")


@pytest.mark.parametrize("literal, text", [
    ("5.", "5"), (".5", "0.5"), ("5.5", "5.5"), ("1e3", "1000"), ("1E3", "1000"),
    ("1.5E-3", "0.0015"), ("2e+2", "200"), ("5.e1", "50"), (".5e1", "5"),
])
def test_float_literals(literal, text):
    assert value(f"a = {literal}", {"a": text}) is True


@pytest.mark.parametrize("expression, reason", [
    ("a = 0.0", "0.0 is less than Double.MIN_VALUE (4.9E-324)"),
    ("a = 0e5", "0e5 is less than Double.MIN_VALUE (4.9E-324)"),
    ("a = 1e-400", "1e-400 is less than Double.MIN_VALUE (4.9E-324)"),
    ("a = 1e309", "1e309 is greater than Double.MAX_VALUE"),
    ("a = 9223372036854775808", "9223372036854775808 does not fit in a long"),
])
def test_out_of_range_literals(expression, reason):
    err = syntax_error(expression)
    assert (err.reason, err.line, err.column) == (reason, 1, 5)


def test_unary_minus_on_non_numbers_is_unknown():
    assert value("-a = -5", {"a": "5"}) is None
    assert value("a > -'x'", {"a": "1"}) is None
    assert value("-TRUE = 1", {}) is None


# -- BETWEEN, IN, IS NULL, CONTAINS --------------------------------------------------------

def test_between_bounds_are_inclusive_and_not_between():
    expr = compile_expression("a BETWEEN 1 AND 3")
    assert [expr.evaluate({"a": v}) for v in ("0", "1", "3", "4")] == [False, True, True, False]
    assert expr.evaluate({}) is None
    nb = compile_expression("a NOT BETWEEN 1 AND 3")
    assert [nb.evaluate({"a": v}) for v in ("0", "1", "3", "4")] == [True, False, False, True]
    assert nb.evaluate({}) is None
    assert value("a BETWEEN 1.0 AND 1.5", {"a": "1.25"}) is True
    assert matches("a BETWEEN 1 AND 1.5", {"a": "1.25"}) is False  # "1.25" against Integer 1
    assert value("a BETWEEN b AND c", {"a": "2", "b": "1", "c": "3"}) is True


def test_between_constant_checks():
    assert compile_expression("a BETWEEN 1 AND 1").matches({"a": "1"}) is True
    # negated bounds are not constants, so they are not checked
    assert compile_expression("a BETWEEN -1 AND -3").matches({"a": "-2"}) is False
    assert syntax_error("a BETWEEN 2 AND 1.5").reason == (
        "BETWEEN low value 2 is greater than high value 1.5")
    assert syntax_error("a BETWEEN NULL AND 1").reason == "BETWEEN bounds cannot be NULL"
    assert syntax_error("a BETWEEN 1 AND 'x'").reason == (
        "BETWEEN bounds cannot be compared: 'x' is not an int")
    assert syntax_error("a BETWEEN 'a' AND 'b'").reason == (
        "'a' (constant) cannot be compared with '>='")
    assert syntax_error("a BETWEEN TRUE AND TRUE").reason == (
        "TRUE (boolean constant) cannot be compared with '>='")


def test_in_list():
    expr = compile_expression("a IN ('x', 'y', 'it''s', 'p', 'q', 'r')")
    assert [expr.evaluate({"a": v}) for v in ("x", "it's", "r", "z")] == [True, True, True, False]
    assert expr.evaluate({}) is None
    assert value("a NOT IN ('x', 'y')", {"a": "y"}) is False
    assert value("a NOT IN ('x', 'y')", {}) is None
    assert value("(a) IN ('x')", {"a": "x"}) is True
    assert value("+a IN ('x')", {"a": "x"}) is True
    assert value("a IN ('5')", {"a": "05"}) is False  # string equality only


def test_in_requires_property_and_string_literals():
    err = syntax_error("-a IN ('x')")
    assert (err.reason, err.column) == ("IN needs a property on its left, got -a (value)", 1)
    assert syntax_error("'x' IN ('x')").reason == (
        "IN needs a property on its left, got 'x' (constant)")
    assert syntax_error("a IN (1)").reason == "unexpected '1'"
    assert syntax_error("a IN ()").reason == "unexpected ')'"


def test_is_null_on_expressions():
    assert value("(a = 'x') IS NULL", {}) is True
    assert value("(a = 'x') IS NOT NULL", {"a": "y"}) is True
    assert value("a IS NULL", {"a": ""}) is False


@pytest.mark.parametrize("expression, props, expected", [
    ("b CONTAINS 'bc'", {"b": "abcd"}, True), ("b CONTAINS 'x'", {"b": "abcd"}, False),
    ("b NOT CONTAINS 'x'", {"b": "abcd"}, True), ("b NOT CONTAINS 'bc'", {"b": "abcd"}, False),
    ("b STARTSWITH 'ab'", {"b": "abcd"}, True), ("b STARTSWITH 'bc'", {"b": "abcd"}, False),
    ("b NOT STARTSWITH 'bc'", {"b": "abcd"}, True), ("b ENDSWITH 'cd'", {"b": "abcd"}, True),
    ("b ENDSWITH 'bc'", {"b": "abcd"}, False), ("b NOT ENDSWITH 'cd'", {"b": "abcd"}, False),
    ("b CONTAINS ''", {"b": "abcd"}, False), ("b NOT CONTAINS ''", {"b": "abcd"}, False),
    ("b STARTSWITH ''", {"b": "abcd"}, False), ("b NOT ENDSWITH ''", {"b": "abcd"}, False),
    ("b CONTAINS 'x'", {}, False), ("b NOT CONTAINS 'x'", {}, False),
    ("b NOT STARTSWITH 'x'", {}, False), ("b NOT ENDSWITH 'x'", {}, False),
    ("5 CONTAINS '5'", {}, False), ("b CONTAINS 'it''s'", {"b": "it's"}, True),
    ("b contains 'c' and b startsWith 'a' and b EndsWith 'd'", {"b": "abcd"}, True),
])
def test_contains_startswith_endswith(expression, props, expected):
    assert value(expression, props) is expected


def test_not_contains_on_missing_is_false_so_its_negation_matches():
    assert matches("NOT (b CONTAINS 'z')", {}) is True
    assert matches("b NOT CONTAINS 'z'", {}) is False


# -- logic ---------------------------------------------------------------------------------

TRI = {True: {"x": "1"}, False: {"x": "0"}, None: {}}


def _pair(lv, rv):
    props = {}
    if lv is not None:
        props["x"] = "1" if lv else "0"
    if rv is not None:
        props["y"] = "1" if rv else "0"
    return props


@pytest.mark.parametrize("lv", [True, False, None])
@pytest.mark.parametrize("rv", [True, False, None])
def test_and_or_truth_tables(lv, rv):
    props = _pair(lv, rv)
    expected_and = False if False in (lv, rv) else (None if None in (lv, rv) else True)
    expected_or = True if True in (lv, rv) else (None if None in (lv, rv) else False)
    assert value("x = '1' AND y = '1'", props) is expected_and
    assert value("x = '1' OR y = '1'", props) is expected_or
    assert matches("x = '1' AND y = '1'", props) is (expected_and is True)


@pytest.mark.parametrize("v, expected", [(True, False), (False, True), (None, None)])
def test_not_truth_table(v, expected):
    assert value("NOT (x = '1')", TRI[v]) is expected
    assert value("NOT NOT (x = '1')", TRI[v]) is v


def test_precedence():
    assert value("x = '1' OR x = '2' AND y = '3'", {"x": "1", "y": "0"}) is True
    assert value("(x = '1' OR x = '2') AND y = '3'", {"x": "1", "y": "0"}) is False
    assert value("NOT x = '1' OR TRUE", {}) is True
    assert value("a = 1 = TRUE", {"a": "1"}) is True  # (a = 1) = TRUE
    assert value("NOT a = FALSE", {"a": "x"}) is False  # (NOT a) = FALSE: NOT FALSE is TRUE


def test_short_circuit_decides_whether_a_conversion_error_counts():
    assert value("a = 'x' AND b > 5", {"a": "y", "b": "abc"}) is False
    with pytest.raises(EvaluationError):
        value("b > 5 AND a = 'x'", {"a": "y", "b": "abc"})
    assert matches("NOT (a = 'x' AND b > 5)", {"a": "y", "b": "abc"}) is True
    assert matches("NOT (b > 5 AND a = 'x')", {"a": "y", "b": "abc"}) is False
    assert matches("a = 'x' OR b > 5", {"a": "x", "b": "abc"}) is True
    assert matches("b > 5 OR a = 'x'", {"a": "x", "b": "abc"}) is False


def test_boolean_constants_and_bare_properties():
    assert matches("TRUE", {}) is True
    assert matches("FALSE", {}) is False
    assert value("NULL", {}) is None
    assert value("a", {}) is None
    assert value("a", {"a": "TRUE"}) is False
    assert value("NOT a", {"a": "x"}) is True
    assert value("a OR b = '1'", {"b": "1"}) is True


def test_boolean_conversion_rules():
    assert value("a = TRUE", {"a": "TRUE"}) is True
    assert value("a = FALSE", {"a": "abc"}) is True  # Boolean.valueOf("abc") is false
    assert value("a <> TRUE", {"a": "yes"}) is True
    assert value("'x' = TRUE", {}) is False
    assert value("TRUE = FALSE", {}) is False
    assert value("(a = 'x') = TRUE", {"a": "x"}) is True
    assert value("(a = 'x') = 1", {"a": "x"}) is False  # Boolean vs Integer: "less than"
    assert value("(a = 'x') <> 1", {"a": "x"}) is True
    assert value("1 = (a = 'x')", {"a": "x"}) is False
    assert value("'true' = (a = 'x')", {"a": "x"}) is True
    with pytest.raises(EvaluationError):  # a Boolean left of a String fails, as in RocketMQ
        value("TRUE = a", {"a": "true"})
    assert matches("TRUE = a", {"a": "true"}) is False
    assert matches("(a = 'x') = 'true'", {"a": "x"}) is False


# -- lexer: strings, comments, keywords, identifiers ---------------------------------------

def test_string_literals_and_escapes():
    assert value("a = 'it''s'", {"a": "it's"}) is True
    assert value("a = ''''", {"a": "'"}) is True
    assert value("a = ''", {"a": ""}) is True
    assert value("a = 'x -- y /* z */'", {"a": "x -- y /* z */"}) is True
    assert value("a = 'Ünïcødé 中'", {"a": "Ünïcødé 中"}) is True
    assert value("a = 'line\nbreak'", {"a": "line\nbreak"}) is True
    assert syntax_error("a = 'x").reason == "unexpected character \"'\""


def test_comments_and_whitespace():
    assert value("a = 1 -- trailing", {"a": "1"}) is True
    assert value("-- first\na = 1\n-- last", {"a": "1"}) is True
    assert value("/* c */ a /* multi\nline */ = /***/ 1 /* x * y */", {"a": "1"}) is True
    assert value("a\t=\r\n1\f", {"a": "1"}) is True
    assert syntax_error("a = 1 /* open").reason == "unexpected character '/'"
    assert syntax_error("a\v= 1").reason == "unexpected character '\\x0b'"


def test_keywords_are_case_insensitive():
    assert value("a Between 1 aNd 3 Or b iS nULL", {"a": "9"}) is True
    assert value("NOT a = tRuE", {"a": "x"}) is True
    assert value("a nOt In ('x')", {"a": "y"}) is True
    assert value("b not contains 'z' AND b STARTSWITH 'a'", {"b": "ab"}) is True


def test_identifiers():
    assert value("notes = '1' AND inside = '2' AND ORDER_ID = '3'",
                 {"notes": "1", "inside": "2", "ORDER_ID": "3"}) is True
    assert value("$a = '1' AND _b9 = '2' AND a$b = '3'",
                 {"$a": "1", "_b9": "2", "a$b": "3"}) is True
    assert value("TAGS = 'A' AND KEYS = 'k'", {"TAGS": "A", "KEYS": "k"}) is True
    assert value("Tags = 'A'", {"TAGS": "A"}) is None


@pytest.mark.parametrize("expression, reason, column", [
    ("and = '1'", "unexpected 'and'", 1),
    ("a.b = '1'", "unexpected character '.'", 2),
    ("a-b = 1", "unexpected '-'", 2),
    ("a != 1", "unexpected character '!'", 3),
    ("a == 1", "unexpected '='", 4),
    ("a LIKE 'x%'", "unexpected 'LIKE'", 3),
    ("a = 0x10", "unexpected 'x10'", 6),
    ("a = 07", "unexpected '7'", 6),
    ("a = 1 b = 2", "unexpected 'b'", 7),
    ("(a = 1", "unexpected end of expression", 7),
    ("a IS NOT", "unexpected end of expression", 9),
])
def test_syntax_errors(expression, reason, column):
    err = syntax_error(expression)
    assert (err.reason, err.line, err.column, err.offset) == (reason, 1, column, column - 1)


# -- compile-time errors -------------------------------------------------------------------

@pytest.mark.parametrize("expression, reason, column", [
    ("a > 'x'", "'x' (constant) cannot be compared with '>'", 5),
    ("'x' <= a", "'x' (constant) cannot be compared with '<='", 1),
    ("a >= TRUE", "TRUE (boolean constant) cannot be compared with '>='", 6),
    ("a < NULL", "NULL (boolean constant) cannot be compared with '<'", 5),
    ("(a = 1) > 2", "= (boolean) cannot be compared with '>'", 2),
    ("NOT a > 1", "NOT a (boolean) cannot be compared with '>'", 1),
    ("a = NULL", "NULL cannot be compared with '='; use IS [NOT] NULL", 5),
    ("NULL = a", "NULL cannot be compared with '='; use IS [NOT] NULL", 1),
    ("a <> NULL", "NULL cannot be compared with '<>'; use IS [NOT] NULL", 6),
    ("TRUE = 'x'", "TRUE cannot be compared with 'x'", 8),
    ("FALSE = 1", "FALSE cannot be compared with 1", 9),
    ("5", "5 (constant) will not result in a boolean value as the whole expression", 1),
    ("'x'", "'x' (constant) will not result in a boolean value as the whole expression", 1),
    ("-a", "-a (value) will not result in a boolean value as the whole expression", 1),
    ("a = 1 AND 5", "5 (constant) will not result in a boolean value after AND", 11),
    ("1.5 OR a = 1", "1.5 (constant) will not result in a boolean value before OR", 1),
    ("NOT 'x'", "'x' (constant) will not result in a boolean value after NOT", 5),
])
def test_compile_errors(expression, reason, column):
    err = syntax_error(expression)
    assert (err.reason, err.line, err.column) == (reason, 1, column)


@pytest.mark.parametrize("expression, line, column", [
    ("", 1, 1), ("   ", 1, 4), ("/* only a comment */", 1, 21), ("-- c\n\n", 3, 1),
])
def test_empty_expression(expression, line, column):
    err = syntax_error(expression)
    assert (err.reason, err.line, err.column, err.offset) == (
        "empty expression", line, column, len(expression))


def test_error_positions_span_lines():
    err = syntax_error("a = 1\nAND b > 'x'")
    assert (err.line, err.column, err.offset) == (2, 9, 14)
    err = syntax_error("a = 1 AND\n  b ? 2")
    assert (err.reason, err.line, err.column, err.offset) == ("unexpected character '?'", 2, 5, 14)


def test_error_type_and_message():
    err = syntax_error("a > 'x'")
    assert isinstance(err, MQStoreError) and isinstance(err, ValueError)
    assert str(err) == ("invalid SQL92 expression \"a > 'x'\" at line 1, column 5: "
                        "'x' (constant) cannot be compared with '>'")
    assert err.expression == "a > 'x'"
    with pytest.raises(FilterSyntaxError) as info:
        compile_expression(None)
    assert info.value.reason == "expression must be a string, not NoneType"


# -- cache, batches, filter contract -------------------------------------------------------

def test_compile_is_cached():
    first = compile_expression("a > 5")
    assert compile_expression("a > 5") is first
    assert compile_uncached("a > 5") is not first
    assert compile_expression("a > 5 ") is not first  # keyed by exact text


def test_failures_are_cached():
    with pytest.raises(FilterSyntaxError) as one:
        compile_expression("a > 'x'")
    with pytest.raises(FilterSyntaxError) as two:
        compile_expression("a > 'x'")
    assert two.value is one.value


def test_cache_keeps_the_most_recent_entries():
    first = compile_expression("a = 0")
    for i in range(1, sql92.CACHE_SIZE):
        compile_expression(f"a = {i}")
    assert compile_expression("a = 0") is first  # refreshed: now the most recent
    compile_expression("a = 100")  # evicts "a = 1", the least recently used
    second = compile_expression("a = 1")
    assert compile_expression("a = 0") is first
    assert compile_expression("a = 1") is second
    assert len(sql92._cache) == sql92.CACHE_SIZE


def test_evaluate_many():
    expr = compile_expression("a > 5 AND b = 'x'")
    batch = [{"a": "6", "b": "x"}, {"a": "6", "b": "y"}, {"a": "abc", "b": "x"}, {},
             {"a": "10", "b": "x"}, None, "not a dict", {"a": 7, "b": "x"}]
    assert expr.evaluate_many(batch) == [True, False, False, False, True, False, False, False]
    assert expr.evaluate_many([]) == []
    assert expr.evaluate_many([{"a": "9", "b": "x"}] * 3) == [True, True, True]


class _Msg:
    def __init__(self, properties):
        self.properties = properties


class _BrokenMsg:
    @property
    def properties(self):
        raise ValueError("bad record")


def test_compiled_expression_is_a_store_filter():
    expr = filter_sql92.compile_sql92("a > 5", None)
    assert isinstance(expr, Sql92Expression)
    assert expr is compile_expression("a > 5")
    assert expr.match_units(None) is None
    assert expr.match_message(_Msg({"a": "6"})) is True
    assert expr.match_message(_Msg({"a": "x"})) is False
    assert expr.match_message(_BrokenMsg()) is False
    with pytest.raises(FilterSyntaxError):
        filter_sql92.compile_sql92("a >", None)


def test_plugin_registers_sql92():
    added = {}

    class Reg:
        def add(self, name, factory):
            added[name] = factory

    filter_sql92.register_filters(Reg())
    assert added == {"SQL92": filter_sql92.compile_sql92}


# -- through the store ---------------------------------------------------------------------

def _put_props(store, topic, props_list):
    for i, props in enumerate(props_list):
        r = store.put(Message(topic, f"m{i}".encode(), properties=props, queue_id=0))
        assert r.status is PutStatus.PUT_OK
        assert r.queue_offset == i
    store.wait_dispatched()


def test_store_get_with_sql92_filter(make_store):
    store = make_store(SQL92_PLUGIN)
    _put_props(store, "T", [{"a": "10"}, {"a": "3"}, {}, {"a": "abc"}, {"a": "7"}, {"a": "5.5"},
                            {"a": "6", "b": "x"}])
    r = store.get("g", "T", 0, 0, 32, expression="a > 5", expression_type="SQL92")
    assert r.status is GetStatus.FOUND
    assert [m.queue_offset for m in r.messages] == [0, 4, 6]
    assert [m.body for m in r.messages] == [b"m0", b"m4", b"m6"]
    assert r.next_begin_offset == 7
    assert r.filtered_count == 4

    r = store.get("g", "T", 0, 0, 32, expression="a IS NULL OR b = 'x'", expression_type="sql92")
    assert [m.queue_offset for m in r.messages] == [2, 6]

    r = store.get("g", "T", 0, 1, 1, expression="a > 5", expression_type="SQL92")
    assert [m.queue_offset for m in r.messages] == [4]
    assert r.next_begin_offset == 5


def test_store_get_sql92_no_match(make_store):
    store = make_store(SQL92_PLUGIN)
    _put_props(store, "T", [{"a": "1"}, {"a": "2"}, {}])
    r = store.get("g", "T", 0, 0, 32, expression="a > 5", expression_type="SQL92")
    assert r.status is GetStatus.NO_MATCHED_MESSAGE
    assert r.messages == []
    assert r.next_begin_offset == 3
    assert r.filtered_count == 3


def test_store_get_sql92_sees_tags_and_keys(make_store):
    store = make_store(SQL92_PLUGIN)
    for i, tags in enumerate(["TagA", "TagB", "TagA"]):
        store.put(Message("T", b"x", tags=tags, keys=f"k{i}", properties={"n": str(i)},
                          queue_id=0))
    store.wait_dispatched()
    r = store.get("g", "T", 0, 0, 32, expression="TAGS = 'TagA' AND KEYS <> 'k0'",
                  expression_type="SQL92")
    assert [m.queue_offset for m in r.messages] == [2]


def test_store_get_sql92_bad_expression_raises(make_store):
    store = make_store(SQL92_PLUGIN)
    _put_props(store, "T", [{"a": "1"}])
    with pytest.raises(FilterSyntaxError) as info:
        store.get("g", "T", 0, 0, 32, expression="a BETWEEN 3 AND 1", expression_type="SQL92")
    assert (info.value.line, info.value.column) == (1, 11)


def test_sql92_is_a_default_plugin_that_can_be_disabled(make_store, tmp_path):
    store = make_store()
    _put_props(store, "T", [{"a": "10"}])
    res = store.get("g", "T", 0, 0, 32, expression="a > 5", expression_type="SQL92")
    assert [m.queue_offset for m in res.messages] == [0]
    off = make_store({"plugins": {"disable": ["mqstore.plugins.filter_sql92"]}},
                     root=tmp_path / "off")
    with pytest.raises(PluginError, match="unknown filter 'SQL92'"):
        off.get("g", "T", 0, 0, 32, expression="a > 5", expression_type="SQL92")

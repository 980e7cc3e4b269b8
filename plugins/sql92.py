"""RocketMQ's SQL92 message selector: an LALR grammar, a compiler to closures, and its semantics.

Lexer: whitespace (space, tab, CR, LF, FF), ``-- ...`` line comments and ``/* ... */`` block
comments are skipped. Keywords (``NOT AND OR BETWEEN IN TRUE FALSE NULL IS CONTAINS STARTSWITH
ENDSWITH``) are case-insensitive; property names (``[a-zA-Z_$][a-zA-Z0-9_$]*``) are looked up
exactly as written. ``0`` or ``[1-9][0-9]*`` with an optional ``L`` is a Java Integer when it fits
in 32 bits, else a Long (beyond 64 bits is an error). ``5.``, ``5.5``, ``.5``, ``5E3`` are
Doubles; a Double above Double.MAX_VALUE or below Double.MIN_VALUE is an error, so ``0.0`` is
rejected. Strings are ``'...'`` with ``''`` for a quote; an unterminated one is reported at its
opening quote. Operators: ``= <> > >= < <= ( ) , + -``.
A ``--`` comment may also end the input (RocketMQ's lexer wants a line break after it).

Grammar, lowest precedence first: OR, AND, ``= <> IS [NOT] NULL``, ``> >= < <= [NOT] CONTAINS|
STARTSWITH|ENDSWITH 'lit' [NOT] BETWEEN x AND y [NOT] IN ('a', ...)``, unary ``+ - NOT``.
``NOT`` is unary, so ``NOT a = 1`` is ``(NOT a) = 1``.

Compile errors (:class:`FilterSyntaxError`, with line and column): syntax errors; a string,
boolean or NULL constant or a boolean sub-expression as an operand of ``< <= > >=``; NULL in
``=``/``<>``; a boolean constant ``=`` a non-boolean constant; ``BETWEEN`` with constant
bounds where low > high; ``IN`` after anything but a property; an operand of AND/OR/NOT, or the
whole expression, that is neither boolean nor a property; an empty expression.

Evaluation is three-valued (True, False, None for unknown) over a ``dict[str, str]`` of
properties; only True matches. A missing property is None. ``x = y``: both None -> True, only
the left None -> None, only the right None -> False. ``<>`` and ``IS NOT NULL`` negate ``=``
and ``IS NULL``. Ordering operators give None when either side is None; two strings are both
parsed as doubles. Otherwise values of different Java types are converted: a string against an
Integer/Long/Double/Boolean constant is parsed with that type's Java parser (``Integer.valueOf``
rejects ``"5.5"``); Integer -> Long -> Double widen; a Boolean on the left of a string fails (a
ClassCastException in RocketMQ); other mixes compare as "less than". A failed conversion fails
the whole evaluation: no match, whatever surrounds it. ``IN`` is None unless the property is a
string. ``[NOT] CONTAINS/STARTSWITH/ENDSWITH`` are False for an empty literal or a missing or
non-string value, NOT forms included. AND/OR short-circuit left to right. Unary minus negates
numbers and gives None otherwise; a bare property in a boolean position is None when missing
and False otherwise (even ``"true"``).

Limits (:class:`FilterLimitError`, a compile error): MAX_EXPRESSION_CHARS and MAX_NESTING_DEPTH.
AND/OR chains, however parenthesised, are flattened and runs of NOT fold, so they count as one
level: 10,000 ANDs or NOTs compile and evaluate, far from Python's recursion limit. Parentheses
nest at most MAX_PARENTHESES_DEPTH deep, checked as the lexer reaches them, before the parse:
the parser takes no Python frames for them, but each level costs several times a flat token,
so a deeply nested expression is refused at its first parenthesis too deep, not parsed.

``compile_expression`` keeps the last 100 expressions, failures included. A compiled
``Sql92Expression`` offers ``evaluate`` (three-valued, may raise EvaluationError), ``matches``
and ``evaluate_many`` (a failed conversion is no match, a bug raises), and the filter methods.
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Mapping

from lark import Lark, Transformer, v_args
from lark.exceptions import UnexpectedCharacters, UnexpectedInput, UnexpectedToken

from mqstore.plugin_api import PRECOMPUTES, MQStoreError
from mqstore.plugins.sql92_java import (  # noqa: F401 - part of this module's API
    _FROM_STRING, _LONG_DIGITS, INT_MAX, INT_MIN, LONG_MAX, LONG_MIN, EvaluationError, Long,
    _clip, compare, compare_doubles, parse_boolean, parse_double, parse_int, parse_long,
)

log = logging.getLogger(__name__)

CACHE_SIZE = 100
# A selector is a few hundred characters, a generated IN list tens of KB; 256 KiB compiles in
# under a second (about 10 us a token; two if all parentheses) and 100 fit in the cache.
MAX_EXPRESSION_CHARS = 1 << 18
# One Python frame per level: far below the recursion limit (1000) from any caller's stack.
MAX_NESTING_DEPTH = 200
# Parentheses take no frame (AND/OR chains flatten through them), only parse time.
MAX_PARENTHESES_DEPTH = 1024
DOUBLE_MAX, DOUBLE_MIN = 1.7976931348623157e308, 5e-324  # Double.MAX_VALUE, Double.MIN_VALUE

KEYWORDS = ("NOT", "AND", "OR", "BETWEEN", "IN", "TRUE", "FALSE", "NULL", "IS", "CONTAINS",
            "STARTSWITH", "ENDSWITH")
GRAMMAR = r"""
start: or_expr
?or_expr: and_expr | or_expr OR and_expr -> logic
?and_expr: eq_expr | and_expr AND eq_expr -> logic
?eq_expr: cmp_expr
    | eq_expr EQ_OP cmp_expr -> equality
    | eq_expr IS NOT? NULL -> is_null
?cmp_expr: unary
    | cmp_expr ORDER_OP unary -> order
    | cmp_expr NOT? (CONTAINS | STARTSWITH | ENDSWITH) STRING -> text_test
    | cmp_expr NOT? BETWEEN unary AND unary -> between
    | cmp_expr NOT? IN "(" STRING ("," STRING)* ")" -> in_list
?unary: SIGN unary -> sign
    | NOT unary -> not_
    | primary
?primary: STRING -> string_lit
    | DECIMAL -> decimal_lit
    | FLOAT -> float_lit
    | (TRUE | FALSE | NULL) -> keyword_lit
    | ID -> prop
    | "(" or_expr ")"

FLOAT.2: /(?:[0-9]++\.[0-9]*+|\.[0-9]++)(?:e[+-]?[0-9]++)?|[0-9]++e[+-]?[0-9]++/i
DECIMAL.1: /0|[1-9][0-9]*+[lL]?/
STRING: /'[^']*+(?:''[^']*+)*+'/
ID: /[a-zA-Z_$][a-zA-Z0-9_$]*/
EQ_OP.1: "=" | "<>"
ORDER_OP: ">=" | "<=" | ">" | "<"
SIGN: "+" | "-"
LINE_COMMENT: /--[^\n\r]*/
BLOCK_COMMENT: /\/\*[^*]*+\*++(?:[^*\/][^*]*+\*++)*+\//
%ignore /[ \t\n\r\f]+/
%ignore LINE_COMMENT
%ignore BLOCK_COMMENT
""" + "".join(f"{k}.3: /{k.lower()}(?![a-z0-9_$])/i\n" for k in KEYWORDS)


class FilterSyntaxError(MQStoreError, ValueError):
    """A SQL92 expression does not compile; ``line``/``column`` are 1-based, ``offset`` 0-based."""

    def __init__(self, reason: str, expression=None, line=None, column=None, offset=None):
        self.reason = reason
        self.line, self.column, self.offset = line, column, offset
        self.locate(expression)

    def locate(self, expression) -> "FilterSyntaxError":
        """Name the whole expression in the message (errors are raised before it is known)."""
        self.expression = expression
        where = f" at line {self.line}, column {self.column}" if self.line is not None else ""
        self.args = (f"invalid SQL92 expression {_clip(expression, 200)!r}{where}: "
                     f"{self.reason}",)
        return self


class FilterLimitError(FilterSyntaxError):
    """An expression is refused for its size: ``rule`` names the limit, ``limit`` its value."""

    def __init__(self, *args, rule: str | None = None, limit: int | None = None):
        self.rule, self.limit = rule, limit
        super().__init__(*args)


# -- compilation ---------------------------------------------------------------------------
# Node kinds mirror RocketMQ's expression classes, which decide the compile-time checks.
CONST, BOOL_CONST, PROP = "constant", "boolean constant", "property"
BOOL, VALUE = "boolean", "value"
_ORDER = {  # compare() + 1 -> truth
    ">": (False, False, True), ">=": (False, True, True),
    "<": (True, False, False), "<=": (True, True, False),
}


class _Node:
    """A compiled sub-expression: its kind, closure (props -> value) and source position.
    ``depth`` counts closures stacked up to this one; ``op``/``operands`` let a parent fold
    with it: an AND/OR chain's deque of closures, or the operand of "NOT" and "NOT NOT"."""

    __slots__ = ("kind", "fn", "value", "text", "line", "column", "start_pos", "depth", "op",
                 "operands")

    def __init__(self, kind, fn, at, text, value=None, below=0, op=None, operands=None):
        if below >= MAX_NESTING_DEPTH:
            raise FilterLimitError(
                f"operators nest deeper than the nesting depth limit of {MAX_NESTING_DEPTH} (a "
                f"chain of AND or OR, or a run of NOT, counts as one level)", None, at.line,
                at.column, at.start_pos, rule="nesting depth", limit=MAX_NESTING_DEPTH)
        self.kind, self.fn, self.value, self.text = kind, fn, value, text
        self.line, self.column, self.start_pos = at.line, at.column, at.start_pos
        self.depth, self.op, self.operands = below + 1, op, operands


def _error(reason: str, at) -> FilterSyntaxError:
    """A compile error at a token or node; compile_uncached adds the expression text."""
    return FilterSyntaxError(reason, None, at.line, at.column, at.start_pos)


def _const(tok, value, kind=CONST) -> _Node:
    return _Node(kind, lambda p: value, tok, str(tok), value)


def _unquote(tok) -> str:
    return tok[1:-1].replace("''", "'")


def _boolean(node: _Node, where: str) -> _Node:
    """RocketMQ's ``asBooleanExpression``: a property is cast, anything else non-boolean fails."""
    if node.kind in (BOOL, BOOL_CONST):
        return node
    if node.kind != PROP:
        raise _error(f"{node.text} ({node.kind}) will not result in a boolean value {where}",
                     node)
    get = node.fn
    return _Node(BOOL, lambda p: v if (v := get(p)) is None or type(v) is bool else False,
                 node, node.text, below=node.depth)


def _not(node: _Node, at) -> _Node:
    """NOT, folding runs: NOT NOT x is x on True, False and None, so it reuses x's closure."""
    text = f"NOT {_clip(node.text)}"
    if node.op == "NOT":
        x = node.operands
        return _Node(BOOL, x.fn, at, text, below=x.depth, op="NOT NOT", operands=x)
    x = node.operands if node.op == "NOT NOT" else node
    f = x.fn
    return _Node(BOOL, lambda p: None if (v := f(p)) is None else not v, at, text,
                 below=x.depth, op="NOT", operands=x)


def _logic(left: _Node, right: _Node, decisive: bool) -> _Node:
    """AND (decisive False) or OR (decisive True), short-circuiting left to right. Associative
    with the same evaluation order however bracketed, so a chain is one node over a flat deque;
    the longer side's deque grows in place (its node is used once), O(n log n) in all."""
    op = "OR" if decisive else "AND"
    (lparts, lbelow), (rparts, rbelow) = ((n.operands, n.depth - 1) if n.op == op
                                          else (deque((n.fn,)), n.depth) for n in (left, right))
    if len(lparts) >= len(rparts):
        lparts.extend(rparts)
        parts = lparts
    else:
        rparts.extendleft(reversed(lparts))
        parts = rparts

    def fn(p):
        unknown = False
        for f in parts:
            v = f(p)
            if v is decisive:
                return decisive
            unknown = unknown or v is None
        return None if unknown else not decisive
    return _Node(BOOL, fn, left, op, below=max(lbelow, rbelow), op=op, operands=parts)


def _equal(left: _Node, right: _Node) -> _Node:
    lf, rf = left.fn, right.fn
    if left.kind == PROP and right.kind == CONST and type(right.value) is str:
        c = right.value
        return _Node(BOOL, lambda p: None if (v := lf(p)) is None else v == c, left, "=",
                     below=max(left.depth, right.depth))

    def fn(p):
        lv, rv = lf(p), rf(p)
        if lv is None:
            return True if rv is None else None
        return False if rv is None else compare(lv, rv) == 0
    return _Node(BOOL, fn, left, "=", below=max(left.depth, right.depth))


def _ordering(left: _Node, right: _Node, op: str) -> _Node:
    for node in (left, right):  # RocketMQ's checkLessThanOperand
        if node.kind in (BOOL, BOOL_CONST) or (node.kind == CONST and type(node.value) is str):
            raise _error(f"{node.text} ({node.kind}) cannot be compared with '{op}'", node)
    lf, rf, truth = left.fn, right.fn, _ORDER[op]
    if left.kind == PROP and right.kind == CONST and type(right.value) is not float:
        c, conv = right.value, _FROM_STRING[type(right.value)]

        def against_const(p):
            v = lf(p)
            if v is None:
                return None
            x = conv(v)
            return truth[(x > c) - (x < c) + 1]
        return _Node(BOOL, against_const, left, op, below=max(left.depth, right.depth))

    def fn(p):
        lv = lf(p)
        if lv is None:
            return None
        rv = rf(p)
        if rv is None:
            return None
        if type(lv) is str and type(rv) is str:
            return truth[compare_doubles(parse_double(lv), parse_double(rv)) + 1]
        return truth[compare(lv, rv) + 1]
    return _Node(BOOL, fn, left, op, below=max(left.depth, right.depth))


@v_args(inline=True)
class _Compiler(Transformer):
    """Parser callbacks, run as the LALR parser reduces: they build the closures bottom-up."""

    def start(self, node):
        return _boolean(node, "as the whole expression")

    def string_lit(self, tok):
        return _const(tok, _unquote(tok))

    def decimal_lit(self, tok):
        value = int(tok.rstrip("lL")[:_LONG_DIGITS + 1])  # more digits are past a long anyway
        if value > LONG_MAX:
            raise _error(f"{_clip(tok)} does not fit in a long", tok)
        return _const(tok, value if value <= INT_MAX else Long(value))

    def float_lit(self, tok):
        value = float(tok)
        if value > DOUBLE_MAX:
            raise _error(f"{_clip(tok)} is greater than Double.MAX_VALUE", tok)
        if value < DOUBLE_MIN:
            raise _error(f"{_clip(tok)} is less than Double.MIN_VALUE (4.9E-324)", tok)
        return _const(tok, value)

    def keyword_lit(self, tok):
        return _const(tok, {"TRUE": True, "FALSE": False, "NULL": None}[tok.type], BOOL_CONST)

    def prop(self, tok):
        name = str(tok)
        return _Node(PROP, lambda p: p.get(name), tok, name)

    def sign(self, op, node):
        if op == "+":
            return node
        f = node.fn

        def fn(p):
            v = f(p)
            t = type(v)
            if t is int:
                return -v if v != INT_MIN else v
            if t is Long:
                return Long(-v if v != LONG_MIN else v)
            return -v if t is float else None
        return _Node(VALUE, fn, op, f"-{_clip(node.text)}", below=node.depth)

    def not_(self, op, node):
        return _not(_boolean(node, "after NOT"), op)

    def logic(self, left, op, right):
        return _logic(_boolean(left, f"before {op.type}"), _boolean(right, f"after {op.type}"),
                      op.type == "OR")

    def equality(self, left, op, right):
        for node in (left, right):
            if node.kind == BOOL_CONST and node.value is None:
                raise _error(f"NULL cannot be compared with '{op}'; use IS [NOT] NULL", node)
        if left.kind == BOOL_CONST and right.kind == CONST:
            raise _error(f"{left.text} cannot be compared with {right.text}", right)
        node = _equal(left, right)
        return node if op == "=" else _not(node, left)

    def is_null(self, left, *toks):
        f, negate = left.fn, len(toks) == 3
        return _Node(BOOL, lambda p: (f(p) is None) is not negate, left, "IS NULL",
                     below=left.depth)

    def order(self, left, op, right):
        return _ordering(left, right, str(op))

    def text_test(self, left, *toks):
        negate, kw, search = len(toks) == 3, toks[-2].type, _unquote(toks[-1])
        if not search:
            return _Node(BOOL, lambda p: False, left, kw)
        f = left.fn
        test = {"CONTAINS": str.__contains__, "STARTSWITH": str.startswith,
                "ENDSWITH": str.endswith}[kw]
        return _Node(BOOL, lambda p: type(v := f(p)) is str and test(v, search) is not negate,
                     left, kw, below=left.depth)

    def between(self, value, *toks):
        kw, low, high = toks[-4], toks[-3], toks[-1]
        if toks[0].type == "NOT":
            return _logic(_ordering(value, low, "<"), _ordering(value, high, ">"), True)
        if low.kind in (CONST, BOOL_CONST) and high.kind in (CONST, BOOL_CONST):
            if low.value is None or high.value is None:
                raise _error("BETWEEN bounds cannot be NULL", kw)
            try:
                wrong_way = compare(high.value, low.value) < 0
            except ValueError as exc:
                raise _error(f"BETWEEN bounds cannot be compared: {exc}", kw) from None
            if wrong_way:
                raise _error(f"BETWEEN low value {low.text} is greater than high value "
                             f"{high.text}", low)
        return _logic(_ordering(value, low, ">="), _ordering(value, high, "<="), False)

    def in_list(self, left, *toks):
        negate = toks[0].type == "NOT"
        if left.kind != PROP:
            raise _error(f"IN needs a property on its left, got {left.text} ({left.kind})",
                         left)
        values = frozenset(_unquote(t) for t in toks if t.type == "STRING")
        f = left.fn
        return _Node(BOOL, lambda p: None if type(v := f(p)) is not str
                     else (v in values) is not negate, left, "IN", below=left.depth)


_PARSER = Lark(GRAMMAR, parser="lalr", lexer="basic", transformer=_Compiler())


# -- compiled expressions and the cache ----------------------------------------------------
class Sql92Expression:
    """A compiled selector. Also a mqstore compiled filter (``match_units``/``match_message``)."""

    __slots__ = ("expression", "_fn")
    # Dispatch keeps registered subscriptions' answers as bloom bitmaps (matches_properties).
    capabilities = frozenset({PRECOMPUTES})

    def __init__(self, expression: str, fn) -> None:
        self.expression = expression
        self._fn = fn

    def evaluate(self, props) -> bool | None:
        """The three-valued result; raises EvaluationError when a conversion fails."""
        return self._fn(props)

    def matches(self, props) -> bool:
        """True only for TRUE. A failed conversion or a non-mapping is no match; any other
        exception is a bug, raised rather than taken for a non-match."""
        if type(props) is not dict and not isinstance(props, Mapping):
            return False
        try:
            return self._fn(props) is True
        except EvaluationError:
            return False

    matches_properties = matches

    def evaluate_many(self, props_list) -> list[bool]:
        fn = self._fn
        try:
            return [fn(p) is True for p in props_list]
        except (EvaluationError, AttributeError):  # redone: matches() raises what is a bug
            return [self.matches(p) for p in props_list]

    def match_units(self, tags_codes):
        return None  # properties are not in the consume queue: every unit is a candidate

    def match_message(self, message) -> bool:
        try:
            props = message.properties
        except ValueError as exc:  # a damaged record: its properties cannot be read
            log.warning("SQL92 filter %r: a message's properties cannot be read (%s); "
                        "it does not match", _clip(self.expression), exc)
            return False
        return self.matches(props)


def _syntax_error(text: str, exc: UnexpectedInput) -> FilterSyntaxError:
    if isinstance(exc, UnexpectedCharacters):
        return FilterSyntaxError(f"unexpected character {exc.char!r}", text, exc.line,
                                 exc.column, exc.pos_in_stream)
    tok = getattr(exc, "token", None)
    if isinstance(exc, UnexpectedToken) and tok is not None and tok.type != "$END":
        return FilterSyntaxError(f"unexpected {tok.value!r}", text, tok.line, tok.column,
                                 tok.start_pos)
    line, column = text.count("\n") + 1, len(text) - text.rfind("\n")
    empty = next(iter(_PARSER.lex(text)), None) is None
    return FilterSyntaxError("empty expression" if empty else "unexpected end of expression",
                             text, line, column, len(text))


def _check_length(expression: str) -> None:
    """Refuse an over-long expression before any work, and before it can become a cache key."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise FilterLimitError(f"expression is {len(expression)} characters long, over the "
                               f"expression length limit of {MAX_EXPRESSION_CHARS}", expression,
                               rule="expression length", limit=MAX_EXPRESSION_CHARS)


def _check_parentheses(expression: str) -> None:
    """Refuse parentheses nested past MAX_PARENTHESES_DEPTH at the first one too deep: the
    lexer stops there, so the check costs the tokens up to it (strings and comments are tokens
    of their own, their parentheses do not count)."""
    if expression.count("(") <= MAX_PARENTHESES_DEPTH:
        return
    depth = 0
    try:
        for tok in _PARSER.lex(expression):
            if tok.type == "LPAR":
                depth += 1
                if depth > MAX_PARENTHESES_DEPTH:
                    raise FilterLimitError(
                        f"parentheses nest deeper than the parenthesis depth limit of "
                        f"{MAX_PARENTHESES_DEPTH}", expression, tok.line, tok.column,
                        tok.start_pos, rule="parenthesis depth", limit=MAX_PARENTHESES_DEPTH)
            elif tok.type == "RPAR":
                depth -= 1
    except UnexpectedInput:  # not even tokens: the parse says where
        return


def compile_uncached(expression: str) -> Sql92Expression:
    """Parse and compile ``expression``; raises FilterSyntaxError or FilterLimitError."""
    if not isinstance(expression, str):
        raise FilterSyntaxError(f"expression must be a string, not {type(expression).__name__}",
                                expression)
    _check_length(expression)
    _check_parentheses(expression)
    try:
        # The parser runs _Compiler as it parses: the tree it returns is the compiled root node.
        compiled: _Node = _PARSER.parse(expression)  # type: ignore[assignment]
        return Sql92Expression(expression, compiled.fn)
    except UnexpectedInput as exc:
        raise _syntax_error(expression, exc) from None
    except FilterSyntaxError as exc:
        raise exc.locate(expression) from None


_cache: OrderedDict = OrderedDict()
_cache_lock = threading.Lock()


def compile_expression(expression: str) -> Sql92Expression:
    """``compile_uncached`` behind an LRU of CACHE_SIZE entries that also remembers failures."""
    if not isinstance(expression, str):
        return compile_uncached(expression)
    _check_length(expression)
    with _cache_lock:
        hit = _cache.get(expression)
        if hit is not None:
            _cache.move_to_end(expression)
    if hit is None:
        try:
            hit = compile_uncached(expression)
        except FilterSyntaxError as exc:
            hit = exc
        with _cache_lock:
            hit = _cache.setdefault(expression, hit)
            if len(_cache) > CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(hit, FilterSyntaxError):
        raise hit.with_traceback(None)
    return hit


def clear_cache() -> None:
    with _cache_lock:
        _cache.clear()

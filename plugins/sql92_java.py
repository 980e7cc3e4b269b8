"""Java's value semantics for SQL92 selectors: RocketMQ's type conversions and comparisons.

A plain int is a Java Integer, ``Long`` a Java long, a float a Double, a bool a Boolean.
"""

from __future__ import annotations

import math
import re
import unicodedata

INT_MIN, INT_MAX = -(1 << 31), (1 << 31) - 1
LONG_MIN, LONG_MAX = -(1 << 63), (1 << 63) - 1


def _clip(text, width: int = 60):
    """Text for a message: expressions, sub-expressions and values can be huge."""
    short = not isinstance(text, str) or len(text) <= width
    return text if short else f"{text[:width]}... ({len(text)} characters)"


class EvaluationError(ValueError):
    """A value could not be converted; the evaluation fails and the message does not match."""


class Long(int):
    """A Java long. A plain int is a Java Integer, a float a Double, a bool a Boolean."""

    __slots__ = ()


# -- Java conversions ----------------------------------------------------------------------
_INT_RE = re.compile(r"[+-]?\d++")  # Character.digit accepts any (BMP) Unicode decimal digit
_JAVA_TRIM = "".join(map(chr, range(33)))  # String.trim() strips every char <= U+0020
# Possessive quantifiers: backtracking took seconds on a value of a few thousand digits + "x".
_DOUBLE_RE = re.compile(
    r"(?P<sign>[+-]?)(?:(?P<special>NaN|Infinity)"
    r"|(?:(?P<dec>(?:[0-9]++(?:\.[0-9]*+)?|\.[0-9]++)(?:[eE][+-]?[0-9]++)?)"
    r"|(?P<hex>0[xX](?:[0-9a-fA-F]++(?:\.[0-9a-fA-F]*+)?|\.[0-9a-fA-F]++)[pP][+-]?[0-9]++))"
    r"[fFdD]?)")
_LONG_DIGITS = 19  # len(str(LONG_MAX))


def _parse_integral(s: str, lo: int, hi: int, kind: str) -> int:
    if type(s) is not str:
        raise EvaluationError(f"{s!r} is not a string")
    if _INT_RE.fullmatch(s) is None or (not s.isascii() and max(s) > "\uffff"):
        raise EvaluationError(f"{_clip(s)!r} is not an {kind}")
    try:
        value = int(s)
    except ValueError:  # over 4300 digits: Python refuses, Java reads past leading zeros
        head, sign = s[:-_LONG_DIGITS].lstrip("+-"), "-" if s[0] == "-" else ""
        value = hi + 1 if any(map(unicodedata.digit, head)) else int(sign + s[-_LONG_DIGITS:])
    if not lo <= value <= hi:
        raise EvaluationError(f"{_clip(s)!r} is out of {kind} range")
    return value


def parse_int(s: str) -> int:
    """``Integer.valueOf(String)``."""
    return _parse_integral(s, INT_MIN, INT_MAX, "int")


def parse_long(s: str) -> Long:
    """``Long.valueOf(String)``."""
    return Long(_parse_integral(s, LONG_MIN, LONG_MAX, "long"))


def parse_double(s: str) -> float:
    """``Double.valueOf(String)``: trims, accepts NaN, Infinity, f/d suffixes and hex floats."""
    if type(s) is not str:
        raise EvaluationError(f"{s!r} is not a string")
    m = _DOUBLE_RE.fullmatch(s.strip(_JAVA_TRIM))
    if m is None:
        raise EvaluationError(f"{_clip(s)!r} is not a double")
    sign, special, dec, hexa = m.group("sign", "special", "dec", "hex")
    if special:
        return math.nan if special == "NaN" else float(sign + "inf")
    if dec:
        return float(sign + dec)
    try:
        return float.fromhex(sign + hexa)
    except OverflowError:
        return float(sign + "inf")


def parse_boolean(s: str) -> bool:
    """``Boolean.valueOf(String)``: never fails."""
    return s.lower() == "true"


_FROM_STRING = {bool: parse_boolean, int: parse_int, Long: parse_long, float: parse_double}


def compare_doubles(a: float, b: float) -> int:
    """``Double.compare``: -0.0 < 0.0 and NaN is equal to itself and above everything."""
    if a < b:
        return -1
    if a > b:
        return 1
    if a == b:
        return 0 if a != 0.0 else int(math.copysign(1, a) - math.copysign(1, b)) // 2
    return (a != a) - (b != b)


def compare(lv, rv) -> int:
    """RocketMQ's ``ComparisonExpression.__compare`` with string conversion enabled."""
    lt, rt = type(lv), type(rv)
    if lt is rt:
        return compare_doubles(lv, rv) if lt is float else (lv > rv) - (lv < rv)
    if lt is str:
        conv = _FROM_STRING.get(rt)
        return -1 if conv is None else compare(conv(lv), rv)
    if rt is str:
        if lt is bool:
            raise EvaluationError("a Boolean cannot be compared with a String on its right")
        return compare(lv, _FROM_STRING[lt](rv))
    if lt is bool or rt is bool:
        return -1
    if lt is float or rt is float:
        return compare_doubles(float(lv), float(rv))
    return (lv > rv) - (lv < rv)  # Integer against Long

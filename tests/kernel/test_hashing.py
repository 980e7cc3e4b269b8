"""On-disk hash functions: Java String.hashCode, mmh3, masked CRC32, Java remainder."""

from __future__ import annotations

import zlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.format.index_layout import index_hash
from mqstore.hashing import (
    HASH_JAVA, HASH_MMH3, crc32, java_remainder, java_string_hash, mmh3_string_hash,
    string_hasher,
)

# ---------------------------------------------------------------------------------------------
# java_string_hash
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("TagA", 2598919),
        ("TagB", 2598920),
        ("Aa", 2112),
        ("BB", 2112),
        ("polygenelubricants", -2147483648),
        ("", 0),
        ("a", 97),
        ("T#k1", 2539445),
        ("hello", 99162322),
    ],
)
def test_java_hash_spec_examples(text, expected):
    assert java_string_hash(text) == expected


def test_java_hash_of_emoji_uses_utf16_surrogates():
    # U+1F600 is the surrogate pair D83D DE00 in UTF-16: 31 * 0xD83D + 0xDE00.
    assert 31 * 0xD83D + 0xDE00 == 1772899
    assert java_string_hash("\U0001F600") == 1772899


def test_java_hash_of_emoji_after_text():
    # "a" then D83D DE00: (97 * 31 + 0xD83D) * 31 + 0xDE00
    assert java_string_hash("a\U0001F600") == (97 * 31 + 0xD83D) * 31 + 0xDE00 == 1866116


def test_java_hash_of_bmp_character_above_ascii():
    assert java_string_hash("\u00e9") == 0xE9
    assert java_string_hash("\u65e5\u672c") == 0x65E5 * 31 + 0x672C


def _reference_java_hash(text: str) -> int:
    h = 0
    for ch in text:
        cp = ord(ch)
        if cp > 0xFFFF:
            cp -= 0x10000
            units = (0xD800 + (cp >> 10), 0xDC00 + (cp & 0x3FF))
        else:
            units = (cp,)
        for u in units:
            h = (h * 31 + u) % (1 << 32)
    return h - (1 << 32) if h >= (1 << 31) else h


@settings(max_examples=200)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_java_hash_matches_reference(text):
    h = java_string_hash(text)
    assert -(1 << 31) <= h < (1 << 31)
    assert h == _reference_java_hash(text)


# ---------------------------------------------------------------------------------------------
# mmh3_string_hash
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", 0),
        ("hello", 0x248BFA47),
        ("The quick brown fox jumps over the lazy dog", 0x2E4FF723),
    ],
)
def test_mmh3_known_vectors(text, expected):
    assert mmh3_string_hash(text) == expected


@settings(max_examples=100)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=40))
def test_mmh3_is_signed_int32(text):
    h = mmh3_string_hash(text)
    assert -(1 << 31) <= h < (1 << 31)


def test_string_hasher():
    assert string_hasher(HASH_JAVA) is java_string_hash
    assert string_hasher(HASH_MMH3) is mmh3_string_hash
    assert HASH_JAVA == "java" and HASH_MMH3 == "mmh3"
    with pytest.raises(ValueError, match="'sha1'"):
        string_hasher("sha1")


# ---------------------------------------------------------------------------------------------
# index hash (behaviour 52)
# ---------------------------------------------------------------------------------------------


def test_index_hash_behaviour_52():
    assert index_hash("polygenelubricants", java_string_hash) == 0
    assert index_hash("T#k1", java_string_hash) == 2539445


def test_index_hash_takes_absolute_value():
    assert java_string_hash("Hello World") == -862545276
    assert index_hash("Hello World", java_string_hash) == 862545276


# ---------------------------------------------------------------------------------------------
# crc32
# ---------------------------------------------------------------------------------------------


def test_crc32_examples():
    assert crc32(b"hello") == 907060870 == 0x3610A686
    assert crc32(b"") == 0
    # zlib gives 0xCBF43926 for the standard check string; the sign bit is dropped.
    assert zlib.crc32(b"123456789") == 0xCBF43926
    assert crc32(b"123456789") == 0x4BF43926
    assert crc32(bytearray(b"hello")) == 907060870
    assert crc32(memoryview(b"xhellox")[1:6]) == 907060870


@settings(max_examples=100)
@given(st.binary(max_size=200))
def test_crc32_is_masked_zlib(data):
    assert crc32(data) == zlib.crc32(data) & 0x7FFFFFFF
    assert 0 <= crc32(data) <= 0x7FFFFFFF


# ---------------------------------------------------------------------------------------------
# java_remainder
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("a", "n", "expected"),
    [(-7, 4, -3), (7, 4, 3), (7, -4, 3), (-7, -4, -3), (0, 5, 0), (-8, 4, 0),
     (-2147483648, 10, -8), (2539445, 5_000_000, 2539445)],
)
def test_java_remainder_examples(a, n, expected):
    assert java_remainder(a, n) == expected


@settings(max_examples=200)
@given(st.integers(-(1 << 63), (1 << 63) - 1),
       st.integers(-(1 << 31), (1 << 31) - 1).filter(lambda n: n != 0))
def test_java_remainder_truncates_toward_zero(a, n):
    r = java_remainder(a, n)
    q = abs(a) // abs(n)
    if (a < 0) != (n < 0):
        q = -q
    assert a == n * q + r
    assert abs(r) < abs(n)
    assert r == 0 or (r < 0) == (a < 0)

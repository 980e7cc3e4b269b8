"""Properties string (spec section 3, behaviour 17) and socket-address parsing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.format.hosts import Host, parse_host
from mqstore.format.properties import (
    check_property, decode_encoded, decode_properties, encode_properties, find_property,
)

# ---------------------------------------------------------------------------------------------
# decode_properties (string2messageProperties)
# ---------------------------------------------------------------------------------------------


def test_behaviour_17_drops_malformed_segments():
    assert decode_properties("A\x01B\x02C\x01\x02\x01D\x02E\x01F") == {"A": "B", "E": "F"}


def test_behaviour_17_value_keeps_later_separators():
    assert decode_properties("K\x01a\x01b\x02") == {"K": "a\x01b"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", {}),
        ("\x02", {}),
        ("\x02\x02\x02", {}),
        ("A\x01B", {"A": "B"}),
        ("A\x01B\x02", {"A": "B"}),
        ("A\x01", {}),
        ("\x01B", {}),
        ("AB", {}),
        ("A\x01\x01", {"A": "\x01"}),
        ("\x01\x01B", {}),
        ("AB\x01CD\x02EF\x01GH\x02", {"AB": "CD", "EF": "GH"}),
        ("A\x01x\x02A\x01y\x02", {"A": "y"}),
        ("A\x01x\x02A\x01\x02", {"A": "x"}),
        ("TAGS\x01TagA\x02", {"TAGS": "TagA"}),
        ("KEYS\x01k1 k2\x02TAGS\x01T\x02", {"KEYS": "k1 k2", "TAGS": "T"}),
        ("\u00e9\x01\u65e5\u672c\x02", {"\u00e9": "\u65e5\u672c"}),
    ],
)
def test_decode_properties_examples(text, expected):
    assert decode_properties(text) == expected


# ---------------------------------------------------------------------------------------------
# encode_properties
# ---------------------------------------------------------------------------------------------


def test_encode_properties_example():
    assert encode_properties({"TAGS": "TagA"}) == "TAGS\x01TagA\x02"
    assert encode_properties({"A": "1", "B": "2"}) == "A\x011\x02B\x012\x02"
    assert encode_properties({}) == ""


def test_encode_properties_skips_transient_names():
    props = {"__RMQ.TRANSIENT.X": "1", "A": "B", "__RMQ.TRANSIENT.": "2"}
    assert encode_properties(props) == "A\x01B\x02"


VALID_TEXT = st.text(
    alphabet=st.characters(blacklist_characters="\x01\x02", blacklist_categories=("Cs",)),
    min_size=1, max_size=16,
)
valid_maps = st.dictionaries(
    VALID_TEXT.filter(lambda k: not k.startswith("__RMQ.TRANSIENT.")), VALID_TEXT, max_size=8,
)


@settings(max_examples=200)
@given(valid_maps)
def test_properties_round_trip(props):
    text = encode_properties(props)
    assert decode_properties(text) == props
    assert text.count("\x02") == len(props)
    assert text == "" or text.endswith("\x02")


@settings(max_examples=200)
@given(valid_maps)
def test_find_property_on_encoded_valid_map(props):
    raw = encode_properties(props).encode("utf-8")
    for name, value in props.items():
        assert find_property(raw, name.encode("utf-8")) == value.encode("utf-8")
    assert find_property(raw, b"\xff-absent") is None


SEP_TEXT = st.text(alphabet="AB\x01\x02", max_size=30)
NAMES = st.text(alphabet="AB", min_size=1, max_size=3)


@settings(max_examples=200)
@given(SEP_TEXT, NAMES)
def test_find_property_agrees_with_decode_properties(text, name):
    expected = decode_properties(text).get(name)
    got = find_property(text.encode("ascii"), name.encode("ascii"))
    assert got == (None if expected is None else expected.encode("ascii"))


@pytest.mark.parametrize(
    ("raw", "name", "expected"),
    [
        (b"TAGS\x01TagA\x02", b"TAGS", b"TagA"),
        (b"TAGS\x01TagA\x02", b"TAG", None),
        (b"TAGS\x01TagA\x02", b"AGS", None),
        (b"XTAGS\x01a\x02TAGS\x01b\x02", b"TAGS", b"b"),
        (b"XTAGS\x01a\x02", b"TAGS", None),
        (b"K\x01v\x01TAGS\x01w\x02", b"TAGS", None),
        (b"A\x01x\x02A\x01\x02", b"A", b"x"),
        (b"A\x01x\x02A\x01y", b"A", b"y"),
        (b"A\x01a\x01b\x02", b"A", b"a\x01b"),
        (b"", b"A", None),
    ],
)
def test_find_property_examples(raw, name, expected):
    assert find_property(raw, name) == expected


# ---------------------------------------------------------------------------------------------
# check_property
# ---------------------------------------------------------------------------------------------


def test_check_property_accepts_plain_pair():
    assert check_property("TAGS", "TagA") is None
    assert check_property("k", "\u65e5") is None


@pytest.mark.parametrize(
    ("name", "value", "shown"),
    [
        ("", "v", "''"),
        (None, "v", "None"),
        (5, "v", "5"),
        ("k", "", "''"),
        ("k", None, "None"),
        ("a\x01b", "v", "'a\\x01b'"),
        ("a\x02b", "v", "'a\\x02b'"),
        ("k", "x\x01", "'x\\x01'"),
        ("k", "x\x02", "'x\\x02'"),
    ],
)
def test_check_property_rejects(name, value, shown):
    with pytest.raises(ValueError) as exc:
        check_property(name, value)
    assert shown in str(exc.value)


# ---------------------------------------------------------------------------------------------
# parse_host
# ---------------------------------------------------------------------------------------------


def test_parse_host_ipv4():
    h = parse_host("127.0.0.1:50000")
    assert h == Host(b"\x7f\x00\x00\x01", 50000)
    assert not h.is_v6
    assert str(h) == "127.0.0.1:50000"


def test_parse_host_ipv6():
    h = parse_host("[::1]:8080")
    assert h == Host(bytes(15) + b"\x01", 8080)
    assert h.is_v6
    assert str(h) == "[::1]:8080"
    assert parse_host("[2001:db8::1]:0") == Host(
        bytes.fromhex("20010db8000000000000000000000001"), 0)


def test_parse_host_port_bounds():
    assert parse_host("1.2.3.4:0").port == 0
    assert parse_host("1.2.3.4:65535").port == 65535
    assert parse_host("[::1]:65535").port == 65535


@pytest.mark.parametrize(
    "bad",
    ["nonsense", "1.2.3.4", "1.2.3.4:", "1.2.3.4:abc", "1.2.3.4:-1", "1.2.3.4:2147483648",
     "1.2.3.4:65536", "1.2.3.4:99999", "[::1]:65536", "1.2.3.4:80\n", "1.2.3.4: 80",
     "1.2.3.4:+80", "1.2.3.4:8_0", "1.2.3.4:\u0668\u0660", "::1:80",
     "256.0.0.1:80", "[::1]8080", "[::1]", "[zz::1]:80", "localhost:80", ":80", ""],
)
def test_parse_host_errors_name_the_value(bad):
    with pytest.raises(ValueError) as exc:
        parse_host(bad)
    assert repr(bad) in str(exc.value)


@pytest.mark.parametrize("bad", [None, 80, b"1.2.3.4:80"])
def test_parse_host_rejects_non_strings(bad):
    with pytest.raises(ValueError) as exc:
        parse_host(bad)
    assert repr(bad) in str(exc.value)


@settings(max_examples=200)
@given(st.one_of(st.binary(min_size=4, max_size=4), st.binary(min_size=16, max_size=16)),
       st.integers(0, 65535))
def test_host_str_parse_round_trip(address, port):
    h = Host(address, port)
    assert parse_host(str(h)) == h


# ---------------------------------------------------------------------------------------------
# decode_encoded: properties kept with the text they came as
# ---------------------------------------------------------------------------------------------

PROPERTY_TEXT = st.lists(st.sampled_from(
    ["\x01", "\x02", "A", "b", "KEYS", "TAGS", "k 1", "\u00e9", "__RMQ.TRANSIENT.", "CLUSTER",
     "", "\x00"]), max_size=12).map("".join)


@settings(max_examples=500, deadline=None)
@given(text=PROPERTY_TEXT, value=st.sampled_from(["DefaultCluster", "c", "", "a\x02b", "\u00e9"]))
def test_encoded_properties_are_what_decoding_and_encoding_give(text, value):
    general = decode_properties(text)
    general.update({"CLUSTER": value})
    got = decode_encoded(text, "CLUSTER", value)
    if got is None:  # the caller decodes the general way
        return
    assert got == general and list(got) == list(general)
    assert got.text == encode_properties(general) == encode_properties(got)
    assert got.text == text + f"CLUSTER\x01{value}\x02"
    for name, item in got.items():
        check_property(name, item)
        assert name.isascii() and item.isascii()


@pytest.mark.parametrize("text", [
    "", "KEYS\x01k1 k2\x02TAGS\x01bench\x02UNIQ_KEY\x01AB01\x02WAIT\x01true\x02", "A\x01b\x02",
])
def test_plain_encodings_keep_their_text(text):
    got = decode_encoded(text, "CLUSTER", "DefaultCluster")
    assert got is not None and got.text == text + "CLUSTER\x01DefaultCluster\x02"
    assert got == {**decode_properties(text), "CLUSTER": "DefaultCluster"}


@pytest.mark.parametrize("text, name, value", [
    ("A\x01b", "C", "v"),  # no trailing separator
    ("A\x01b\x02A\x01c\x02", "C", "v"),  # a name twice: the later wins when decoded
    ("A\x01b\x01c\x02", "C", "v"),  # a separator inside a value
    ("A\x01\x02B\x01c\x02", "C", "v"), ("\x01b\x02", "C", "v"), ("\x02A\x01b\x02", "C", "v"),
    ("A\x01b\x02X\x02", "C", "v"),  # a segment that decoding drops
    ("__RMQ.TRANSIENT.X\x01b\x02", "C", "v"),  # not stored by the encoding
    ("A\x01\u00e9\x02", "C", "v"),  # not ASCII
    ("C\x01old\x02", "C", "v"),  # the name is there already
    ("A\x01b\x02", "C", ""), ("A\x01b\x02", "C", "a\x01b"), ("A\x01b\x02", "", "v"),
])
def test_other_texts_are_left_to_the_general_decoding(text, name, value):
    assert decode_encoded(text, name, value) is None


def test_encoded_properties_forget_their_text_when_changed_and_copy_as_dicts():
    import copy
    import pickle
    changes = (lambda p: p.__setitem__("A", "x"), lambda p: p.update(A="x"),
               lambda p: p.pop("A"), lambda p: p.setdefault("Z", "z"), lambda p: p.clear(),
               lambda p: p.popitem(), lambda p: p.__delitem__("A"),
               lambda p: p.__ior__({"Z": "z"}))
    for change in changes:
        got = decode_encoded("A\x01b\x02", "C", "v")
        assert got.text == "A\x01b\x02C\x01v\x02"
        change(got)
        assert got.text is None
    got = decode_encoded("A\x01b\x02", "C", "v")
    assert got == {"A": "b", "C": "v"}
    for other in (pickle.loads(pickle.dumps(got)), copy.copy(got), dict(got)):
        assert type(other) is dict and other == got

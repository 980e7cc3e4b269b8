"""Batch key extraction and batch MurmurHash3 give exactly the per-message answers."""

from __future__ import annotations

import mmh3
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore.format.murmur3 import hash_matrix, hash_ranges
from mqstore.format.properties import find_property
from mqstore.format.property_keys import key_ranges

# Property strings built from the pieces that matter: names, separators, spaces, near-names.
_piece = st.sampled_from([b"KEYS", b"UNIQ_KEY", b"\x01", b"\x02", b" ", b"a", b"bc", b"XKEYS",
                          b"KEY", b"\xe4\xb8\xad"])
_props = st.lists(st.lists(_piece, max_size=14).map(b"".join), max_size=8)


def walk(props: list[bytes]) -> list[tuple[int, bytes]]:
    """What the index puts per message: UNIQ_KEY, then each non-empty KEYS token."""
    out = []
    for i, raw in enumerate(props):
        uniq, keys = find_property(raw, b"UNIQ_KEY"), find_property(raw, b"KEYS")
        tokens = ([uniq] if uniq is not None else []) + (
            [t for t in keys.split(b" ") if t] if keys is not None else [])
        out += [(i, t) for t in tokens]
    return out


@settings(max_examples=400)
@given(_props)
def test_key_ranges_match_decoding_each_message(props):
    r = key_ranges(props)
    got = [(int(m), bytes(r.data[s:s + n])) for m, s, n in zip(r.message, r.start, r.length)]
    assert got == walk(props)


def test_key_ranges_of_real_properties():
    props = [b"TAGS\x01t\x02KEYS\x01k1 k2  k3\x02UNIQ_KEY\x01U1", b"", b"KEYS\x01solo",
             b"WAIT\x01true"]
    r = key_ranges(props)
    assert [(int(m), bytes(r.data[s:s + n])) for m, s, n in zip(r.message, r.start, r.length)] \
        == [(0, b"U1"), (0, b"k1"), (0, b"k2"), (0, b"k3"), (2, b"solo")]


@settings(max_examples=300)
@given(st.lists(st.binary(max_size=40), max_size=30), st.binary(max_size=12))
def test_hash_ranges_equal_mmh3(keys, prefix):
    data = np.frombuffer(b"".join(keys), dtype=np.uint8)
    lengths = np.array([len(k) for k in keys], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    got = hash_ranges(data, starts, lengths, prefix).tolist()
    assert got == [mmh3.hash(prefix + k) for k in keys]


def test_known_vectors():
    # Reference values of MurmurHash3_x86_32 with seed 0 (as signed 32-bit integers).
    rows = [b"", b"a", b"abcd", b"hello, world"]
    for key in rows:
        m = np.frombuffer(key, dtype=np.uint8).reshape(1, len(key))
        assert int(hash_matrix(m)[0]) == mmh3.hash(key)
    assert mmh3.hash(b"") == 0 and mmh3.hash(b"abcd") == 1139631978

"""A message whose properties came encoded (``EncodedProperties``: a remoting send's) is put
with that text as its properties block, unchecked again: the same records, refusals and
errors as the same properties in a plain dict."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import Message, PutStatus
from mqstore.append import encoding
from mqstore.append.encoding import PutContext, Rejected, prepare
from mqstore.format.hosts import parse_host
from mqstore.format.properties import EncodedProperties, decode_encoded

CTX = [PutContext(parse_host("127.0.0.1:10911"), 4 << 20, True, False, crc)
       for crc in (False, True)]
NAMES = st.sampled_from(["KEYS", "TAGS", "WAIT", "DELAY", "INNER_NUM", "UNIQ_KEY", "A",
                         "__CRC32#", "__CRC32\"", "__CRC33#", "TRAN_MSG"])
VALUES = st.sampled_from(["k1 k2", "bench", "true", "false", "0", "3", "x", "a" * 40000])


def outcome(message: Message, ctx: PutContext):
    try:
        return "prepared", prepare(message, ctx)
    except Rejected as rej:
        return "refused", rej.status, rej.reason
    except (ValueError, TypeError) as exc:
        return "raised", type(exc), str(exc)


def both(text: str, cluster: str = "DefaultCluster", **fields):
    """The message with its properties encoded, and with them in a plain dict."""
    encoded = decode_encoded(text, "CLUSTER", cluster)
    assert encoded is not None
    plain = dict(encoded)
    return (Message("T", b"body", queue_id=1, properties=encoded, **fields),
            Message("T", b"body", queue_id=1, properties=plain, **fields))


@settings(max_examples=400, deadline=None)
@given(pairs=st.lists(st.tuples(NAMES, VALUES), max_size=5, unique_by=lambda p: p[0]),
       ctx=st.sampled_from(CTX), tags=st.sampled_from([None, "t"]),
       keys=st.sampled_from([None, "k"]), sysflag=st.sampled_from([0, 1, 8]))
def test_encoded_properties_prepare_as_a_dict_of_them(pairs, ctx, tags, keys, sysflag):
    text = "".join(f"{name}\x01{value}\x02" for name, value in pairs)
    fast, general = both(text, tags=tags, keys=keys, sysflag=sysflag)
    assert outcome(fast, ctx) == outcome(general, ctx)


def test_the_encoded_text_is_the_block_without_checking_each_property(monkeypatch):
    fast, general = both("KEYS\x01k1\x02TAGS\x01bench\x02UNIQ_KEY\x01AB01\x02WAIT\x01false\x02")
    expected = prepare(general, CTX[1])
    assert not expected.wait

    def checked_again(*args):
        raise AssertionError("a property was checked again")
    monkeypatch.setattr(encoding, "check_property", checked_again)
    monkeypatch.setattr(encoding, "encode_properties", checked_again)
    assert prepare(fast, CTX[1]) == expected
    with pytest.raises(AssertionError, match="checked again"):
        prepare(general, CTX[1])


def _log(store) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((Path(store.root) / "commitlog").iterdir()))


@pytest.mark.parametrize("text", [
    "KEYS\x01k1 k2\x02TAGS\x01bench\x02UNIQ_KEY\x01AB01\x02WAIT\x01true\x02",
    "", "DELAY\x012\x02", "__CRC32#\x01123\x02A\x01b\x02",
])
def test_stores_write_the_same_records_either_way(make_store, tmp_path, text):
    stores = [make_store(root=str(tmp_path / name)) for name in ("fast", "general")]
    for store, message in zip(stores, both(text, born_timestamp=1_700_000_000_000,
                                              born_host="127.0.0.1:5000")):
        r = store.put(message)
        assert r.status is PutStatus.PUT_OK, r
    assert _log(stores[0]) == _log(stores[1])


def test_a_name_near_the_crc_property_raises_either_way(make_store):
    store = make_store()
    for message in both("__CRC32\"\x01x\x02"):
        assert type(message.properties) in (EncodedProperties, dict)
        with pytest.raises(ValueError, match="within . bits of the store's __CRC32#"):
            store.put(message)

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
from mqstore.testing import wait_for

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


# -- one record: its own locked section, the records and state of the general one -------------

def _queues(store) -> dict:
    root = Path(store.root) / "consumequeue"
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


@pytest.mark.parametrize("record_crc", [False, True])
def test_single_puts_write_what_one_message_batches_write(make_store, tmp_path, manual_clock,
                                                          record_crc):
    """``put`` takes the one-record locked section, ``put_batch`` the general one: over
    segment rolls, several queues and a store time that would go back, the same records, queue offsets, answers and put counts."""
    overrides = {"commit_log": {"segment_bytes": 8192, "record_crc": record_crc}}
    single, batch = (make_store(overrides, root=str(tmp_path / name))
                     for name in ("single", "batch"))
    messages = [Message("T", bytes([i]) * (100 + 300 * (i % 7)), queue_id=i % 3,
                        properties={"K": str(i)}, born_timestamp=1_700_000_000_000 + i,
                        born_host="127.0.0.1:5000") for i in range(60)]
    answers = []
    for i, message in enumerate(messages):
        manual_clock.now = 1_700_000_000_500 + (i % 5) * 10  # back and forth
        one = single.put(message)
        many = batch.put_batch([message])
        assert one.status is many.status is PutStatus.PUT_OK
        answers.append(((one.queue_id, one.queue_offset, one.phys_offset, one.size,
                         one.store_timestamp),
                        (int(many.queue_ids[0]), int(many.queue_offsets[0]),
                         int(many.phys_offsets[0]), int(many.sizes[0]),
                         many.store_timestamp)))
    for one, many in answers:
        assert one == many
    assert answers[-1][0][2] > 8192  # several segments
    assert single.put_counts() == batch.put_counts()
    for store in (single, batch):
        store.flush_commit_log()
    assert _log(single) == _log(batch)
    wait_for(lambda: _queues(single) == _queues(batch) and _queues(single), timeout=30)


def test_encoded_properties_changed_after_decoding_are_put_as_they_are_now():
    """A ``before_append`` hook may change a remoting send's properties in place: the put
    stores them as they are then, not the text they came as."""
    for change in (lambda p: p.__setitem__("TRACE", "t1"), lambda p: p.pop("A"),
                   lambda p: p.update(A="changed")):
        fast, general = both("A\x01b\x02TAGS\x01bench\x02")
        change(fast.properties)
        change(general.properties)
        for ctx in CTX:
            assert outcome(fast, ctx) == outcome(general, ctx)
        block = encoding.properties_block(fast.properties)
        assert block == encoding.properties_block(general.properties)

"""Input validation: every entry path answers a bad message the same way and writes nothing.

``put(Message)``, ``put_batch([Message, ...])`` and ``put_batch(MessageBatch)`` share one rule:
a bad argument raises ValueError/TypeError naming the value (a batch names the message index);
a well-formed message the store will not hold is refused with a status and a reason. Strings
bound for the properties block (tags, keys, property names and values) may not forge other
properties; ports are 16-bit; a record the store could not read back is never written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mqstore import Message, MessageBatch, PutStatus, load_config
from mqstore.errors import ConfigError
from mqstore.format.hosts import Host
from mqstore.format.properties import TRANSIENT_PREFIX
from mqstore.format.record import MAGIC_V1, MAGIC_V2, encode_record
from mqstore.message import BatchPutResult, StoredMessage

FORGED_KEY = "k\x02TAGS\x01b\x02UNIQ_KEY\x01forged"
LONG_RETRY = "%RETRY%" + "g" * 150  # 157 bytes: V2 only
FUNCTION_FIXTURE = [HealthCheck.function_scoped_fixture]


@pytest.fixture
def store(make_store):
    return make_store({"commit_log": {"max_message_bytes": 1000}})


def good(**kw) -> Message:
    kw.setdefault("queue_id", 0)
    return Message(kw.pop("topic", "T"), kw.pop("body", b"ok"), **kw)


def log_files(store) -> dict[str, bytes]:
    root = Path(store.root) / "commitlog"
    return {p.name: p.read_bytes() for p in sorted(root.glob("*"))}


def snapshot(store):
    return store.max_phys_offset, log_files(store)


def as_batch(messages: list[Message]) -> MessageBatch:
    """The MessageBatch standing for ``messages`` (whose batch-wide fields agree)."""
    shared = {f: getattr(messages[0], f) for f in ("flag", "born_timestamp", "born_host")}
    for m in messages:
        assert all(getattr(m, f) is v or getattr(m, f) == v for f, v in shared.items())
        assert m.sysflag == 0 and m.reconsume_times == 0 and m.prepared_tx_offset == 0
    return MessageBatch(
        topic=[m.topic for m in messages], bodies=[m.body for m in messages],
        queue_ids=[m.queue_id for m in messages], tags=[m.tags for m in messages],
        keys=[m.keys for m in messages], properties=[m.properties for m in messages], **shared)


def outcome(call):
    try:
        r = call()
    except (ValueError, TypeError) as exc:
        return "raised", type(exc), str(exc)
    if isinstance(r, BatchPutResult):
        return "answered", r.status, r.error, r.error_index
    return "answered", r.status, r.error, None


def same_everywhere(store, messages: list[Message], index: int):
    """Put ``messages[index]`` alone, then all as a list and as a MessageBatch; the answers
    must agree and nothing may be written. Returns the single put's outcome."""
    before = snapshot(store)
    single = outcome(lambda: store.put(messages[index]))
    listed = outcome(lambda: store.put_batch(messages))
    columns = outcome(lambda: store.put_batch(as_batch(messages)))
    assert listed == columns
    if single[0] == "raised":
        assert listed == ("raised", single[1], f"message {index}: {single[2]}")
    else:
        assert single[1] is not PutStatus.PUT_OK
        assert listed == ("answered", single[1], f"message {index}: {single[2]}", index)
    assert snapshot(store) == before
    return single


def still_writable(store):
    r = store.put(good())
    assert r.status is PutStatus.PUT_OK
    return r


# -- bad arguments raise the same everywhere -------------------------------------------------

BAD_PER_MESSAGE = [
    ({"keys": [FORGED_KEY]},
     "key 'k\\x02TAGS\\x01b\\x02UNIQ_KEY\\x01forged' contains a reserved separator"),
    ({"keys": FORGED_KEY}, "contains a reserved separator (\\x01 or \\x02)"),
    ({"keys": ["ok", "a b"]}, "key 'a b' must be a non-empty string without spaces"),
    ({"keys": ["ok", ""]}, "key '' must be a non-empty string without spaces"),
    ({"keys": "a  b"}, "key '' must be a non-empty string without spaces"),
    ({"keys": ["ok", 5]}, "key 5 must be a non-empty string"),
    ({"keys": 5}, "keys 5 must be a string or a collection of strings"),
    ({"keys": b"k1"}, "keys b'k1' must be a string or a collection of strings"),
    ({"keys": ["\udcff"]}, "key '\\udcff' cannot be stored as UTF-8"),
    ({"tags": "a\x02UNIQ_KEY\x01forged"},
     "tags 'a\\x02UNIQ_KEY\\x01forged' contains a reserved separator"),
    ({"tags": "a\x01"}, "tags 'a\\x01' contains a reserved separator"),
    ({"tags": ""}, "tags '' must be a non-empty string"),
    ({"tags": 7}, "tags 7 must be a non-empty string"),
    ({"tags": "\ud800"}, "tags '\\ud800' cannot be stored as UTF-8"),
    ({"properties": {"p": "v\x02TAGS\x01b"}},
     "property 'p' value 'v\\x02TAGS\\x01b' contains a reserved separator"),
    ({"properties": {"a\x01b": "v"}}, "property name 'a\\x01b' contains a reserved separator"),
    ({"properties": {"p": ""}}, "property 'p' value '' must be a non-empty string"),
    ({"properties": {"p": "\udc80"}}, "cannot be stored as UTF-8"),
    ({"properties": [("a", "b")]}, "properties [('a', 'b')] must be a mapping"),
    ({"tags": "x", "properties": {"TAGS": "y"}},
     "property 'TAGS' is set both as a field and in properties"),
    ({"keys": ["k"], "properties": {"KEYS": "y"}},
     "property 'KEYS' is set both as a field and in properties"),
    ({"topic": "a\n"}, "topic 'a\\n' must match [%|a-zA-Z0-9_-]+"),
    ({"topic": "T\n"}, "topic 'T\\n' must match"),
    ({"topic": "a/b"}, "topic 'a/b' must match"),
    ({"topic": ["T"]}, "topic ['T'] must match"),
    ({"queue_id": -1}, "queue_id -1 must be an int in [0, 2147483647]"),
    ({"queue_id": True}, "queue_id True must be an int"),
    ({"queue_id": 1.5}, "queue_id 1.5 must be an int"),
    ({"body": "text"}, "body must be bytes, got str"),
]


@pytest.mark.parametrize("bad, needle", BAD_PER_MESSAGE)
def test_bad_argument_raises_alike_on_every_path(store, bad, needle):
    first = still_writable(store)
    kind, exc_type, text = same_everywhere(store, [good(), good(**bad), good(body=b"c")], 1)
    assert (kind, exc_type) == ("raised", ValueError)
    assert needle in text
    nxt = still_writable(store)
    assert (nxt.queue_offset, nxt.phys_offset) == (1, first.size)


BAD_BATCH_WIDE = [
    ({"flag": None}, "flag None must be an int in [-2147483648, 2147483647]"),
    ({"flag": 1.5}, "flag 1.5 must be an int"),
    ({"flag": False}, "flag False must be an int"),
    ({"flag": 1 << 31}, "flag 2147483648 must be an int"),
    ({"born_timestamp": "now"}, "born_timestamp 'now' must be an int"),
    ({"born_timestamp": True}, "born_timestamp True must be an int"),
    ({"born_timestamp": 1 << 63}, "born_timestamp 9223372036854775808 must be an int"),
    ({"born_timestamp": -(1 << 63) - 1}, "must be an int in [-9223372036854775808, "),
    ({"born_host": "1.2.3.4:99999"}, "port 99999 is outside 0..65535, the TCP/UDP port range"),
    ({"born_host": "[::1]:65536"}, "port 65536 is outside 0..65535"),
    ({"born_host": "1.2.3.4:80\n"}, "host '1.2.3.4:80\\n' is not 'ipv4:port' or '[ipv6]:port'"),
    ({"born_host": "::1:80"}, "an IPv6 address needs brackets"),
    ({"born_host": 80}, "host 80 must be a string"),
]


@pytest.mark.parametrize("bad, needle", BAD_BATCH_WIDE)
def test_bad_batch_wide_argument_raises_alike_on_every_path(store, bad, needle):
    # MessageBatch holds these once for all messages, so every message carries the bad value.
    kind, exc_type, text = same_everywhere(store, [good(**bad), good(**bad)], 0)
    assert (kind, exc_type) == ("raised", ValueError)
    assert needle in text
    still_writable(store)


def test_forged_keys_neither_store_nor_index(store):
    with pytest.raises(ValueError, match="reserved separator"):
        store.put(Message(topic="t", body=b"x", tags="a", keys=[FORGED_KEY]))
    assert store.max_phys_offset == 0
    ok = store.put(Message(topic="t", body=b"x", tags="a", keys=["k"]))
    store.wait_dispatched()
    assert store.query_by_unique_key("t", "forged") is None
    got = store.message_at(ok.phys_offset)
    assert (got.tags, got.keys, got.properties) == ("a", ["k"], {"TAGS": "a", "KEYS": "k"})


def test_rejected_tag_is_not_cached(store):
    for _ in range(2):
        with pytest.raises(ValueError, match="reserved separator"):
            store.put(good(tags="t\x01x"))
        with pytest.raises(ValueError, match="message 0: tags"):
            store.put_batch(MessageBatch("T", [b"a", b"b"], queue_ids=0, tags="t\x01x"))
    assert store.max_phys_offset == 0


def test_bad_argument_raises_even_after_a_refused_message(store):
    # Arguments are checked before refusals, so the answer does not depend on message order.
    messages = [good(body=None), good(), good(keys=["a b"])]
    for put in (lambda: store.put_batch(messages), lambda: store.put_batch(as_batch(messages))):
        with pytest.raises(ValueError) as info:
            put()
        assert str(info.value).startswith("message 2: key 'a b'")
    with pytest.raises(ValueError, match="key 'a b'"):
        store.put(good(body=None, keys=["a b"]))
    assert store.max_phys_offset == 0


# -- store-level refusals answer the same everywhere -----------------------------------------

REFUSED = [
    ({"body": None}, PutStatus.MESSAGE_ILLEGAL, "message body is None"),
    ({"body": b"x" * 1001}, PutStatus.MESSAGE_ILLEGAL,
     "body of 1001 bytes exceeds commit_log.max_message_bytes (1000)"),
    ({"properties": {"p": "\u00e9" * 16400}}, PutStatus.PROPERTIES_SIZE_EXCEEDED,
     "properties are 32803 bytes; the limit is 32767"),
    ({"keys": ["k" * 20000, "k" * 20000]}, PutStatus.PROPERTIES_SIZE_EXCEEDED,
     "properties are 40007 bytes"),
    ({"topic": "A" * 128}, PutStatus.MESSAGE_ILLEGAL,
     "is 128 bytes; the limit is 127 (255 for %RETRY% topics)"),
    ({"topic": "%RETRY%" + "a" * 249}, PutStatus.MESSAGE_ILLEGAL, "is 256 bytes; the limit is 127"),
    ({"properties": {"INNER_NUM": "2"}}, PutStatus.MESSAGE_ILLEGAL,
     "INNER_NUM property without the INNER_BATCH sysflag"),
]


@pytest.mark.parametrize("bad, status, reason", REFUSED)
def test_refusal_answers_alike_on_every_path(store, bad, status, reason):
    first = still_writable(store)
    kind, got_status, error, _ = same_everywhere(store, [good(), good(**bad), good()], 1)
    assert (kind, got_status) == ("answered", status)
    assert reason in error
    nxt = still_writable(store)
    assert (nxt.queue_offset, nxt.phys_offset) == (1, first.size)


def test_first_refused_message_is_named_on_both_batch_paths(store):
    messages = [good(), good(topic="A" * 128), good(body=None)]
    for batch in (messages, as_batch(messages)):
        r = store.put_batch(batch)
        assert (r.status, r.error_index) == (PutStatus.MESSAGE_ILLEGAL, 1)
        assert r.error.startswith("message 1: topic 'AAAA")
    # two refusals in one message: every path names the same one
    same_everywhere(store, [good(topic="A" * 128, body=None)], 0)
    assert store.max_phys_offset == 0


# -- long %RETRY% topics and the V2 setting --------------------------------------------------

def v2_off(make_store, tmp_path, name="v1"):
    return make_store({"commit_log": {"auto_v2_on_long_topic": False}}, root=tmp_path / name)


def test_long_retry_topic_without_v2_is_refused_naming_the_setting(make_store, tmp_path):
    store = v2_off(make_store, tmp_path)
    kind, status, reason, _ = same_everywhere(store, [good(), good(topic=LONG_RETRY)], 1)
    assert (kind, status) == ("answered", PutStatus.MESSAGE_ILLEGAL)
    assert "is 157 bytes" in reason
    assert "a V1 record holds at most 127" in reason
    assert "commit_log.auto_v2_on_long_topic: false" in reason
    assert store.max_phys_offset == 0
    # 127 bytes still fit a V1 record
    ok = store.put(good(topic="%RETRY%" + "g" * 120))
    assert ok.status is PutStatus.PUT_OK
    assert store.message_at(ok.phys_offset).magic == MAGIC_V1


@pytest.mark.parametrize("v2_store_first", [True, False])
def test_stores_with_different_v2_settings_share_no_encoding(make_store, tmp_path, v2_store_first):
    on = make_store(root=tmp_path / "on")
    off = v2_off(make_store, tmp_path)
    stores = [on, off] if v2_store_first else [off, on]
    for _ in range(2):  # the second round runs on cached tails
        for s in stores:
            r = s.put(good(topic=LONG_RETRY))
            if s is on:
                assert r.status is PutStatus.PUT_OK
                got = s.message_at(r.phys_offset)
                assert (got.topic, got.magic) == (LONG_RETRY, MAGIC_V2)
            else:
                assert r.status is PutStatus.MESSAGE_ILLEGAL
                assert s.max_phys_offset == 0
            r = s.put_batch(MessageBatch(LONG_RETRY, [b"a", b"b"], queue_ids=0))
            assert r.status is (PutStatus.PUT_OK if s is on else PutStatus.MESSAGE_ILLEGAL)
    on.wait_dispatched()
    assert on.max_offset(LONG_RETRY, 0) == 6


# -- ports ------------------------------------------------------------------------------------

def test_store_host_port_follows_the_same_rule():
    with pytest.raises(ConfigError) as info:
        load_config(overrides={"store": {"store_host": "127.0.0.1:99999"}})
    assert "store.store_host" in str(info.value)
    assert "port 99999 is outside 0..65535" in str(info.value)
    assert load_config(overrides={"store": {"store_host": "127.0.0.1:65535"}})


def test_stored_hosts_decode_whatever_their_port():
    # Reading takes what is on disk; only what users hand in is held to 0..65535.
    raw = encode_record(
        queue_id=0, flag=0, queue_offset=0, phys_offset=0, sysflag=0, born_timestamp=1,
        born_host=Host(b"\x7f\x00\x00\x01", 99999), store_timestamp=2,
        store_host=Host(b"\x0a\x00\x00\x01", 0x7FFFFFFF), reconsume_times=0,
        prepared_tx_offset=0, body=b"b", topic=b"T", properties=b"")
    m = StoredMessage.from_bytes(raw)
    assert (m.born_host, m.store_host) == ("127.0.0.1:99999", "10.0.0.1:2147483647")


# -- accepted inputs behave alike too ---------------------------------------------------------

def test_bytes_like_bodies_are_taken_on_every_path(make_store, tmp_path):
    messages = [good(body=bytearray(b"ba")), good(body=memoryview(b"mv")), good(body=b"b")]
    a = make_store(root=tmp_path / "a")
    b = make_store(root=tmp_path / "b")
    assert a.put_batch(messages).status is PutStatus.PUT_OK
    assert b.put_batch(as_batch(messages)).status is PutStatus.PUT_OK
    assert log_files(a) == log_files(b)


@pytest.mark.parametrize("delay", ["\u00b2", "\u0663", " 0 ", "x"])
def test_delay_values_int_cannot_parse_are_not_errors(store, delay):
    # "\u0663" is an Arabic-Indic 3: a real delay, refused in batches as any other
    messages = [good(), good(properties={"DELAY": delay})]
    assert store.put(messages[1]).status is PutStatus.PUT_OK
    expect = PutStatus.MESSAGE_ILLEGAL if delay == "\u0663" else PutStatus.PUT_OK
    assert store.put_batch(messages).status is expect
    assert store.put_batch(as_batch(messages)).status is expect


# -- property tests ---------------------------------------------------------------------------

_text = st.text(
    alphabet=st.one_of(st.sampled_from(["\x01", "\x02", " ", "\ud800", "a", "\u00e9", "\u65e5"]),
                       st.characters()),
    max_size=6,
)
_names = st.one_of(_text, st.sampled_from(["TAGS", "KEYS", "UNIQ_KEY", TRANSIENT_PREFIX + "x"]))


def _string_ok(s: object) -> bool:
    if not isinstance(s, str) or not s or "\x01" in s or "\x02" in s:
        return False
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def expected_properties(tags, keys, properties) -> dict[str, str] | None:
    """What the store keeps for these fields, or None when it must raise."""
    props = {}
    if tags is not None:
        if not _string_ok(tags):
            return None
        props["TAGS"] = tags
    if keys:
        if not all(_string_ok(k) and " " not in k for k in keys):
            return None
        props["KEYS"] = " ".join(keys)
    for name, value in (properties or {}).items():
        if not (_string_ok(name) and _string_ok(value)) or name in props:
            return None
        props[name] = value
    return {k: v for k, v in props.items() if not k.startswith(TRANSIENT_PREFIX)}


@settings(max_examples=200, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(tags=st.none() | _text, keys=st.none() | st.lists(_text, max_size=3),
       properties=st.none() | st.dictionaries(_names, _text, max_size=3))
def test_any_string_is_refused_or_round_trips_exactly(store, tags, keys, properties):
    expected = expected_properties(tags, keys, properties)
    m = Message("T", b"x", tags=tags, keys=keys, properties=properties, queue_id=0)
    puts = [lambda: store.put(m), lambda: store.put_batch([m]),
            lambda: store.put_batch(as_batch([m]))]
    for put in puts:
        before = snapshot(store)
        if expected is None:
            with pytest.raises(ValueError):
                put()
            assert snapshot(store) == before
            continue
        r = put()
        assert r.status is PutStatus.PUT_OK
        phys = r.phys_offsets[0] if isinstance(r, BatchPutResult) else r.phys_offset
        got = store.message_at(int(phys))
        assert got.properties == expected
        assert got.tags == expected.get("TAGS")
        assert got.keys == (keys or [k for k in expected.get("KEYS", "").split(" ") if k])


# Messages start clean and get up to two fields from the bad pool, so batches mix accepted,
# refused and raising messages.
_GOOD = {
    "topic": ["T", "U", "%RETRY%" + "r" * 130],
    "body": [b"x", b"", bytearray(b"ba")],
    "tags": [None, "a", "\u65e5\u672c"],
    "keys": [None, ["k1"], "k1 k2", []],
    "properties": [None, {"p": "1"}, {"WAIT": "false"}, {"DELAY": "\u00b2"}],
    "queue_id": [0, 1],
}
_BAD = {
    "topic": ["a\n", "A" * 128, "a/b"],
    "body": [None, "text", b"y" * 1001],
    "tags": ["", "a\x01b", "\ud800"],
    "keys": [["a b"], ["k\x02x"], 5],
    "properties": [{"DELAY": "2"}, {"INNER_NUM": "1"}, {"p": "\u00e9" * 20000}, {"p": "\x01"},
                   {"TAGS": "t"}, [("a", "b")]],
    "queue_id": [-1, True],
}


@st.composite
def _message(draw) -> dict:
    fields = {name: draw(st.sampled_from(pool)) for name, pool in _GOOD.items()}
    for name in draw(st.lists(st.sampled_from(sorted(_BAD)), max_size=2, unique=True)):
        fields[name] = draw(st.sampled_from(_BAD[name]))
    return fields


_shared = st.fixed_dictionaries({
    "flag": st.sampled_from([0, 7, 0, 7, None, 1.5]),
    "born_timestamp": st.sampled_from([None, 42, None, 42, "x"]),
    "born_host": st.sampled_from([None, "[::1]:5", None, "[::1]:5", "1.2.3.4:99999"]),
})


@pytest.fixture
def twin_stores(make_store, tmp_path):
    overrides = {"commit_log": {"max_message_bytes": 1000}}
    return (make_store(overrides, root=tmp_path / "list"),
            make_store(overrides, root=tmp_path / "columns"))


@settings(max_examples=300, deadline=None, suppress_health_check=FUNCTION_FIXTURE)
@given(st.lists(_message(), min_size=1, max_size=4), _shared)
def test_message_batch_answers_as_the_message_list(twin_stores, fields, shared):
    listed, columns = twin_stores
    messages = [Message(**f, **shared) for f in fields]
    assert outcome(lambda: columns.put_batch(as_batch(messages))) == outcome(
        lambda: listed.put_batch(messages))
    assert log_files(listed) == log_files(columns)

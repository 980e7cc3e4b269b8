"""The batch fast paths give the answers of the message-by-message code they stand in for.

* a Message list goes through the columns of the MessageBatch it stands for (and a batch with
  per-message keys builds its tails in C-level passes): the same records, the same refusals,
  the same exceptions as ``prepare_batch``;
* records alike are encoded as one array of whole records: the same bytes as the join;
* dispatch walks runs of equal-size records with array passes (``walk_runs``) and takes tags
  codes for a whole batch (``TagsCoder.codes``): the same as ``walk`` and ``TagsCoder.code``;
* the queue selector sees a columnar batch's messages as they are (bodies included);
* a dispatch worker starting while the store creates a segment waits for it to be whole.
"""

from __future__ import annotations

import struct
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from mqstore import GetStatus, Message, MessageBatch, PutStatus
from mqstore.append.encoding import PutContext, Rejected, prepare_batch
from mqstore.append.columns import (
    _Shape, columns_from_batch, columns_from_messages, columns_from_prepared, encode_columns,
)
from mqstore.dispatch.loop import (
    _FEW_RECORDS, SCHEDULE_TOPIC, TagsCoder, heads_alike, walk_runs,
)
from mqstore.format.hosts import Host, parse_host
from mqstore.format.record import encode_blank, encode_record
from mqstore.format.record_columns import heads, walk
from mqstore.hashing import HASH_JAVA, bytes_hasher, java_string_hash, mmh3_string_hash
from mqstore.plugin_api.hookspecs import hookimpl
from mqstore.plugins.index_key import java_hash_ranges
from mqstore.storage.commit_log import CommitLog
from mqstore.runtime.workers.dispatch_worker import _forget_growing_tail

FUZZ = settings(max_examples=300, deadline=None)
STORE_HOSTS = [parse_host("127.0.0.1:10911"), parse_host("[::1]:10911")]


# -- Message lists and keyed batches: columns or one by one, the same answer ---------------------

def outcome(build, ctx: PutContext):
    """What a put would make of the batch: the exception (type and text), the refusal, or the
    encoded records with their sizes, queue ids and whether sync flush waits."""
    try:
        cols = build()
    except Rejected as rej:
        return "refused", rej.status, rej.reason, rej.index
    except (ValueError, TypeError) as exc:
        return "raised", type(exc), str(exc)
    n = cols.n
    qids = np.zeros(n, dtype=np.int64) if cols.queue_ids is None else cols.queue_ids
    phys = np.cumsum(cols.sizes) - cols.sizes
    raw = bytes(encode_columns(cols, 0, n, ctx.store_host, qids, np.arange(n) * 3, phys + 7,
                               1_700_000_000_123))
    ids = None if cols.queue_ids is None else cols.queue_ids.tolist()
    return "ok", raw, cols.sizes.tolist(), ids, cols.wait, len(cols.select_inputs)


def one_by_one(messages, ctx):
    return lambda: columns_from_prepared(prepare_batch(messages, ctx), messages)


# Values a fast path takes come first and most often (hypothesis also shrinks towards them);
# the rest make it step aside, or make the batch raise or be refused.
def mostly(good: list, bad: list, weight: int = 4):
    return st.sampled_from(good * weight + bad)


TOPICS = mostly(["T", "Topic_B"], ["%RETRY%" + "r" * 130, "A" * 128, "a/b"], 8)
TOKENS = mostly(["k1", "key-22", "x"], ["é", "a b", "", "p\x02q", 7], 20)
KEY_LISTS = st.one_of(st.none(), st.lists(TOKENS, max_size=3), st.none(), st.tuples(TOKENS),
                      st.sampled_from(["k1 k2", "", ["ok"], ("k",)]))
TAGS = mostly([None, "TagA", "TagB"], ["é", "", "a\x01b", 3])
PROPS = mostly([None], [{"p": "1"}, {"DELAY": "3"}, {"DELAY": "0"}, {"WAIT": "false"},
                        {"INNER_NUM": "2"}, {"TAGS": "dup"}, ["not", "a", "map"]], 12)
BODIES = st.one_of(mostly([b"x" * 40, b"y" * 40, b"\0" * 40, b""], [None, "text"], 6),
                   st.binary(max_size=60), st.just(bytearray(b"ba")))


def shared_or_each(draw, n, values, shared_weight=3):
    """One value for every message (most often) or one drawn per message."""
    if draw(st.integers(0, shared_weight)):
        value = draw(values)
        return [value] * n
    return [draw(values) for _ in range(n)]


@st.composite
def message_lists(draw):
    n = draw(st.integers(1, 9))
    fields = {
        "topic": shared_or_each(draw, n, TOPICS, 6),
        "body": shared_or_each(draw, n, BODIES, 3),
        "tags": shared_or_each(draw, n, TAGS),
        "keys": shared_or_each(draw, n, KEY_LISTS, 1),
        "properties": shared_or_each(draw, n, PROPS, 6),
        "queue_id": shared_or_each(draw, n, mostly([0, 3, None], [-1, True]), 2),
        "flag": shared_or_each(draw, n, mostly([0, 7, -1], [True, 1 << 40]), 6),
        "sysflag": shared_or_each(draw, n, mostly([0], [False, 0x1, 0x8], 8), 6),
        "born_timestamp": shared_or_each(draw, n, mostly([None, 42], [1.5]), 6),
        "born_host": shared_or_each(draw, n, mostly([None, "10.0.0.1:1", "[::1]:5"],
                                                   ["nohost"]), 6),
        "reconsume_times": shared_or_each(draw, n, mostly([0], [3], 8), 6),
        "prepared_tx_offset": shared_or_each(draw, n, mostly([0], [9], 8), 6),
    }
    return [Message(**{k: v[i] for k, v in fields.items()}) for i in range(n)]


CONTEXTS = st.builds(PutContext, st.sampled_from(STORE_HOSTS), st.sampled_from([50, 4 << 20]),
                     st.booleans(), st.just(False)).map(
    lambda c: PutContext(c.store_host, c.max_message_bytes, c.auto_v2, c.store_host.is_v6))


@FUZZ
@given(messages=message_lists(), ctx=CONTEXTS)
def test_message_lists_through_columns_answer_as_one_by_one(messages, ctx):
    assert outcome(lambda: columns_from_messages(messages, ctx), ctx) == outcome(
        one_by_one(messages, ctx), ctx)


@FUZZ
@given(n=st.integers(1, 8), data=st.data(), ctx=CONTEXTS)
def test_keyed_batches_answer_as_their_message_lists(n, data, ctx):
    batch = MessageBatch(
        topic=data.draw(st.one_of(TOPICS, st.lists(TOPICS, min_size=n, max_size=n))),
        bodies=data.draw(st.lists(BODIES, min_size=n, max_size=n)),
        queue_ids=data.draw(st.sampled_from([None, 1, list(range(n))])),
        tags=data.draw(TAGS), keys=data.draw(st.lists(KEY_LISTS, min_size=n, max_size=n)),
        flag=data.draw(st.sampled_from([0, 5])))
    try:
        shape = _Shape(batch)
    except ValueError:
        return  # the batch's own form is wrong: it has no message list to compare with
    assert outcome(lambda: columns_from_batch(batch, ctx), ctx) == outcome(
        one_by_one(shape.messages(), ctx), ctx)


@pytest.mark.parametrize("messages", [
    # equal mappings, different orders: each message keeps its own order on disk
    [Message("T", b"1", properties={"a": "1", "b": "2"}, queue_id=0),
     Message("T", b"2", properties={"b": "2", "a": "1"}, queue_id=0)],
    # values equal to the first message's but of another type: refused one by one
    [Message("T", b"1", queue_id=0), Message("T", b"2", queue_id=0, sysflag=False)],
    [Message("T", b"1", queue_id=0, flag=1), Message("T", b"2", queue_id=0, flag=True)],
    [Message("T", b"1", queue_id=0, born_timestamp=5),
     Message("T", b"2", queue_id=0, born_timestamp=5.0)],
    [Message("T", b"1", queue_id=0), Message("T", b"2", queue_id=False)],
    [Message("T", b"1", tags="a", queue_id=0), Message("T", b"2", tags="a", queue_id=None)],
])
def test_message_lists_with_lookalike_values(messages):
    ctx = PutContext(STORE_HOSTS[0], 4 << 20, True, False)
    assert outcome(lambda: columns_from_messages(messages, ctx), ctx) == outcome(
        one_by_one(messages, ctx), ctx)


def test_records_alike_are_one_array_with_the_joined_bytes():
    ctx = PutContext(STORE_HOSTS[0], 4 << 20, True, False)
    messages = [Message("T", bytes([i]) * 33 + b"\0", tags="TagA", queue_id=i % 2)
                for i in range(50)]
    fast = columns_from_messages(messages, ctx)
    assert fast.shared_tail is not None  # the array path, not the join
    assert outcome(lambda: fast, ctx) == outcome(one_by_one(messages, ctx), ctx)


def test_message_list_put_batch_writes_what_single_puts_write(make_store, tmp_path):
    messages = [Message("T", b"body-%d" % i, tags="TagA", keys=[f"k{i}", "shared"],
                        queue_id=i % 3) for i in range(20)]
    a = make_store(root=tmp_path / "a")
    b = make_store(root=tmp_path / "b")
    assert a.put_batch(messages).status is PutStatus.PUT_OK
    for m in messages:
        assert b.put(m).status is PutStatus.PUT_OK
    log = [bytes(s.internals.commit_log.segments.segments[0].mm[:s.max_phys_offset]) for s in (a, b)]
    assert log[0] == log[1]
    for store in (a, b):
        store.wait_dispatched()
        assert [store.query_by_key("T", f"k{i}")[0].body for i in (0, 19)] == [
            b"body-0", b"body-19"]


# -- dispatch: walk_runs == walk ------------------------------------------------------------------

def _record(body_len: int, v2: bool = False) -> bytes:
    host = Host(bytes([127, 0, 0, 1]), 1)
    return encode_record(queue_id=0, flag=0, queue_offset=0, phys_offset=0, sysflag=0,
                         born_timestamp=0, born_host=host, store_timestamp=0, store_host=host,
                         reconsume_times=0, prepared_tx_offset=0, body=bytes(body_len),
                         topic=b"T", properties=b"", v2=v2)


@FUZZ
@given(runs=st.lists(st.tuples(st.sampled_from([0, 1, 2, 9, 40]), st.integers(1, 300)),
                     min_size=1, max_size=6),
       end=st.sampled_from(["none", "zeros", "blank", "garbage", "cut"]), data=st.data())
def test_walk_runs_finds_what_walk_finds(runs, end, data):
    buf = bytearray(b"".join(_record(body, v2=body == 9) * count for body, count in runs))
    size = len(buf)
    if end == "zeros":
        buf += bytes(300)
    elif end == "blank":
        buf += encode_blank(200) + bytes(192)
    elif end == "garbage":
        buf += bytes(data.draw(st.binary(min_size=8, max_size=200)))
    elif end == "cut":
        del buf[data.draw(st.integers(max(0, size - 200), size)):]
    if buf and data.draw(st.booleans()):  # a damaged byte somewhere
        buf[data.draw(st.integers(0, len(buf) - 1))] = data.draw(st.integers(0, 255))
    raw = bytes(buf)
    u8 = np.frombuffer(raw, dtype=np.uint8)
    begin = data.draw(st.sampled_from([0, 94, 95, data.draw(st.integers(0, len(raw)))]))
    limit = data.draw(st.sampled_from([len(raw), len(raw) + 50,
                                       data.draw(st.integers(0, len(raw)))]))
    soft = data.draw(st.sampled_from([len(raw), 1 << 40, data.draw(st.integers(0, len(raw)))]))
    positions, stop = walk(raw, begin, limit, soft)
    got, got_stop = walk_runs(raw, u8, begin, limit, soft)
    assert (got.tolist(), got_stop) == (positions, stop)
    assert got.dtype == np.int64


HOST_PAIRS = st.sampled_from([(Host(bytes([127, 0, 0, 1]), 1), Host(bytes([10, 0, 0, 2]), 9)),
                              (Host(bytes(15) + b"\x01", 5), Host(bytes([10, 0, 0, 2]), 9)),
                              (Host(bytes([127, 0, 0, 1]), 1), Host(bytes(range(16)), 3))])


@FUZZ
@given(count=st.integers(1, 70), body=st.integers(0, 30), v2=st.booleans(), hosts=HOST_PAIRS,
       props=st.sampled_from([b"", b"TAGS\x01a\x02", b"KEYS\x01k\x02"]),
       shorter_last=st.booleans(), data=st.data())
def test_heads_alike_is_heads_for_records_alike(count, body, v2, hosts, props, shorter_last,
                                                data):
    def record(i: int, body_len: int) -> bytes:
        return encode_record(
            queue_id=i % 5, flag=i, queue_offset=i * 7, phys_offset=1000 + i, sysflag=0,
            born_timestamp=i, born_host=hosts[0], store_timestamp=10_000 + i,
            store_host=hosts[1], reconsume_times=0, prepared_tx_offset=0,
            body=bytes([i % 256]) * body_len, topic=b"Tp", properties=props, v2=v2)

    records = [record(i, body) for i in range(count)]
    # A last record shorter than the rest ends the buffer: its row would run past the end.
    shorter_last = shorter_last and count > 1 and body > 0
    if shorter_last:
        records[-1] = record(count - 1, body - 1)
    buf = bytearray(b"".join(records))
    for _ in range(data.draw(st.integers(0, 2))):  # damage anywhere: a field, a length, a body
        buf[data.draw(st.integers(0, len(buf) - 1))] ^= data.draw(st.integers(1, 255))
    u8 = np.frombuffer(bytes(buf), dtype=np.uint8)
    positions = np.arange(count, dtype=np.int64) * len(records[0])
    alike = heads_alike(bytes(buf), u8, positions)
    cols, n = heads(u8, positions)
    if alike is None:
        assert shorter_last or bytes(buf) != b"".join(records)
        return
    got, got_n = alike
    assert got_n == n == count
    assert sorted(got) == sorted(cols)
    for name, column in cols.items():
        assert got[name].tolist() == column.tolist(), name


# -- dispatch: TagsCoder.codes == TagsCoder.code --------------------------------------------------

SEGMENTS = st.sampled_from([b"TAGS\x01TagA", b"TAGS\x01TagB", b"TAGS\x01", b"TAGS\x01\xc3\xa9",
                            b"TAGS\x01a\x01b", b"XTAGS\x01no", b"DELAY\x013", b"DELAY\x0199",
                            b"DELAY\x01x", b"KEYS\x01k1 k2", b"UNIQ_KEY\x01u", b"", b"TA",
                            b"GS\x01split"])


@FUZZ
@given(props=st.lists(st.lists(SEGMENTS, max_size=4).map(
           lambda segs: b"\x02".join(segs) + (b"\x02" if segs and len(segs) % 2 else b"")),
           min_size=1, max_size=160),
       schedule=st.lists(st.booleans(), min_size=160, max_size=160),
       java=st.booleans(), same=st.booleans())
def test_tags_codes_of_a_batch_are_each_records_code(props, schedule, java, same):
    # up to 160 records: batches of a few records take their tags one by one, larger ones
    # with array passes (loop._FEW_RECORDS); both give each record's own code
    assert _FEW_RECORDS < 160
    if same:
        props = [props[0]] * len(props)
    topics = [SCHEDULE_TOPIC if s else "T" for s in schedule[:len(props)]]
    times = np.arange(len(props), dtype=np.int64) * 1000 + 1_700_000_000_000
    levels = [1000, 5000, 10000]
    coder = TagsCoder(java_string_hash if java else mmh3_string_hash, levels)
    expected = [TagsCoder(coder._hash, levels).code(t, p, int(ts))
                for t, p, ts in zip(topics, props, times)]
    assert coder.codes(topics, props, times).tolist() == expected
    assert coder.codes(topics, props, times).tolist() == expected  # with the cache filled


# -- key index: Java's String.hashCode over many keys at once --------------------------------------

@FUZZ
@given(keys=st.lists(st.one_of(st.text(alphabet="abcXYZ09#-_ ", max_size=40), st.text(max_size=6)),
                     min_size=1, max_size=20),
       topic=st.sampled_from(["T", "TopicB", "%RETRY%g"]))
def test_java_hash_ranges_is_string_hashcode_of_ascii_keys(keys, topic):
    raw = [k.encode("utf-8", errors="surrogatepass") for k in keys]
    data = np.frombuffer(b"".join(raw) or b"\0", dtype=np.uint8)
    lengths = np.array([len(r) for r in raw], dtype=np.int64)
    starts = np.cumsum(lengths) - lengths
    hashes, ascii_ = java_hash_ranges(data, starts, lengths,
                                      java_string_hash(topic + "#") & 0xFFFFFFFF)
    hash_bytes = bytes_hasher(HASH_JAVA)
    for r, h, a in zip(raw, hashes.tolist(), ascii_.tolist()):
        assert a == r.isascii()
        if a:
            assert h == hash_bytes(topic.encode() + b"#" + r) == java_string_hash(
                topic + "#" + r.decode())


# -- the selector sees a columnar batch's messages -------------------------------------------------

class RecordingSelector:
    seen: list = []

    def __init__(self, config=None, string_hash=None) -> None:
        pass

    def select(self, message, queue_count: int) -> int:
        RecordingSelector.seen.append(message)
        return len(message.body) % queue_count


class RecordingPlugin:
    @hookimpl
    def register_queue_selectors(self, registry):
        registry.add("recording", RecordingSelector)


@pytest.mark.loops("thread")  # the plugin module lives in this process only
def test_selector_sees_columnar_messages_with_their_bodies(make_store, monkeypatch):
    monkeypatch.setitem(sys.modules, "recording_selector_plugin", RecordingPlugin())
    monkeypatch.setattr(RecordingSelector, "seen", [])
    store = make_store({"plugins": {"modules": ["recording_selector_plugin"]},
                        "queue_select": {"selector": "recording", "queues_per_topic": 4}})
    r = store.put_batch(MessageBatch(topic="T", bodies=[b"a", b"bbb", b"cc"], tags="x",
                                     keys=[["k1"], None, "k2 k3"], properties={"p": "1"}))
    assert r.status is PutStatus.PUT_OK
    assert r.queue_ids.tolist() == [1, 3, 2]
    seen = RecordingSelector.seen
    assert [(m.topic, m.body, m.tags, m.keys, m.properties) for m in seen] == [
        ("T", b"a", "x", ["k1"], {"p": "1"}), ("T", b"bbb", "x", None, {"p": "1"}),
        ("T", b"cc", "x", "k2 k3", {"p": "1"})]


# -- consume queues of many topics and queues in one dispatch batch ------------------------------

def test_interleaved_topics_and_queues_get_their_units_in_order(make_store):
    store = make_store()
    topics = ["T", "U", "T", "V", "U", "T"] * 30
    qids = [i % 3 for i in range(len(topics))]
    bodies = [struct.pack(">I", i) for i in range(len(topics))]
    r = store.put_batch(MessageBatch(topic=topics, bodies=bodies, queue_ids=qids, tags="t"))
    assert r.status is PutStatus.PUT_OK
    store.wait_dispatched()
    for topic in ("T", "U", "V"):
        for q in range(3):
            want = [b for t, qq, b in zip(topics, qids, bodies) if (t, qq) == (topic, q)]
            got, offset = [], 0
            while (r := store.get("g", topic, q, offset, 32)).status is GetStatus.FOUND:
                got += [m.body for m in r.messages]
                offset = r.next_begin_offset
            assert got == want


# -- the dispatch worker starting while the store creates a segment ------------------------------

def test_worker_maps_a_segment_being_created_only_once_it_is_whole(tmp_path):
    segment_bytes = 1 << 20
    directory = tmp_path / "commitlog"
    directory.mkdir()
    (directory / "00000000000000000000").write_bytes(bytes(segment_bytes))
    growing = directory / f"{segment_bytes:020d}"
    growing.write_bytes(bytes(segment_bytes // 2))  # blocks still being reserved
    log = CommitLog(str(directory), None, read_only=True, known_bytes=segment_bytes)
    log.load()
    try:
        assert [s.size for s in log.segments.segments] == [segment_bytes, segment_bytes // 2]
        _forget_growing_tail(log.segments)
        assert [s.start for s in log.segments.segments] == [0]
        assert log.segments.refresh() == 0  # still short: not mapped yet
        with open(growing, "r+b") as f:
            f.truncate(segment_bytes)
        assert log.segments.refresh() == 1
        assert [(s.start, s.size) for s in log.segments.segments] == [
            (0, segment_bytes), (segment_bytes, segment_bytes)]
    finally:
        log.close()

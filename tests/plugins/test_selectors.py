"""Producer-side queue selection (spec section 12, acceptance behaviours 70-71).

A message put with ``queue_id=None`` gets its queue from the configured selector; the
queue it lands in is checked both in the put result and in the stored record.
"""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from mqstore import Message, PutStatus
from mqstore.errors import MQStoreError, PluginError
from mqstore.hashing import java_string_hash
from mqstore.plugins.queue_select_hash import KeyHashSelector, java_int_hash

BORN = "127.0.0.1:50000"


def auto(topic="T", body=b"x", **kw):
    kw.setdefault("born_timestamp", 1_700_000_000_000)
    kw.setdefault("born_host", BORN)
    return Message(topic, body, queue_id=None, **kw)


def record_queue_id(store, phys_offset) -> int:
    raw = (Path(store.root) / "commitlog" / "00000000000000000000").read_bytes()
    return struct.unpack_from(">i", raw, phys_offset + 12)[0]


def hash_store(make_store, hash_kind="java", queues=4, root=None):
    return make_store({"queue_select": {"selector": "key_hash", "queues_per_topic": queues}},
                      hash_kind=hash_kind, root=root)


# -- behaviour 70: hash selector --------------------------------------------------------------

@pytest.mark.parametrize("arg, queue", [
    (-7, 3),  # Java -7 % 4 == -3, abs -> 3
    ("order-1", 2),  # String.hashCode -1207111310, % 4 == -2, abs -> 2
    (5, 1),
    (0, 0),
    (-2147483648, 0),
    ("polygenelubricants", 0),  # hashCode Integer.MIN_VALUE
    ("Aa", 0),
    ("BB", 0),  # same Java hash as "Aa"
    ("order-2", 1),
    (2**33 + 3, 1),  # Long.hashCode: (int)(v ^ v>>>32) = 3 ^ 2 = 1
    (0x180000007, 2),  # Long.hashCode = 0x80000006 (negative), % 4 == -2
    (-(2**40) - 3, 2),  # Long.hashCode = 258
])
def test_70_hash_selector_follows_java_on_a_java_hash_store(make_store, arg, queue):
    store = hash_store(make_store)
    assert store.hash_kind == "java"
    r = store.put(auto(shard_key=arg))
    assert r.status is PutStatus.PUT_OK
    assert r.queue_id == queue
    assert r.queue_offset == 0
    assert record_queue_id(store, r.phys_offset) == queue
    store.wait_dispatched()
    assert store.max_offset("T", queue) == 1
    assert [q for q in range(4) if store.max_offset("T", q)] == [queue]


def test_70_hash_selector_class_matches_rocketmq_vectors():
    sel = KeyHashSelector(None, java_string_hash)
    assert sel.select(auto(shard_key=-7), 4) == 3
    assert sel.select(auto(shard_key="order-1"), 4) == 2
    assert sel.select(auto(shard_key=5), 4) == 1
    assert java_string_hash("order-1") == -1207111310
    assert java_int_hash(-7) == -7
    assert java_int_hash(2**33 + 3) == 1
    assert java_int_hash(-(2**40) - 3) == 258
    assert java_int_hash(0x180000007) == -2147483642


def test_70_hash_selector_uses_first_key_when_no_shard_key(make_store):
    store = hash_store(make_store)
    r = store.put(auto(keys=["order-1", "other"]))
    assert (r.status, r.queue_id) == (PutStatus.PUT_OK, 2)
    r = store.put(auto(keys="order-2 order-1"))
    assert (r.status, r.queue_id) == (PutStatus.PUT_OK, 1)
    # shard_key wins over keys
    r = store.put(auto(keys=["order-1"], shard_key=-7))
    assert r.queue_id == 3


def test_hash_selector_without_key_raises_and_writes_nothing(make_store):
    store = hash_store(make_store)
    with pytest.raises(ValueError, match="key_hash"):
        store.put(auto())
    assert store.max_phys_offset == 0
    r = store.put(auto(shard_key=5))
    assert (r.phys_offset, r.queue_id, r.queue_offset) == (0, 1, 0)


def test_key_hash_store_keeps_equal_shard_keys_in_one_queue(make_store):
    store = hash_store(make_store)
    keys = ["order-1", "order-2", "user-42", "a", "b", "c", "d", "e"]
    expected = {"order-1": 2, "order-2": 1, "user-42": 0, "a": 1, "b": 2, "c": 3, "d": 0, "e": 1}
    seen: dict[str, set[int]] = {k: set() for k in keys}
    per_queue: dict[int, list[int]] = {}
    for round_ in range(5):
        for k in keys:
            r = store.put(auto(body=f"{k}/{round_}".encode(), shard_key=k))
            assert r.status is PutStatus.PUT_OK
            seen[k].add(r.queue_id)
            per_queue.setdefault(r.queue_id, []).append(r.queue_offset)
    assert {k: sorted(v) for k, v in seen.items()} == {k: [q] for k, q in expected.items()}
    for q, offsets in per_queue.items():
        assert offsets == list(range(len(offsets)))
    store.wait_dispatched()
    got = store.get("g", "T", 2, 0, 32)
    assert [m.body for m in got.messages] == [
        f"{k}/{r}".encode() for r in range(5) for k in ("order-1", "b")]


def test_key_hash_batch_groups_by_shard_key(make_store):
    store = hash_store(make_store)
    batch = store.put_batch([auto(shard_key=k) for k in ("order-1", "order-2", "order-1", 5, -7)])
    assert batch.status is PutStatus.PUT_OK
    assert batch.queue_ids.tolist() == [2, 1, 2, 1, 3]
    assert batch.queue_offsets.tolist() == [0, 0, 1, 1, 0]


def test_key_hash_on_mmh3_store_uses_the_store_hash(make_store):
    store = hash_store(make_store, hash_kind="mmh3")
    assert store.hash_kind == "mmh3"
    # mmh3 x86_32 seed 0: order-1 -> -177056223, Aa -> -1433810495, BB -> 1707312886
    got = {k: store.put(auto(shard_key=k)).queue_id for k in ("order-1", "Aa", "BB")}
    assert got == {"order-1": 3, "Aa": 3, "BB": 2}
    # integers still hash as Java's Integer/Long
    assert store.put(auto(shard_key=-7)).queue_id == 3
    assert [store.put(auto(shard_key="Aa")).queue_id for _ in range(3)] == [3, 3, 3]


# -- behaviour 71: round robin ----------------------------------------------------------------

def test_71_round_robin_cycles_on_one_thread(make_store):
    store = make_store({"queue_select": {"selector": "round_robin", "queues_per_topic": 4}})
    results = [store.put(auto(body=b"%d" % i)) for i in range(9)]
    qids = [r.queue_id for r in results]
    start = qids[0]
    assert 0 <= start < 4
    assert qids == [(start + i) % 4 for i in range(9)]
    assert [r.queue_offset for r in results] == [0, 0, 0, 0, 1, 1, 1, 1, 2]
    for r in results:
        assert record_queue_id(store, r.phys_offset) == r.queue_id
    batch = store.put_batch([auto() for _ in range(4)])
    assert batch.queue_ids.tolist() == [(start + 9 + i) % 4 for i in range(4)]
    store.wait_dispatched()
    assert sorted(store.max_offset("T", q) for q in range(4)) == [3, 3, 3, 4]
    assert store.max_offset("T", start) == 4


def test_71_round_robin_is_the_default_selector(make_store):
    store = make_store({"queue_select": {"queues_per_topic": 3}})
    qids = [store.put(auto()).queue_id for _ in range(6)]
    assert qids == [(qids[0] + i) % 3 for i in range(6)]
    assert sorted(set(qids)) == [0, 1, 2]


def test_explicit_queue_id_bypasses_the_selector(make_store, tmp_path):
    store = make_store({"queue_select": {"selector": "round_robin", "queues_per_topic": 4}})
    r = store.put(Message("T", b"x", queue_id=7, born_host=BORN))
    assert (r.queue_id, r.queue_offset) == (7, 0)
    hashed = hash_store(make_store, queues=4, root=tmp_path / "hashed")
    r = hashed.put(Message("T", b"x", queue_id=6, shard_key="order-1", born_host=BORN))
    assert (r.queue_id, r.queue_offset) == (6, 0)


# -- random -----------------------------------------------------------------------------------

def test_random_selector_stays_in_range(make_store):
    store = make_store({"queue_select": {"selector": "random", "queues_per_topic": 3}})
    results = [store.put(auto()) for _ in range(300)]
    qids = [r.queue_id for r in results]
    assert set(qids) == {0, 1, 2}
    counts = {q: qids.count(q) for q in range(3)}
    for q in range(3):
        offsets = [r.queue_offset for r in results if r.queue_id == q]
        assert offsets == list(range(counts[q]))
    batch = store.put_batch([auto() for _ in range(50)])
    assert set(batch.queue_ids.tolist()) <= {0, 1, 2}
    store.wait_dispatched()
    assert sum(store.max_offset("T", q) for q in range(3)) == 350
    assert store.max_offset("T", 3) == 0


def test_random_selector_with_one_queue_always_picks_zero(make_store):
    store = make_store({"queue_select": {"selector": "random", "queues_per_topic": 1}})
    assert [store.put(auto()).queue_id for _ in range(20)] == [0] * 20


# -- configuration ----------------------------------------------------------------------------

def test_unknown_selector_fails_at_open_naming_it(make_store, store_dir):
    with pytest.raises(MQStoreError) as info:
        make_store({"queue_select": {"selector": "no_such_selector"}})
    assert isinstance(info.value, PluginError)
    assert "no_such_selector" in str(info.value)
    assert "round_robin" in str(info.value)
    # the failed open left the directory usable
    store = make_store({"queue_select": {"selector": "key_hash"}}, root=store_dir)
    assert store.put(auto(shard_key=5)).queue_id == 1

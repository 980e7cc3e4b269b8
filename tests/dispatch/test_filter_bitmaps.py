"""SQL92 filter bitmaps computed at dispatch and kept in the consume-queue extension (issue 5)."""

from __future__ import annotations

import os

import pytest

from mqstore import GetStatus, Message, MessageBatch
from mqstore.format.cq_ext import (
    BLOOM_BYTES, BLOOM_K, BLOOM_M, bloom_positions, encode_unit, from_address, to_address,
)
from mqstore.errors import PluginError
from mqstore.format.cq_unit import EXT_ADDRESS_MAX
from mqstore.plugins.sql92 import FilterSyntaxError

EXPR = "a > 5"


def put_range(store, lo, hi, topic="T", tags=None):
    r = store.put_batch(MessageBatch(topic=topic, bodies=[b"%d" % i for i in range(lo, hi)],
                                     queue_ids=0, tags=tags,
                                     properties=[{"a": str(i)} for i in range(lo, hi)]))
    assert r.status.name == "PUT_OK"


def pull_all(store, group, expression, expression_type="SQL92", topic="T"):
    bodies, filtered, offset = [], 0, 0
    while True:
        res = store.get(group, topic, 0, offset, 32, expression=expression,
                        expression_type=expression_type)
        if res.status not in (GetStatus.FOUND, GetStatus.NO_MATCHED_MESSAGE):
            return bodies, filtered
        bodies += [int(m.body) for m in res.messages]
        filtered += res.filtered_count
        offset = res.next_begin_offset


def test_bloom_layout_matches_rocketmq():
    assert (BLOOM_K, BLOOM_M, BLOOM_BYTES) == (3, 112, 14)
    assert bloom_positions("G#T") == [24, 26, 83]
    unit = encode_unit(2598919, 1700000000123, bytes(range(14)))
    assert unit[:2] == (34).to_bytes(2, "big") and len(unit) == 34
    assert to_address(0) == -(1 << 63) <= EXT_ADDRESS_MAX
    assert from_address([to_address(0), to_address(68)]).tolist() == [0, 68]


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_registered_subscription_skips_non_matching_messages(make_store, store_dir, mode,
                                                             manual_clock):
    store = make_store({"dispatch": {"worker": mode}})
    store.register_subscription("G", "T", EXPR)
    manual_clock.advance(1)  # stored after the registration, not in its millisecond
    put_range(store, 0, 100)
    store.wait_dispatched()
    assert (store_dir / "consumequeue_ext" / "T" / "0").is_dir()
    assert store.max_offset("T", 0) == 100  # a look through the store refreshes a follower's view
    cq = store.consume_queue("T", 0)
    assert (cq.units_of(cq.segments.segments[0])[:100]["tags_code"] <= EXT_ADDRESS_MAX).all()
    got, filtered = pull_all(store, "G", EXPR)
    assert got == list(range(6, 100))
    assert filtered == 0  # rejected by the bitmap, never read from the commit log
    # Another group with the same expression but no registration reads and filters.
    got, filtered = pull_all(store, "H", EXPR)
    assert got == list(range(6, 100)) and filtered == 6


def test_messages_stored_before_registration_are_filtered_exactly(make_store, manual_clock):
    store = make_store()
    put_range(store, 0, 20)
    store.wait_dispatched()
    manual_clock.advance(10)
    store.register_subscription("G", "T", EXPR)
    manual_clock.advance(10)
    put_range(store, 20, 40)
    store.wait_dispatched()
    got, filtered = pull_all(store, "G", EXPR)
    assert got == list(range(6, 40))
    assert filtered == 6  # the early ones are checked on their properties


def test_a_changed_expression_is_not_trusted_to_old_bits(make_store, manual_clock):
    store = make_store()
    store.register_subscription("G", "T", "a > 50")
    manual_clock.advance(1)
    put_range(store, 0, 60)
    store.wait_dispatched()
    got, _ = pull_all(store, "G", "a < 3")  # not the registered expression: no bitmap use
    assert got == [0, 1, 2]
    manual_clock.advance(5)
    store.register_subscription("G", "T", "a < 3")
    put_range(store, 60, 62)
    store.wait_dispatched()
    got, _ = pull_all(store, "G", "a < 3")
    assert got == [0, 1, 2]


def test_tag_filters_see_the_real_tag_codes(make_store):
    store = make_store()
    store.register_subscription("G", "T", EXPR)
    put_range(store, 0, 5, tags="A")
    put_range(store, 5, 9, tags="B")
    store.wait_dispatched()
    assert pull_all(store, "X", "B", expression_type="TAG")[0] == [5, 6, 7, 8]
    assert pull_all(store, "X", "A || B", expression_type="TAG")[0] == list(range(9))


def test_extension_files_roll_and_survive_reopen(make_store, store_dir, manual_clock):
    cfg = {"consume_queue": {"ext_file_bytes": 4096}}
    store = make_store(cfg)
    store.register_subscription("G", "T", EXPR)
    manual_clock.advance(1)
    put_range(store, 0, 400)
    store.close()
    files = os.listdir(store_dir / "consumequeue_ext" / "T" / "0")
    assert len(files) > 2
    again = make_store(cfg)
    got, filtered = pull_all(again, "G", EXPR)
    assert got == list(range(6, 400)) and filtered == 0
    put_range(again, 400, 410)
    again.wait_dispatched()
    assert pull_all(again, "G", EXPR)[0] == list(range(6, 410))


def test_bad_or_unknown_subscriptions(make_store, store_dir):
    store = make_store()
    with pytest.raises(FilterSyntaxError):
        store.register_subscription("G", "T", "a >")
    assert not (store_dir / "subscriptions.json").exists()
    with pytest.raises(ValueError, match="topic"):
        store.register_subscription("G", "bad/topic", EXPR)
    store.register_subscription("G", "T", EXPR)
    assert store.unregister_subscription("G", "T") is True
    assert store.unregister_subscription("G", "T") is False


def test_a_read_only_store_resolves_extension_units(make_store, store_dir, manual_clock):
    from mqstore import MessageStore
    store = make_store()
    store.register_subscription("G", "T", EXPR)
    manual_clock.advance(1)
    put_range(store, 0, 20, tags="A")
    store.wait_dispatched()
    reader = MessageStore.open(store_dir, read_only=True)
    try:
        assert pull_all(reader, "G", EXPR) == (list(range(6, 20)), 0)
        assert pull_all(reader, "X", "A", expression_type="TAG")[0] == list(range(20))
    finally:
        reader.close()


def test_disabling_the_sql92_plugin_takes_sql92_out_of_dispatch_too(make_store, store_dir):
    store = make_store()
    store.register_subscription("G", "T", EXPR)
    store.close()
    ext_dir = store_dir / "consumequeue_ext"
    assert not ext_dir.exists()

    store = make_store({"plugins": {"disable": ["mqstore.plugins.filter_sql92"]}})
    with pytest.raises(PluginError, match="unknown filter 'SQL92'"):
        store.register_subscription("G", "T", "b > 1")
    put_range(store, 0, 10)
    store.wait_dispatched()
    # The saved subscription names a filter type no plugin provides: no bitmaps are made.
    assert not ext_dir.exists()
    with pytest.raises(PluginError, match="unknown filter 'SQL92'"):
        store.get("G", "T", 0, 0, 32, expression=EXPR, expression_type="SQL92")


def test_only_filters_that_precompute_can_be_registered(make_store):
    store = make_store()
    with pytest.raises(ValueError, match="expression_type 'TAG'.*does not precompute"):
        store.register_subscription("G", "T", "TagA", expression_type="TAG")
    assert store.subscriptions.lookup("G", "T") is None

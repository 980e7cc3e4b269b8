"""The schedule's files and rules: RocketMQ's ``delayOffset.json`` as its broker wrote it (the
4.9.8 broker fixture's bytes), mqstore's timer progress, and RocketMQ 5's timer rounding."""

from __future__ import annotations

import json

import pytest

from mqstore.format import delay_offsets, timer_progress
from mqstore.format.schedule import deliver_ms, delay_level, timer_out_ms


def test_a_brokers_delay_offsets_read_as_rocketmq_loaded_them_and_written_back_byte_for_byte(
        broker_fixture):
    manifest = json.loads((broker_fixture / "MANIFEST.json").read_text())
    raw = manifest["brokerConfigFiles"]["delayOffset.json"]["raw"]
    doc = delay_offsets.decode(raw)
    loaded = manifest["expected"]["delayOffsetTableAsLoaded"]["offsetTable"]
    assert doc.table == {int(k): v for k, v in loaded.items()} == {1: 10, 3: 13}
    assert doc.counted_below is None and doc.extra == {}
    assert delay_offsets.encode(doc) == raw


def test_mqstores_bound_and_a_brokers_other_keys_are_kept():
    text = ('{"dataVersion":{"counter":3,"timestamp":17},"offsetTable":{2:5},'
            '"mqstoreCountedBelow":99}')
    doc = delay_offsets.decode(text)
    assert (doc.table, doc.counted_below) == ({2: 5}, 99)
    assert delay_offsets.encode(doc) == (
        '{\n\t"dataVersion":{"counter":3,"timestamp":17},\n\t"mqstoreCountedBelow":99,\n'
        '\t"offsetTable":{2:5\n\t}\n}')
    assert delay_offsets.encode(delay_offsets.DelayOffsets()) == '{\n\t"offsetTable":{}\n}'


@pytest.mark.parametrize("text, needle", [
    ("{}", "'offsetTable' object"),
    ('{"offsetTable":{0:1}}', "level 0 must be an integer 1..65536"),
    ('{"offsetTable":{1:-1}}', "level 1 offset -1"),
    ('{"offsetTable":{1:"7"}}', "level 1 offset '7'"),
    ('{"offsetTable":{},"mqstoreCountedBelow":true}', "mqstoreCountedBelow True"),
    ('{"offsetTable":', "fastjson text"),
])
def test_bad_delay_offsets_are_refused_naming_what_is_wrong(text, needle):
    with pytest.raises(ValueError, match=None) as err:
        delay_offsets.decode(text)
    assert needle in str(err.value)


def test_timer_progress_round_trip_and_refusals():
    progress = timer_progress.TimerProgress(1_700_000_000_000, 12, 4096)
    assert timer_progress.decode(timer_progress.encode(progress)) == progress
    assert timer_progress.decode('{"readTimeMs": 5, "queueOffset": 0}').counted_below is None
    with pytest.raises(ValueError, match="queueOffset -1 must be an integer >= 0"):
        timer_progress.decode('{"readTimeMs": 5, "queueOffset": -1}')


def test_levels_and_delivery_times_as_rocketmq_reads_them():
    assert [delay_level({"DELAY": v}, 18) for v in ("3", " 99 ", "0", "-2", "x", "\u00b2")] == [
        3, 18, 0, 0, 0, 0]
    assert delay_level({}, 18) == 0
    assert deliver_ms({"TIMER_DELAY_SEC": "2", "TIMER_DELIVER_MS": "9"}, 1_000) == 3_000
    assert deliver_ms({"TIMER_DELAY_MS": "250"}, 1_000) == 1_250
    assert deliver_ms({"TIMER_DELIVER_MS": "1700000000123"}, 0) == 1_700_000_000_123
    with pytest.raises(ValueError, match="TIMER_DELIVER_MS '12abc' must be an integer"):
        deliver_ms({"TIMER_DELIVER_MS": "12abc"}, 0)
    # RocketMQ 5's rounding: down to the step, one step earlier when on a step.
    assert (timer_out_ms(5_500, 1_000), timer_out_ms(5_000, 1_000)) == (5_000, 4_000)

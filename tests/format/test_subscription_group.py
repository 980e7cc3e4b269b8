"""RocketMQ's consumer group configs (config/subscriptionGroup.json): the broker fixture's file
read and written back byte for byte, changes that keep every other line and unknown keys,
and bad values refused naming the field."""

from __future__ import annotations

import json
import tarfile

import pytest

from mqstore.format.subscription_group import (
    GroupConfig, decode_table, default_config, encode_table,
)


@pytest.fixture(scope="module")
def broker_groups(broker_fixture) -> str:
    with tarfile.open(broker_fixture / "store.tar.gz") as tar:
        member = tar.getmember("store/config/subscriptionGroup.json")
        return tar.extractfile(member).read().decode("utf-8")


def test_the_broker_file_is_written_back_byte_for_byte(broker_groups):
    table = decode_table(broker_groups)
    assert encode_table(table) == broker_groups
    fix = table.groups["FixGroup"]
    assert (fix.retry_max_times, fix.retry_queue_nums, fix.max_attempts) == (16, 1, 17)
    assert fix.consume_message_orderly is None and not fix.orderly
    assert list(table.groups)[:2] == ["SELF_TEST_C_GROUP", "FixGroup"]  # the broker's order
    assert table.data_version.counter == 1


def test_a_change_moves_only_its_own_lines(broker_groups):
    table = decode_table(broker_groups)
    changed = table.with_group(table.groups["FixGroup"].changed(retry_max_times=3), 1234)
    before, after = broker_groups.splitlines(), encode_table(changed).splitlines()
    differ = [(a, b) for a, b in zip(before, after) if a != b]
    assert len(before) == len(after)
    assert differ == [('\t\t"counter":1,', '\t\t"counter":2,'),
                      ('\t\t"timestamp":1795869353458', '\t\t"timestamp":1234'),
                      ('\t\t\t"retryMaxTimes":16,', '\t\t\t"retryMaxTimes":3,')]


def test_keys_of_a_later_rocketmq_are_kept():
    doc = {"dataVersion": {"counter": 4, "stateVersion": 0, "timestamp": 9},
           "subscriptionGroupTable": {"G": {
               "groupName": "G", "retryMaxTimes": 5, "groupSysFlag": 0,
               "attributes": {"a": "b"}, "consumeTimeoutMinute": 15,
               "consumeMessageOrderly": True}}}
    table = decode_table(json.dumps(doc))
    assert table.groups["G"].orderly and table.groups["G"].max_attempts == 6
    again = json.loads(encode_table(table.with_group(
        table.groups["G"].changed(retry_queue_nums=2), 10)))
    assert again["subscriptionGroupTable"]["G"] == {
        **doc["subscriptionGroupTable"]["G"], "retryQueueNums": 2, "consumeEnable": True,
        "consumeFromMinEnable": True, "consumeBroadcastEnable": True, "brokerId": 0,
        "whichBrokerWhenConsumeSlowly": 1, "notifyConsumerIdsChangedEnable": True}
    assert again["dataVersion"] == {"counter": 5, "stateVersion": 0, "timestamp": 10}


@pytest.mark.parametrize("fields, needle", [
    ({"retry_max_times": -1}, "retryMaxTimes"),
    ({"retry_max_times": 1001}, "retryMaxTimes"),
    ({"retry_queue_nums": 0}, "retryQueueNums"),
    ({"consume_enable": "yes"}, "consumeEnable"),
    ({"broker_id": 3}, "cannot be set"),
])
def test_bad_values_are_refused_naming_the_field(fields, needle):
    with pytest.raises(ValueError, match=needle):
        default_config("G").changed(**fields)


@pytest.mark.parametrize("text, needle", [
    ("[]", "not an object"),
    ("{", "not valid JSON"),
    ('{"subscriptionGroupTable":{"A":{"groupName":"B"}}}', "groupName must equal its key"),
    ('{"subscriptionGroupTable":{"A":{"groupName":"A","retryMaxTimes":"16"}}}',
     "retryMaxTimes"),
])
def test_a_damaged_document_is_refused(text, needle):
    with pytest.raises(ValueError, match=needle):
        decode_table(text)


def test_defaults_are_rocketmqs():
    config = default_config("G")
    assert isinstance(config, GroupConfig)
    assert (config.retry_max_times, config.retry_queue_nums, config.consume_enable,
            config.max_attempts) == (16, 1, True, 17)

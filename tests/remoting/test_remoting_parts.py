"""The remoting server's bookkeeping on a clock the test moves: clients forgotten after 120 s
without a heartbeat, queue locks lapsing after 60 s, the Java parsers' reading of header
fields."""

from __future__ import annotations

import pytest

from mqstore.remoting.clients import CLIENT_EXPIRY_S, Clients
from mqstore.remoting.codes import RemotingError
from mqstore.remoting.fields import Fields
from mqstore.remoting.locks import LOCK_EXPIRY_S, QueueLocks


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def beat(client_id: str, group: str = "g", topic: str = "T", version=1) -> dict:
    return {"clientID": client_id, "consumerDataSet": [{
        "groupName": group, "subscriptionDataSet": [
            {"topic": topic, "subString": "*", "subVersion": version}]}]}


def test_clients_silent_for_the_expiry_are_forgotten_and_their_group_changes():
    clock = Clock()
    clients = Clients(clock)
    a, b = object(), object()
    assert clients.heartbeat(a, beat("a"), "JAVA", 409) == ["g"]
    assert clients.heartbeat(b, beat("b"), "CPP", 63) == ["g"]
    assert clients.heartbeat(a, beat("a"), "JAVA", 409) == []  # the same member again
    clock.now += CLIENT_EXPIRY_S - 1
    assert clients.heartbeat(a, beat("a"), "JAVA", 409) == []
    assert clients.expire() == []
    clock.now += 2
    assert clients.expire() == ["g"]
    assert clients.member_ids("g") == ["a"]
    assert clients.connection_closed(a) == ["g"]
    assert clients.group("g") is None


def test_a_newer_subscription_replaces_an_older_one_only():
    clients = Clients(Clock())
    clients.heartbeat(object(), beat("a", version="7"), "CPP", 63)
    clients.heartbeat(object(), beat("b", version=5), "JAVA", 409)
    assert clients.group("g").subscriptions["T"].sub_version == 7


@pytest.mark.parametrize("body, complaint", [
    ({}, "no clientID"),
    ({"clientID": "c", "consumerDataSet": "x"}, "must be lists"),
    ({"clientID": "c", "consumerDataSet": [{"subscriptionDataSet": []}]}, "names no group"),
    ({"clientID": "c", "consumerDataSet": [{"groupName": "g", "subscriptionDataSet": [{}]}]},
     "names no topic"),
])
def test_malformed_heartbeats_are_refused(body, complaint):
    with pytest.raises(RemotingError, match=complaint):
        Clients(Clock()).heartbeat(object(), body, "JAVA", 409)


def test_queue_locks_lapse_after_sixty_seconds():
    clock = Clock()
    locks = QueueLocks(clock)
    mq = ("b", 0, "T")
    assert locks.lock("g", "a", [mq]) == [mq]
    clock.now += LOCK_EXPIRY_S - 1
    assert locks.lock("g", "b", [mq]) == []
    assert locks.holder("g", mq) == "a"
    clock.now += 2
    assert locks.holder("g", mq) is None
    assert locks.lock("g", "b", [mq]) == [mq]
    assert locks.lock("other", "a", [mq]) == [mq]  # another group's lock is its own


@pytest.mark.parametrize("text, value", [("12", 12), ("-3", -3), ("+4", 4),
                                         ("2147483647", 2147483647)])
def test_int_fields_parse_as_java_does(text, value):
    assert Fields({"n": text}).int32("n") == value


@pytest.mark.parametrize("text", ["1.5", " 1", "1_0", "", "2147483648", "٣"])
def test_int_fields_java_refuses_are_refused(text):
    with pytest.raises(RemotingError, match="is not a Java int"):
        Fields({"n": text}).int32("n")


def test_booleans_and_missing_fields():
    f = Fields({"t": "TRUE", "f": "1"})
    assert f.boolean("t") is True and f.boolean("f") is False and f.boolean("none") is False
    with pytest.raises(RemotingError, match="<topic> is null"):
        f.text("topic")
    assert f.text("topic", required=False) is None and f.int64("x", 5) == 5


def test_broker_rates_cover_10_60_and_600_seconds_as_storestatsservice_does():
    from mqstore.remoting.stats import FOUND, GOT, MISSED, PUTS, Stats
    clock = Clock()
    stats = Stats(clock, wall=lambda: 1_750_000_000.0)
    assert stats.rates(PUTS) == "  "  # no samples yet: every span empty
    assert stats.total_get_rates() == "0.0 0.0 0.0"
    puts = 0
    stats.sample(puts)
    for second in range(60):  # 50 s at 10 puts a second, then 10 s at 40
        clock.now += 1
        puts += 10 if second < 50 else 40
        if second % 2:
            stats.got("g", "T", 3, 300)
        else:
            stats.miss()
        stats.sample(puts)
    assert stats.rates(PUTS) == "40.0 15.0 "  # 600 s: 61 samples are not 601
    assert stats.rate(PUTS, 60) == 15.0 and stats.rate(PUTS, 600) is None
    assert stats.rates(FOUND) == "0.5 0.5 " and stats.rates(MISSED) == "0.5 0.5 "
    assert stats.rates(GOT) == "1.5 1.5 "
    assert stats.total_get_rates() == "1.0 1.0 0.0"
    for _ in range(600):
        clock.now += 2  # a slower sampler: rates are per second of the time between samples
        puts += 20
        stats.sample(puts)
    assert stats.rates(PUTS) == "10.0 10.0 10.0"


def test_todays_and_yesterdays_morning_totals_roll_at_local_midnight():
    import datetime

    from mqstore.remoting.stats import Stats
    clock = Clock()
    day = datetime.datetime(2026, 3, 10, 23, 59, 58).timestamp()
    wall = [day]
    stats = Stats(clock, wall=lambda: wall[0])
    stats.got("g", "T", 4, 40)
    stats.sample(7)
    assert (stats.put_today_morning, stats.put_yesterday_morning) == (0, 0)  # no midnight yet
    wall[0] += 3  # 00:00:01 on the 11th
    stats.sample(9)
    assert (stats.put_today_morning, stats.put_yesterday_morning) == (9, 0)
    assert (stats.got_today_morning, stats.got_yesterday_morning) == (4, 0)
    stats.got("g", "T", 6, 60)
    wall[0] += 3600
    stats.sample(20)  # the same day: nothing moves
    assert stats.put_today_morning == 9
    wall[0] += 86_400
    stats.sample(50)
    assert (stats.put_today_morning, stats.put_yesterday_morning) == (50, 9)
    assert (stats.got_today_morning, stats.got_yesterday_morning) == (10, 4)


@pytest.mark.parametrize("value,text", [(0.0, "0.0"), (2.5, "2.5"), (15.0, "15.0"),
                                        (0.0016666666666666668, "0.0016666666666666668"),
                                        (1e-4, "1.0E-4"), (12345678.0, "1.2345678E7"),
                                        (0.00025, "2.5E-4")])
def test_rates_print_as_java_prints_a_double(value, text):
    from mqstore.remoting.stats import java_double
    assert java_double(value) == text


def test_disk_ratio_is_used_over_used_plus_available_rounded_up(monkeypatch, tmp_path):
    import os
    from types import SimpleNamespace

    from mqstore.remoting import admin
    # 1000 blocks of 4 KiB: 300 free, of which 250 for non-root users: 700 used of 950.
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(
        f_blocks=1000, f_bfree=300, f_bavail=250, f_frsize=4096))
    assert admin.disk_used_ratio(str(tmp_path)) == 0.74  # 73.68...% up to 74%
    monkeypatch.setattr(os, "statvfs", lambda path: SimpleNamespace(
        f_blocks=1000, f_bfree=500, f_bavail=500, f_frsize=4096))
    assert admin.disk_used_ratio(str(tmp_path)) == 0.5


@pytest.mark.parametrize("changes", [
    {}, {"queueId": "-1"}, {"reconsumeTimes": None}, {"maxReconsumeTimes": "16"},
    {"maxReconsumeTimes": "-1"}, {"bornTimestamp": "+1700000000000"}, {"flag": "2147483647"},
    {"batch": "TRUE"}, {"batch": "1"}, {"properties": None}, {"sysFlag": "0010"},
])
@pytest.mark.parametrize("code", [10, 310])
def test_send_headers_read_as_the_java_parsers_read_them(changes, code):
    from mqstore.format.remoting_frame import Command
    from mqstore.remoting.fields import V2_KEYS
    from mqstore.remoting.send import SendRequest
    ext = {"producerGroup": "pg", "topic": "T", "defaultTopic": "TBW102",
           "defaultTopicQueueNums": "4", "queueId": "3", "sysFlag": "0",
           "bornTimestamp": "1700000000000", "flag": "0", "properties": "KEYS\x01k\x02",
           "reconsumeTimes": "0", "unitMode": "false", "batch": "false"}
    ext.update(changes)
    ext = {k: v for k, v in ext.items() if v is not None}
    if code == 310:
        ext = {V2_KEYS.get(k, k): v for k, v in ext.items()}
    req = SendRequest(Command(code, ext=ext))
    # What Fields reads field by field, as each Java parser does.
    f = Fields(ext, None if code == 10 else V2_KEYS)
    assert (req.group, req.topic, req.default_queues, req.queue_id, req.sysflag, req.born,
            req.flag, req.properties, req.reconsume, req.max_reconsume, req.batch) == (
        f.text("producerGroup"), f.text("topic"), f.int32("defaultTopicQueueNums"),
        f.int32("queueId"), f.int32("sysFlag"), f.int64("bornTimestamp"), f.int32("flag"),
        f.text("properties", required=False) or "", f.int32("reconsumeTimes", 0,
                                                            required=False),
        f.int32("maxReconsumeTimes", required=False), f.boolean("batch"))


@pytest.mark.parametrize("changes, message", [
    ({"queueId": "2147483648"}, "queueId = '2147483648' is not a Java int"),
    ({"bornTimestamp": None}, "<bornTimestamp> is null"),
    ({"flag": "1x"}, "flag = '1x' is not a Java int"),
    ({"defaultTopic": None}, "<defaultTopic> is null"),
])
def test_a_send_header_out_of_the_usual_is_refused_naming_its_field(changes, message):
    from mqstore.format.remoting_frame import Command
    from mqstore.remoting.send import SendRequest
    ext = {"a": "pg", "b": "T", "c": "TBW102", "d": "4", "e": "3", "f": "0",
           "g": "1700000000000", "h": "0", "j": "0"}
    short = {"queueId": "e", "bornTimestamp": "g", "flag": "h", "defaultTopic": "c"}
    for name, value in changes.items():
        ext[short[name]] = value
    ext = {k: v for k, v in ext.items() if v is not None}
    with pytest.raises(RemotingError, match=message):
        SendRequest(Command(310, ext=ext))

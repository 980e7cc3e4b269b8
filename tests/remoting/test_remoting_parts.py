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
